"""``pulsar.asyncio.Client.close()`` that leaves no Python callback in the client's threads.

``pulsar.asyncio.Client.close()`` hands the C++ client a Python callback. The C++
client closes on a thread of its own (``ClientImpl::handleClose`` starts it),
calls the callback there (the coroutine awaiting ``close()`` wakes up), then
destroys it, which takes the GIL once more. A program that leaves ``asyncio.run``
right after ``await client.close()`` (the README's quick start, most scripts)
reaches interpreter finalization meanwhile; that thread, asking a finalizing
interpreter for the GIL, is ended inside a C++ destructor: SIGABRT ("terminate
called without an active exception") or SIGSEGV. Core dumps show it: that
thread in ``handleClose``'s lambda, releasing the callback; the main thread in
``Py_FinalizeEx``. It is the client's own race, not the consumer's: the plain
consumer's quick start without its nack (``python tools/exit_codes.py
plain-ack-only``) crashes as often on Apache Pulsar beside two busy processes
(about one exit in two). A plain program that nacks hides it by chance:
``pulsar.asyncio``'s ``negative_acknowledge`` starts the loop's default executor,
whose shutdown at the end of ``asyncio.run`` gives that thread time to finish.

That ``close()`` also closes first the consumers registered with :func:`close_with_client` (every
:class:`~nacktracker.TrackedConsumer` made with its client), as the client closes its own consumers:
a program that closes only its client stops their timers and pumps and saves their snapshots, rather
than leaving them running over a closed client (each pump logged its receive failing).

So once nacktracker's Pulsar side is used (a :class:`~nacktracker.TrackedConsumer`
or a :class:`~nacktracker.adapters.PulsarAdapter` is made), ``close()`` of
``pulsar.asyncio`` clients closes through the client's *blocking* close, run on
a Python thread (the interpreter waits for such threads before it finalizes):
the C++ client then completes a C++ promise and holds no Python object. The
call, its result and its error (``pulsar.asyncio.PulsarException`` with the
client's result code) stay as they were; only no callback outlives the call.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import weakref
from typing import Any, Optional, Protocol

import _pulsar
import pulsar.asyncio as pulsar_asyncio

from .pulsar_layout import raw_client

__all__ = ["close_leaves_no_callback", "close_with_client"]

log = logging.getLogger("nacktracker.adapters")

_ORIGINAL_CLOSE = pulsar_asyncio.Client.close


class Closable(Protocol):
    async def close(self) -> None: ...


#: per client, what its close() closes first (held weakly: a consumer dropped unclosed is not kept)
_closed_with: weakref.WeakKeyDictionary[Any, weakref.WeakSet[Closable]] = weakref.WeakKeyDictionary()


def close_with_client(client: pulsar_asyncio.Client, closable: Closable) -> None:
    """Have ``client.close()`` await ``closable.close()`` before it closes the client (an idempotent close:
    one the program made already does nothing). O(1)."""
    close_leaves_no_callback()
    _closed_with.setdefault(client, weakref.WeakSet()).add(closable)


async def _close(self: pulsar_asyncio.Client) -> None:
    """Close the client and all the associated producers and consumers (as ``pulsar.asyncio``'s
    ``close``, through the client's blocking close on a thread: see :mod:`nacktracker.adapters.client_close`).

    Raises ``pulsar.asyncio.PulsarException``."""
    for closable in list(_closed_with.pop(self, ())):
        try:
            await closable.close()
        except Exception as exc:  # noqa: BLE001  # (another loop's consumer, a failed final save): its close goes on
            log.warning("closing %r with its client failed: %s", closable, exc)
    raw = raw_client(self)
    if not isinstance(raw, _pulsar.Client):  # not laid out as pulsar-client 3.x: its own close
        await _ORIGINAL_CLOSE(self)
        return
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    threading.Thread(target=_close_blocking, args=(raw, loop, done), name="nacktracker-client-close").start()
    await done  # cancelling this wait leaves the close to finish on its thread


def _close_blocking(raw: Any, loop: asyncio.AbstractEventLoop, done: asyncio.Future[None]) -> None:
    error: Optional[BaseException] = None
    try:
        raw.close()
    except _pulsar.PulsarException as exc:  # the error close_async would report, as pulsar.asyncio raises it
        error = pulsar_asyncio.PulsarException(getattr(_pulsar.Result, type(exc).__name__, _pulsar.Result.UnknownError))
        error.__cause__ = exc
    except Exception as exc:  # noqa: BLE001  # not expected from the client: handed to the caller all the same
        error = exc
    try:
        loop.call_soon_threadsafe(_settle, done, error)
    except RuntimeError:  # the loop is closed: nobody awaits the close any more
        pass


def _settle(done: asyncio.Future[None], error: Optional[BaseException]) -> None:
    if done.done():  # the awaiting task was cancelled
        return
    if error is None:
        done.set_result(None)
    else:
        done.set_exception(error)


def close_leaves_no_callback() -> None:
    """Make ``pulsar.asyncio.Client.close()`` leave no Python callback in the
    client's threads (see the module doc). Idempotent; a subclass that
    overrides ``close`` keeps its own. O(1)."""
    if pulsar_asyncio.Client.close is _ORIGINAL_CLOSE:
        _close.__wrapped__ = _ORIGINAL_CLOSE  # type: ignore[attr-defined]  # (inspect, help())
        pulsar_asyncio.Client.close = _close
