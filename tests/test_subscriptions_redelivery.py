"""Redelivery back-off, ack timeouts and dead letters (PROTOCOL.md "Subscriptions", "Redelivery and dead
letters"). In-process scenarios on the memory backend with a fake clock."""

from __future__ import annotations

import uuid
from typing import Any

import pyarrow as pa
import pytest
from fakeclock import FakeClock

import txn_core
from txn_core import AckStatus, ConfigurationError, DeadLetterPolicy, RedeliveryBackoff
from txn_core.storage import MemoryStorage

SCHEMA = pa.schema([("id", pa.int64()), ("body", pa.string())])
ACK_TIMEOUT = 10_000


@pytest.fixture
def env() -> tuple[txn_core.Log, FakeClock]:
    clock = FakeClock()
    log = txn_core.Log(MemoryStorage(uuid.uuid4().hex), clock=clock)
    log.create_topic("in", 1, SCHEMA)
    p = log.producer()
    p.send("in", pa.table({"id": [0, 1, 2, 3], "body": ["a", "poison", "c", "d"]}), partition=0)
    p.close()
    return log, clock


def _sub(log: txn_core.Log, **kw: Any) -> txn_core.SubscriptionConsumer:
    kw.setdefault("ack_timeout_ms", ACK_TIMEOUT)
    return log.subscribe("in", 0, "s", **kw)


def _offsets(t: pa.Table) -> list[int]:
    offsets: list[int] = t.column("_offset").to_pylist()
    return offsets


def _committed(log: txn_core.Log, topic: str) -> pa.Table:
    c = log.consumer()
    c.assign([(topic, 0)])
    return c.poll()


