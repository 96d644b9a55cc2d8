"""The consumer's side of local redelivery (Exclusive and Failover subscriptions).

There the broker cannot redeliver a chosen message (see
:mod:`nacktracker.adapters.local`): the consumer keeps each nacked message and
the :class:`~nacktracker.adapters.local.LocalRedeliveryAdapter` hands it back
at its bucket through the consumer's delivery path, as a copy from the broker.
This module is the glue between the shell's calls (nack, ack, cumulative ack,
a copy held back) and that adapter, so the shell stays one line per call.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Optional

from ..adapters.base import RedeliversLocally
from ..adapters.local import HandBack
from ..keys import MessageKey
from .state import Verdict

__all__ = ["LocalNacks"]

#: What a copy handed back became, for the adapter (anything else: dropped).
_HAND_BACK = {Verdict.SURFACE: HandBack.TAKEN, Verdict.PARK: HandBack.TAKEN, Verdict.DROP_EARLY: HandBack.NOT_YET}


class LocalNacks:
    """``decide(msg) -> Verdict``: the shell's delivery path for a copy (the
    core's verdict, parking included); ``surface(msg)``: hand it to the
    application (the receive pump's queue); ``key(msg)``: its MessageKey. Every method is O(1) unless its
    docstring says otherwise."""

    def __init__(self, adapter: RedeliversLocally, decide: Callable[[Any], Verdict],
                 surface: Callable[[Any], None], key: Callable[[Any], MessageKey]) -> None:
        self.adapter = adapter
        self._key = key
        self._decide = decide
        self._surface = surface
        adapter.bind(self._hand_back)

    def redelivery_count(self, key: MessageKey, count: Optional[int]) -> Optional[int]:
        """The count a nack of ``key`` counts with: the broker's (the Message's
        ``redelivery_count()``) plus the local redeliveries since its last ack;
        ``None`` for a bare id (no count, as on any subscription type)."""
        return None if count is None else count + self.adapter.redeliveries(key)

    def nacked(self, key: MessageKey, message: Any, bare_id: bool = False) -> None:
        """Keep the nacked message (also when it is being dead-lettered: a
        failed publish leaves it pending, and its bucket hands it back). A bare
        id has no message to keep: its bucket asks the broker instead (see
        :meth:`~nacktracker.adapters.LocalRedeliveryAdapter.expect`)."""
        if bare_id:
            self.adapter.expect(key)
        else:
            self.adapter.keep(key, message)

    def held_back(self, key: MessageKey, message: Any) -> None:
        """The broker resent ``key`` (a reconnect, a restart on a snapshot)
        while its nack is pending: keep that copy if none is kept."""
        self.adapter.keep(key, message)

    def acked(self, key: MessageKey) -> None:
        self.adapter.forget(key)

    def acked_cumulative(self, key: MessageKey, records: Any, discard: Callable[[MessageKey], Any]) -> None:
        """A cumulative ack up to ``key`` acknowledged the kept messages it
        covers: drop them, and cancel the pending nack of each entry left with
        none kept and no batch record (``records``: the core's). O(kept)."""
        emptied: Iterable[MessageKey] = self.adapter.forget_through(key)
        for entry in emptied:
            if entry not in records:
                discard(entry)

    def _hand_back(self, msg: Any) -> HandBack:
        verdict = self._decide(msg)
        answer = _HAND_BACK.get(verdict, HandBack.DROPPED)
        if answer is HandBack.TAKEN:
            # its redelivery_count() counts this hand-back, as the broker's count would have (a message the
            # consumer did not wrap, from a client laid out otherwise, keeps the broker's count)
            counted = getattr(msg, "redelivered_locally", None)
            if counted is not None:
                counted(self.adapter.redeliveries(self._key(msg)) + 1)
        if verdict is Verdict.SURFACE:
            self._surface(msg)
        return answer
