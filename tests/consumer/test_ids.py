"""Bare message ids (``msg.message_id()`` names no topic in Python): the topic the consumer
received them from, from the id's own fields and what the consumer knows. Pure; no broker."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from nacktracker import MessageKey
from nacktracker.consumer.ids import MAX_LEDGERS, BareIds, names_no_message, names_several_topics

T = "persistent://public/default/t"


def test_a_single_topic_consumer_names_its_topic_or_the_partition_the_id_names():
    ids = BareIds(T)
    assert ids.topics(MessageKey(1, 2)) == (T,)
    assert ids.topics(MessageKey(1, 2, partition=1)) == (f"{T}-partition-1",)  # as the client names partitions
    direct = BareIds(f"{T}-partition-3")  # subscribed to one partition by its own name
    assert direct.topics(MessageKey(1, 2, partition=3)) == (f"{T}-partition-3",)
    assert not ids.learns


def test_a_multi_topic_consumer_names_the_topic_whose_ledger_the_id_is_in():
    ids = BareIds(None)
    assert ids.learns and ids.topics(MessageKey(5, 0)) == ()  # nothing of ledger 5 arrived: never handed out
    ids.saw(MessageKey(5, 0, -1, -1, "a"))
    ids.saw(MessageKey(6, 3, 1, -1, "b-partition-1"))
    assert ids.topics(MessageKey(5, 9)) == ("a",)
    assert ids.topics(MessageKey(6, 0, 1)) == ("b-partition-1",)
    ids.saw(MessageKey(5, 1, -1, -1, "c"))  # a broker that reuses ledger ids: each candidate
    assert ids.topics(MessageKey(5, 9)) == ("a", "c")


@given(st.lists(st.tuples(st.integers(0, MAX_LEDGERS * 2), st.sampled_from("abc")), max_size=50))
def test_what_a_multi_topic_consumer_remembers_is_bounded_and_answers_what_it_saw(arrivals):
    ids = BareIds(None)
    for ledger, topic in arrivals:
        ids.saw(MessageKey(ledger, 0, -1, -1, topic))
    for ledger, topic in arrivals:
        assert topic in ids.topics(MessageKey(ledger, 1))


def test_the_oldest_ledger_is_forgotten_past_the_bound():
    ids = BareIds(None)
    for ledger in range(MAX_LEDGERS + 1):
        ids.saw(MessageKey(ledger, 0, -1, -1, "a"))
    assert ids.topics(MessageKey(0, 0)) == () and ids.topics(MessageKey(MAX_LEDGERS, 0)) == ("a",)


def test_a_pattern_names_several_topics_and_a_topic_name_does_not():
    assert names_several_topics("persistent://public/default/orders-.*")
    assert names_several_topics("persistent://public/default/(a|b)")
    assert not names_several_topics("persistent://public/default/orders-v1.2=x:y%20-partition-0")


def test_an_id_with_a_negative_ledger_or_entry_names_a_position_and_any_message_or_key_does_not():
    import pulsar

    assert names_no_message(pulsar.MessageId.earliest)
    assert names_no_message(pulsar.MessageId(-1, -1, 3, -1)) and names_no_message(pulsar.MessageId(0, 3, -1, -1))
    assert not names_no_message(pulsar.MessageId.latest)  # a real id as far as its fields go: the broker decides
    assert not names_no_message(pulsar.MessageId(-1, 0, 0, -1))
    assert not any(names_no_message(x) for x in (MessageKey(0, 0), object(), None, "(-1,-1,-1,-1)"))
