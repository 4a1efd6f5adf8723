"""Failover subscriptions: one active consumer per partition, chosen by name, and takeover from the
acknowledged position (PROTOCOL.md "Subscription types", "Failover"). In-process scenarios on the memory
backend with a fake clock."""

from __future__ import annotations

import uuid
from typing import Any

import pyarrow as pa
import pytest
from fakeclock import FakeClock

import txn_core
from txn_core import AckStatus, SubscriptionType
from txn_core.clients.subscriptions.members import active_of
from txn_core.clients.subscriptions.seats import HOLD_CHECK_MS
from txn_core.storage import MemoryStorage

SCHEMA = pa.schema([("id", pa.int64())])
ACK_TIMEOUT = 10_000
SESSION = 4_000


@pytest.fixture
def env() -> tuple[txn_core.Log, FakeClock]:
    clock = FakeClock()
    log = txn_core.Log(MemoryStorage(uuid.uuid4().hex), clock=clock)
    log.create_topic("in", 3, SCHEMA)
    p = log.producer()
    for partition in range(3):
        for i in range(0, 12, 4):
            p.send("in", pa.table({"id": list(range(i, i + 4))}), partition=partition)
            p.flush()
    p.close()
    return log, clock


def _member(log: txn_core.Log, name: str, partition: int = 0, **kw: Any) -> txn_core.SubscriptionConsumer:
    kw.setdefault("ack_timeout_ms", ACK_TIMEOUT)
    kw.setdefault("session_timeout_ms", SESSION)
    kw.setdefault("range_size", 4)
    return log.subscribe("in", partition, "f", consumer_name=name, subscription_type="failover", **kw)


def _offsets(t: pa.Table) -> list[int]:
    offsets: list[int] = t.column("_offset").to_pylist()
    return offsets


def test_the_active_consumer_is_the_partition_index_mod_count_of_the_sorted_names(env: Any) -> None:
    """As Pulsar's failover on a partitioned topic: with members a and b, partitions 0 and 2 go to a, 1 to b."""
    assert active_of(["b-2", "a-1"], 0) == "a-1" and active_of(["b-2", "a-1"], 1) == "b-2"
    assert active_of(["b-2", "a-1", "c-3"], 5) == "c-3" and active_of([], 0) is None
    log, clock = env
    members = {(name, p): _member(log, name, p) for name in ("b", "a") for p in range(3)}
    clock.now += SESSION // 4  # every member has listed the others since the last joined
    for p, active in ((0, "a"), (1, "b"), (2, "a")):
        standby = "b" if active == "a" else "a"
        assert not members[standby, p].receive(100).num_rows
        assert _offsets(members[active, p].receive(100)) == list(range(12))
        assert not members[standby, p].receive(100).num_rows
        d = log.subscription("in", p, "f").describe()
        assert d.type is SubscriptionType.FAILOVER and d.active_consumer == members[active, p].consumer_id
        assert d.consumers == tuple(sorted(m.consumer_id for (_n, q), m in members.items() if q == p))


def test_the_next_member_takes_over_at_once_when_the_active_one_closes(env: Any) -> None:
    log, clock = env
    a, b = _member(log, "a"), _member(log, "b")
    assert _offsets(a.receive(6)) == list(range(6))
    a.acknowledge([0, 1, 2])
    assert not b.receive(100).num_rows
    a.close()
    clock.now += HOLD_CHECK_MS  # b looks at the hold again: free
    assert _offsets(b.receive(100)) == list(range(3, 12))  # from the acknowledged position


def test_when_the_active_member_dies_the_next_takes_over_after_its_session_and_leases(env: Any) -> None:
    """Killed (no close): its membership and hold lapse after the session timeout, its ranges after the ack
    timeout. A committed transactional acknowledgement is never redelivered; an open one keeps its records
    until its transaction is aborted."""
    log, clock = env
    a, b = _member(log, "a"), _member(log, "b")
    got = _offsets(a.receive(12))
    assert got == list(range(12))
    committed = log.producer("committed", transaction_timeout_ms=ACK_TIMEOUT)
    committed.init_transactions()
    committed.begin_transaction()
    a.acknowledge(got[:4], transaction=committed)
    committed.commit_transaction()
    committed.wait_for_completion()
    dying = log.producer("dying", transaction_timeout_ms=3 * ACK_TIMEOUT)
    dying.init_transactions()
    dying.begin_transaction()
    a.acknowledge(got[4:8], transaction=dying)  # a dies here
    clock.now += SESSION - 1
    assert not b.receive(100).num_rows  # a still counts and holds
    clock.now += ACK_TIMEOUT - SESSION + 1  # a's session, hold and range leases have lapsed
    assert _offsets(b.receive(100)) == list(range(8, 12))
    b.acknowledge(list(range(8, 12)))
    clock.now += 2 * ACK_TIMEOUT + 1  # the dead transaction times out; a replica aborts it
    assert _offsets(b.receive(100)) == list(range(4, 8))
    assert all(b.state().status(o) is AckStatus.ACKED for o in range(4))


def test_a_member_that_joins_ahead_takes_over_without_a_record_reaching_both(env: Any) -> None:
    """b is active; a joins and sorts first. b steps down: it releases the hold and every range with nothing in
    flight at once, and keeps the range it is still processing until it acknowledges it or its lease lapses."""
    log, clock = env
    b = _member(log, "b")
    assert _offsets(b.receive(2)) == [0, 1]  # range [0, 4) leased by b, 0 and 1 in flight
    a = _member(log, "a")
    assert not a.receive(100).num_rows  # b holds the hold until it notices
    clock.now += SESSION // 4  # b lists the members again
    assert not b.receive(100).num_rows  # stepped down
    assert _offsets(a.receive(100)) == list(range(4, 12))  # not 0-3: b's range while 0, 1 are in flight
    b.acknowledge([0, 1])
    assert not b.receive(100).num_rows  # releases the range
    clock.now += ACK_TIMEOUT  # (a learnt the range was b's and does not look again before b's lease lapses)
    assert _offsets(a.receive(100)) == [2, 3, *range(4, 12)]  # its own 4-11 unacknowledged: redelivered
    a.acknowledge(list(range(2, 12)))
    assert a.state().mark_delete == 12


def test_a_standby_member_writes_nothing_between_its_renewals(env: Any) -> None:
    """A standby polls (reading the members and the hold) but creates no lease, hold or member object until
    half its session is spent; then it renews its membership and deletes the old object."""
    log, clock = env
    a, b = _member(log, "a"), _member(log, "b")
    a.receive(100)
    root = "subscriptions/in/00000/f/"

    def objects() -> list[list[str]]:
        return [sorted(log.storage.list(root + d)) for d in ("leases/", "hold/", "members/")]

    before = objects()
    for _ in range(7):
        clock.now += SESSION // 16
        assert not b.receive(100).num_rows
    assert objects() == before
    clock.now += SESSION // 16
    assert not b.receive(100).num_rows  # half its session spent: renewed
    leases, holds, members = objects()
    assert (leases, holds) == (before[0], before[1]) and len(members) == 2 and members != before[2]
