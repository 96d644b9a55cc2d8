"""LocalRedeliveryAdapter: redelivers nacked messages from the consumer's memory.

For Exclusive and Failover subscriptions. There the broker cannot redeliver a
chosen message: its only redelivery is "every unacknowledged message"
(``redeliver_unacknowledged_messages``), which a real broker honours by
resending the whole unacknowledged backlog and the embedded pulsar-lite
ignores (measured). So the consumer keeps each nacked message it received
(:meth:`keep`) and, when the tracker fires the message's bucket, this adapter
hands it back through the consumer's own delivery path (``deliver``), exactly
as a copy arriving from the broker: the consumer's rules about copies (parked
until due, dropped if acknowledged or still held, surfaced once) hold
unchanged. No broker call: the message stays unacknowledged at the broker
until the application acknowledges it, as with any nack.

Costs: one received message kept per pending nack (freed by its ack, a
cumulative ack covering it, or :meth:`aclose`), plus one int per message
redelivered here and not yet acknowledged (its local redelivery count).

A nack by bare message id (``msg.message_id()``) leaves no message to keep
(:meth:`expect`): when its bucket fires with no copy kept, the adapter asks the
broker to resend everything unacknowledged (``redeliver_all``, the client's
``redeliver_unacknowledged_messages``), which is what the plain client does for
any nack on these subscription types. The consumer's delivery path sorts the
resent copies as any others: the expected one surfaces, copies of messages the
application holds or acknowledged are dropped, and copies of other pending
nacks are kept until their own buckets (so one request serves them all).

No pulsar import: messages are opaque tokens, keyed by their
:class:`~nacktracker.MessageKey`; tested without a broker.
"""

from __future__ import annotations

import enum
from typing import Any, Callable, Optional, Sequence

from ..keys import MessageKey

__all__ = ["LocalRedeliveryAdapter", "HandBack"]

Token = Any  # a received message, opaque here


class HandBack(enum.Enum):
    """What the consumer did with a message handed back (``deliver``'s answer)."""

    TAKEN = "taken"        # it surfaced or waits (parked) to surface: one local redelivery
    NOT_YET = "not yet"    # its own nack's bucket has not fired: keep it, that bucket asks again
    DROPPED = "dropped"    # acknowledged or held again meanwhile: forget it