def test_the_backoff_multiplies_the_delay_up_to_its_cap() -> None:
    backoff = RedeliveryBackoff(1_000, 5_000)
    assert [backoff.delay_ms(n) for n in range(1, 6)] == [1_000, 2_000, 4_000, 5_000, 5_000]
    assert RedeliveryBackoff(1_000, 60_000, multiplier=3).delay_ms(3) == 9_000
    assert RedeliveryBackoff(0, 10).delay_ms(50) == 0 and RedeliveryBackoff(7, 10, multiplier=1).delay_ms(9) == 7
    assert RedeliveryBackoff(1, 10**12).delay_ms(10_000) == 10**12  # no float overflow far out


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: RedeliveryBackoff(-1, 5), "min_delay_ms must be an int >= 0, got -1"),
        (lambda: RedeliveryBackoff(10, 5), r"max_delay_ms must be an int >= min_delay_ms \(10\), got 5"),
        (lambda: RedeliveryBackoff(1, 5, multiplier=0.5), "multiplier must be a number >= 1, got 0.5"),
        (lambda: DeadLetterPolicy(-1), "max_redeliveries must be an int >= 0, got -1"),
        (lambda: DeadLetterPolicy(1, "a/b"), "invalid dead-letter topic name 'a/b'"),
        (lambda: DeadLetterPolicy(1, transaction_timeout_ms=0), "transaction_timeout_ms must be a positive int"),
    ],
)
def test_a_bad_policy_names_the_field_and_the_rule(make: Any, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        make()


def test_a_policy_of_the_wrong_type_is_refused(env: Any) -> None:
    log, _clock = env
    with pytest.raises(ConfigurationError, match=r"nack_backoff must be a RedeliveryBackoff\(min_delay_ms"):
        _sub(log, nack_backoff=1000)
    with pytest.raises(ConfigurationError, match=r"dead_letter_policy must be a DeadLetterPolicy\(max_redel"):
        _sub(log, dead_letter_policy=3)


def test_each_negative_acknowledgement_of_a_record_waits_longer(env: Any) -> None:
    log, clock = env
    c = _sub(log, nack_backoff=RedeliveryBackoff(1_000, 3_000))
    assert _offsets(c.receive(10)) == [0, 1, 2, 3]
    c.acknowledge([1, 2, 3])
    for delay in (1_000, 2_000, 3_000, 3_000):
        c.negative_acknowledge([0])
        clock.now += delay - 1
        assert not c.receive(10).num_rows
        clock.now += 1
        assert _offsets(c.receive(10)) == [0]
    c.acknowledge([0])


def test_a_record_redelivered_too_often_goes_to_the_dead_letter_topic_acknowledged(env: Any) -> None:
    """max_redeliveries=2: delivered three times (nack, ack timeout, nack), the fourth time it is written to
    in-s-DLQ and acknowledged in one transaction instead; the other records are the application's."""
    log, clock = env
    c = _sub(log, nack_delay_ms=0, dead_letter_policy=DeadLetterPolicy(max_redeliveries=2))
    assert _offsets(c.receive(10)) == [0, 1, 2, 3]
    c.acknowledge([0, 2, 3])
    c.negative_acknowledge([1])
    assert _offsets(c.receive(10)) == [1]  # redelivery 1
    clock.now += ACK_TIMEOUT  # not acknowledged in time: redelivery 2
    assert _offsets(c.receive(10)) == [1]
    c.negative_acknowledge([1])
    assert not c.receive(10).num_rows  # redelivery 3 would exceed the policy: dead-lettered
    assert c.state().status(1) is AckStatus.ACKED and c.state().mark_delete == 4
    dead = _committed(log, "in-s-DLQ")
    assert dead.column("id").to_pylist() == [1] and dead.column("body").to_pylist() == ["poison"]
    d = log.subscription("in", 0, "s").describe()
    assert (d.dead_letter_topic, d.dead_lettered) == ("in-s-DLQ", 1)


def test_dead_letters_go_to_a_named_topic_of_the_same_schema_only(env: Any) -> None:
    log, _clock = env
    log.create_topic("poison", 1, SCHEMA)
    log.create_topic("other", 1, pa.schema([("id", pa.int64())]))
    c = _sub(log, nack_delay_ms=0, dead_letter_policy=DeadLetterPolicy(0, dead_letter_topic="poison"))
    c.receive(10)
    c.negative_acknowledge([1])
    c.acknowledge([0, 2, 3])
    assert not c.receive(10).num_rows
    assert _committed(log, "poison").column("id").to_pylist() == [1]
    assert log.subscription("in", 0, "s").describe(dead_letter_topic="poison").dead_lettered == 1
    c.close()
    bad = log.subscribe("in", 0, "t", nack_delay_ms=0, dead_letter_policy=DeadLetterPolicy(0, "other"))
    bad.receive(10)
    bad.negative_acknowledge([0])
    with pytest.raises(
        ConfigurationError,
        match=r"dead-letter topic 'other' .* has schema id: int64 but the records come from 'in' with schema "
        r"id: int64, body: string",
    ):
        bad.receive(10)
    # The record the failed move took is not left in flight unseen: it is delivered (and moved) again, and
    # every receive says why until the topic is fixed.
    assert bad.unacknowledged() == [1, 2, 3], "the application's records; 0 is not held"
    with pytest.raises(ConfigurationError, match="dead-letter topic 'other'"):
        bad.receive(10)
    bad.close()
    # Beside records the application gets, the move's failure comes at the next call, after them.
    both = log.subscribe("in", 0, "u", nack_delay_ms=0, dead_letter_policy=DeadLetterPolicy(0, "other"))
    assert _offsets(both.receive(2)) == [0, 1]
    both.negative_acknowledge([0])
    assert _offsets(both.receive(2)) == [2], "0 went back; 2 is handed out"
    assert both.unacknowledged() == [1, 2]
    with pytest.raises(ConfigurationError, match="dead-letter topic 'other'"):
        both.receive(2)


def test_a_dead_letter_whose_acknowledgement_loses_is_never_written(env: Any) -> None:
    """A consumer whose lease lapsed (a long pause) moves a record another consumer has acknowledged since:
    its transaction cannot commit, so the dead-letter topic never shows the record."""
    log, clock = env
    slow = _sub(log, consumer_name="slow", dead_letter_policy=DeadLetterPolicy(0))
    got = slow.receive(10)
    clock.now += ACK_TIMEOUT
    fast = _sub(log, consumer_name="fast")
    fast.acknowledge(fast.receive(10))
    assert slow._dead is not None
    moved = slow._dead.move(got, lambda records, p: slow.acknowledge(records, transaction=p))
    assert not moved
    assert not _committed(log, "in-s-DLQ").num_rows
    assert slow.state().mark_delete == 4


class _DiesHereError(Exception):
    """The process dies here."""


def test_a_crash_before_the_commit_leaves_the_record_to_be_delivered_again_and_no_dead_letter(env: Any) -> None:
    """Killed after writing the dead letter and its pending acknowledgement: the transaction times out and
    is aborted, the dead letter never becomes visible, and the record comes again."""
    log, clock = env
    c = _sub(log, consumer_name="dies", dead_letter_policy=DeadLetterPolicy(0, transaction_timeout_ms=ACK_TIMEOUT))
    got = c.receive(10).slice(1, 1)

    def acknowledge_then_die(records: pa.Table, producer: txn_core.Producer) -> None:
        c.acknowledge(records, transaction=producer)
        raise _DiesHereError

    assert c._dead is not None
    dead = c._dead
    with pytest.raises(_DiesHereError):
        dead.move(got, acknowledge_then_die)
    clock.now += 2 * ACK_TIMEOUT + 1  # the transaction and the leases time out
    after = _sub(log, consumer_name="after")
    assert _offsets(after.receive(10)) == [0, 1, 2, 3]
    assert not _committed(log, "in-s-DLQ").num_rows


def test_without_a_policy_a_record_is_redelivered_for_ever(env: Any) -> None:
    log, _clock = env
    c = _sub(log, nack_delay_ms=0)
    c.receive(10)
    c.acknowledge([0, 2, 3])
    for _ in range(5):
        c.negative_acknowledge([1])
        assert _offsets(c.receive(10)) == [1]
    assert "in-s-DLQ" not in log.list_topics()
    assert log.subscription("in", 0, "s").describe().dead_lettered is None