class LocalRedeliveryAdapter:
    """The tracker's adapter for subscriptions whose broker cannot redeliver
    chosen messages: hands kept messages back to ``deliver``.

    ``deliver(token) -> HandBack``: the consumer's delivery path (set at
    construction or with :meth:`bind`). ``lead_ms`` and ``coalesce_ms`` are 0:
    the hand-back is a function call, it takes no time worth firing early for.

    >>> import asyncio
    >>> adapter = LocalRedeliveryAdapter(lambda msg: HandBack.TAKEN)
    >>> adapter.keep(MessageKey(1, 2, topic="t"), "the message")
    >>> asyncio.run(adapter.redeliver([MessageKey(1, 2, topic="t")]))
    >>> adapter.redeliveries(MessageKey(1, 2, topic="t")), adapter.stored
    (1, 0)
    """

    lead_ms = 0
    coalesce_ms = 0

    def __init__(self, deliver: Optional[Callable[[Token], HandBack]] = None, *, multi_topic: bool = False,
                 redeliver_all: Optional[Callable[[], None]] = None) -> None:
        if deliver is not None and not callable(deliver):
            raise TypeError(f"deliver must be callable, not {type(deliver).__name__}")
        if redeliver_all is not None and not callable(redeliver_all):
            raise TypeError(f"redeliver_all must be callable, not {type(redeliver_all).__name__}")
        self._deliver = deliver
        self._redeliver_all = redeliver_all
        self._expected: dict[MessageKey, set[int]] = {}  # entry -> batch indices nacked by bare id, nothing kept
        self.asked_broker = 0  # redeliver_all calls made for bare-id nacks
        #: whether the consumer is a multi-topic one (read by the consumer: bare ids have no topic there)
        self.multi_topic = multi_topic
        self._kept: dict[MessageKey, dict[int, Token]] = {}  # entry -> batch index (-1: not batched) -> message
        self._counts: dict[MessageKey, int] = {}  # message -> local redeliveries, until acknowledged
        self._stored = 0  # messages in _kept (stats read it on every scrape)
        self.handed_back = 0
        self.missing = 0  # fired entries with nothing kept (e.g. restored nacks whose copy has not arrived)

    def bind(self, deliver: Callable[[Token], HandBack]) -> None:
        """Set the consumer's delivery path. Runtime: O(1)."""
        if not callable(deliver):
            raise TypeError(f"deliver must be callable, not {type(deliver).__name__}")
        self._deliver = deliver

    # -- what the consumer tells it ---------------------------------------------------

    def keep(self, key: MessageKey, token: Token) -> None:
        """Keep the received ``token`` of ``key`` (nacked, or a copy held back
        until its nack is due) until its entry fires. A message kept already
        keeps its first token. Runtime: O(1)."""
        if type(key) is not MessageKey:
            raise TypeError(f"key must be a MessageKey, not {type(key).__name__}")
        kept = self._kept.setdefault(key.entry, {})
        if key.batch_index not in kept:
            kept[key.batch_index] = token
            self._stored += 1

    def expect(self, key: MessageKey) -> None:
        """``key`` was nacked by bare id: nothing to keep. When its entry fires with no copy of it
        kept (:meth:`keep` may get one meanwhile, from the broker), ``redeliver_all`` asks the broker
        for it. Runtime: O(1)."""
        if type(key) is not MessageKey:
            raise TypeError(f"key must be a MessageKey, not {type(key).__name__}")
        self._expected.setdefault(key.entry, set()).add(key.batch_index)

    def forget(self, key: MessageKey) -> bool:
        """``key`` was acknowledged: drop its message and count. Returns
        whether a message was kept. Runtime: O(1)."""
        self._counts.pop(key, None)
        expected = self._expected.get(key.entry)
        if expected is not None:
            expected.discard(key.batch_index)
            if not expected:
                del self._expected[key.entry]
        kept = self._kept.get(key.entry)
        if kept is None or kept.pop(key.batch_index, None) is None:
            return False
        self._stored -= 1
        if not kept:
            del self._kept[key.entry]
        return True

    def forget_through(self, key: MessageKey) -> list[MessageKey]:
        """A cumulative ack up to ``key``: drop everything at or before it in
        its topic partition (acknowledged by it, as in Pulsar). Returns the
        entries that had messages kept or expected (nacked by bare id) and
        have none left (their pending nacks can be cancelled). Runtime:
        O(kept entries + counted messages + expected entries)."""
        where, mark = (key.topic, key.partition), (key.ledger_id, key.entry_id, key.batch_index)

        def covered(k: MessageKey, index: int) -> bool:
            return (k.topic, k.partition) == where and (k.ledger_id, k.entry_id, index) <= mark

        touched = []  # entries with something kept or expected covered by the ack
        for entry in [e for e in self._kept if covered(e, -1)]:
            kept = self._kept[entry]
            for index in [i for i in kept if covered(entry, i)]:
                del kept[index]
                self._stored -= 1
            if not kept:
                del self._kept[entry]
            touched.append(entry)
        for k in [k for k in self._counts if covered(k, k.batch_index)]:
            del self._counts[k]
        for entry in [e for e in self._expected if covered(e, -1)]:
            self._expected[entry] = {i for i in self._expected[entry] if not covered(entry, i)}
            if not self._expected[entry]:
                del self._expected[entry]
            touched.append(entry)
        emptied = dict.fromkeys(e for e in touched if e not in self._kept and e not in self._expected)
        return list(emptied)

    def redeliveries(self, key: MessageKey) -> int:
        """How often ``key`` was handed back here since its last acknowledgement
        (the broker's ``redelivery_count()`` does not see these). Runtime: O(1)."""
        return self._counts.get(key, 0)

    def is_kept(self, key: MessageKey) -> bool:
        """Whether a message of ``key`` is kept. Runtime: O(1)."""
        kept = self._kept.get(key.entry)
        return kept is not None and key.batch_index in kept

    @property
    def stored(self) -> int:
        """Messages kept now. Runtime: O(1)."""
        return self._stored

    # -- the adapter protocol ---------------------------------------------------------

    async def redeliver(self, keys: Sequence[MessageKey]) -> None:
        """Hand every kept message of each fired entry back to the consumer, in
        batch-index order; one the consumer answers ``NOT_YET`` stays kept.
        Only the nacked (kept) messages of a batch entry come back: its acked
        or held siblings were never kept. An entry nacked by bare id with no
        copy kept asks the broker (``redeliver_all``, once per call). Runtime:
        O(k + m) for k entries and m messages handed back."""
        deliver = self._deliver
        if deliver is None:
            raise RuntimeError("LocalRedeliveryAdapter has no deliver callback: bind() it to the consumer")
        ask_broker = False
        for entry in keys:
            if type(entry) is not MessageKey:
                raise TypeError(f"keys must be MessageKey, not {type(entry).__name__}")
            kept = self._kept.pop(entry.entry, None)
            expected = self._expected.pop(entry.entry, None)
            if expected and (kept is None or not expected.issubset(kept)):
                ask_broker = True
            if kept is None:
                if not expected:
                    self.missing += 1
                continue
            self._stored -= len(kept)
            for index in sorted(kept):
                token = kept[index]
                key = entry.with_batch_index(index)
                answer = deliver(token)
                if answer is HandBack.NOT_YET:
                    self._kept.setdefault(entry.entry, {})[index] = token
                    self._stored += 1
                elif answer is HandBack.TAKEN:
                    self._counts[key] = self._counts.get(key, 0) + 1
                    self.handed_back += 1
        if ask_broker and self._redeliver_all is not None:
            self.asked_broker += 1
            self._redeliver_all()

    async def aclose(self) -> None:
        """Drop everything kept: the consumer is closing, and the broker still
        holds these messages unacknowledged (it resends them to the next
        consumer, or to this one on reconnect). Idempotent."""
        self._kept.clear()
        self._counts.clear()
        self._expected.clear()
        self._stored = 0

    def __repr__(self) -> str:
        return f"LocalRedeliveryAdapter(stored={self.stored}, handed_back={self.handed_back})"
