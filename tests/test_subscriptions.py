"""Subscriptions with plain and transactional acknowledgements, end to end (PROTOCOL.md "Subscriptions").

In-process scenarios on the memory backend with a fake clock: shared dispatch, redelivery, the conflict
rule, batch-index acknowledgements of interleaved transactions, crash recovery of pending acks, trimming.
"""

from __future__ import annotations

import uuid
from typing import Any

import pyarrow as pa
import pytest
from fakeclock import FakeClock

import txn_core
from txn_core import (
    AckStatus,
    ConfigurationError,
    DataLossError,
    InvalidNameError,
    InvalidOffsetError,
    InvalidTxnStateError,
    OffsetOutOfRangeError,
    SubscriptionNotFoundError,
    TransactionConflictError,
)
from txn_core.clients.subscriptions import acklog as acklog_mod
from txn_core.clients.subscriptions import state as state_mod
from txn_core.clients.subscriptions.acklog import AckLog
from txn_core.clients.subscriptions.records import AckOp, AckRecord, EntryAck
from txn_core.clients.subscriptions.store import read_meta, validate_ref
from txn_core.clients.subscriptions.subscription import Subscription, trim_all
from txn_core.format.entry import EntryKind, crc32
from txn_core.ops import maintenance
from txn_core.storage import MemoryStorage

SCHEMA = pa.schema([("id", pa.int64())])
TIMEOUT = 10_000


def _log(name: str | None = None, clock: FakeClock | None = None) -> txn_core.Log:
    return txn_core.Log(MemoryStorage(name or uuid.uuid4().hex), clock=clock or FakeClock())


@pytest.fixture
def env() -> tuple[txn_core.Log, FakeClock, str]:
    clock = FakeClock()
    name = uuid.uuid4().hex
    log = _log(name, clock)
    log.create_topic("in", 1, SCHEMA)
    log.create_topic("out", 1, SCHEMA)
    return log, clock, name


def _produce(log: txn_core.Log, ids: list[int], per_entry: int = 4) -> None:
    p = log.producer()
    for i in range(0, len(ids), per_entry):
        p.send("in", pa.table({"id": ids[i : i + per_entry]}), partition=0)
        p.flush()
    p.close()


def _sub(log: txn_core.Log, **kw: Any) -> txn_core.SubscriptionConsumer:
    kw.setdefault("ack_timeout_ms", TIMEOUT)
    kw.setdefault("range_size", 8)
    return log.subscribe("in", 0, "s", **kw)


def _offsets(t: pa.Table) -> list[int]:
    offsets: list[int] = t.column("_offset").to_pylist()
    return offsets


def _txn(log: txn_core.Log, tid: str) -> txn_core.Producer:
    p = log.producer(tid, transaction_timeout_ms=TIMEOUT)
    p.init_transactions()
    p.begin_transaction()
    return p


def _drain(c: txn_core.SubscriptionConsumer, n: int = 1000) -> list[int]:
    got = _offsets(c.receive(n))
    c.acknowledge(got)
    return got


# --- plain acknowledgements and shared dispatch --------------------------------------------------------


def test_plain_acks_advance_the_mark_delete_and_survive_a_restart(env: Any) -> None:
    log, clock, name = env
    _produce(log, list(range(20)))
    c = _sub(log)
    got = c.receive(100)
    assert _offsets(got) == list(range(20))
    c.acknowledge([0, 1, 2, 5, 6])
    assert c.state().mark_delete == 3 and c.state().status(5) is AckStatus.ACKED
    c.close()  # releases its leases: the rest is redelivered at once
    again = _log(name, clock)  # a new process
    c2 = _sub(again, create=False)
    assert c2.state().mark_delete == 3
    assert _offsets(c2.receive(100)) == [3, 4, *range(7, 20)]


def test_a_latest_subscription_starts_at_the_last_stable_offset(env: Any) -> None:
    """Created while a transaction is open at the log end, it delivers that transaction once it commits (the
    log end would skip its records), and nothing written before it."""
    log, _clock, _ = env
    _produce(log, list(range(8)))
    open_txn = _txn(log, "t1")
    open_txn.send("in", pa.table({"id": [100, 101]}), partition=0)
    open_txn.flush()
    c = _sub(log, initial_position="latest")
    assert c.state().mark_delete == 8
    open_txn.commit_transaction()
    _produce(log, [200])
    got = c.receive(100)
    assert got.column("id").to_pylist() == [100, 101, 200]


def test_each_record_is_delivered_to_one_consumer_at_a_time(env: Any) -> None:
    log, _clock, _ = env
    _produce(log, list(range(50)), per_entry=3)
    consumers = [_sub(log, consumer_name=f"c{i}") for i in range(3)]
    seen: dict[int, str] = {}
    for _round in range(4):
        for c in consumers:
            for o in _offsets(c.receive(6)):
                assert o not in seen, f"offset {o} delivered to {seen[o]} and {c.consumer_id}"
                seen[o] = c.consumer_id
    assert sorted(seen) == list(range(50))
    assert len(set(seen.values())) == 3
    for c in consumers:
        c.acknowledge(c.unacknowledged())
    assert consumers[0].state().mark_delete == 50
    assert all(not c.receive(10).num_rows for c in consumers)


def test_unacknowledged_records_are_redelivered_after_the_ack_timeout(env: Any) -> None:
    log, clock, _ = env
    _produce(log, list(range(6)))
    c1, c2 = _sub(log, consumer_name="a"), _sub(log, consumer_name="b")
    assert _offsets(c1.receive(10)) == list(range(6))
    c1.acknowledge([0, 1])
    assert not c2.receive(10).num_rows  # c1 holds the range
    clock.now += TIMEOUT // 2 + 1
    assert not c2.receive(10).num_rows
    clock.now += TIMEOUT // 2
    assert _offsets(c2.receive(10)) == [2, 3, 4, 5]
    assert not c1.receive(10).num_rows  # its lease expired: it delivers nothing of that range
    c1.acknowledge([2])  # a late acknowledgement of a delivered record still counts
    c2.acknowledge([2, 3, 4, 5])
    assert c2.state().mark_delete == 6


def test_a_record_is_delivered_only_with_at_least_half_an_ack_timeout_ahead(env: Any) -> None:
    log, clock, _ = env
    _produce(log, [0, 1])
    a, b = _sub(log, consumer_name="a"), _sub(log, consumer_name="b")
    assert _offsets(a.receive(10)) == [0, 1]
    clock.now += TIMEOUT * 6 // 10
    a.acknowledge([0, 1])
    _produce(log, [2, 3])
    assert _offsets(a.receive(10)) == [2, 3]  # its lease was half spent: renewed before delivering
    clock.now += TIMEOUT * 6 // 10  # past the first lease, within the renewed one
    assert not b.receive(10).num_rows
    clock.now += TIMEOUT * 5 // 10
    assert _offsets(b.receive(10)) == [2, 3]


def test_idle_consumers_write_nothing(env: Any) -> None:
    log, clock, _ = env
    _produce(log, list(range(10)))
    consumers = [_sub(log, consumer_name=f"c{i}") for i in range(3)]
    for _ in range(5):
        for c in consumers:
            got = c.receive(4)
            if got.num_rows:
                c.acknowledge(got)
    assert consumers[0].state().mark_delete == 10
    before = (
        sorted(log.storage.list("subscriptions/in/00000/s/leases/")),
        log.partition_log(consumers[0].ack_log_path).tail(),
    )
    for _ in range(6):
        clock.now += TIMEOUT
        assert not any(c.receive(10).num_rows for c in consumers)
    after = (
        sorted(log.storage.list("subscriptions/in/00000/s/leases/")),
        log.partition_log(consumers[0].ack_log_path).tail(),
    )
    assert after[1] == before[1]  # no ack records
    assert set(after[0]) <= set(before[0])  # no new leases (old ones are cleaned up below the mark-delete)


def test_redeliver_unacknowledged_after_an_abort(env: Any) -> None:
    log, _clock, _ = env
    _produce(log, list(range(4)))
    c = _sub(log)
    assert _offsets(c.receive(10)) == [0, 1, 2, 3]
    p = _txn(log, "t")
    p.send("out", pa.table({"id": [0]}), partition=0)
    p.abort_transaction()  # e.g. processing failed before anything was acknowledged
    assert not c.receive(10).num_rows
    c.redeliver_unacknowledged()
    assert _offsets(c.receive(10)) == [0, 1, 2, 3]


def test_a_negatively_acknowledged_record_is_delivered_again_after_the_delay(env: Any) -> None:
    log, clock, _ = env
    _produce(log, list(range(4)))
    c = _sub(log, nack_delay_ms=500)
    assert _offsets(c.receive(10)) == [0, 1, 2, 3]
    c.negative_acknowledge([1, 2])
    c.acknowledge([0, 3])
    assert not c.receive(10).num_rows
    clock.now += 500
    assert _offsets(c.receive(10)) == [1, 2]
    with pytest.raises(InvalidOffsetError, match=r"negatively acknowledge only records.*Nothing was negatively"):
        c.negative_acknowledge([0])  # already acknowledged


def test_cumulative_acknowledgement_acknowledges_everything_up_to_an_offset(env: Any) -> None:
    log, _clock, _ = env
    _produce(log, list(range(12)))
    c = _sub(log, range_size=64)
    assert _offsets(c.receive(100)) == list(range(12))
    c.acknowledge_cumulative(6)
    assert c.state().mark_delete == 7 and c.unacknowledged() == list(range(7, 12))
    p = _txn(log, "cum")
    c.acknowledge_cumulative(9, transaction=p)
    assert c.state().status(8) is AckStatus.PENDING
    p.commit_transaction()
    p.wait_for_completion()
    assert c.state().mark_delete == 10


def test_markers_and_aborted_input_do_not_hold_back_the_mark_delete(env: Any) -> None:
    log, _clock, _ = env
    _produce(log, [0, 1])
    p = log.producer("input", transaction_timeout_ms=TIMEOUT)
    p.init_transactions()
    for i, commit in enumerate([True, False, True, False, False]):
        p.begin_transaction()
        p.send("in", pa.table({"id": [100 + i, 200 + i]}), partition=0)
        (p.commit_transaction if commit else p.abort_transaction)()
    p.wait_for_completion()
    _produce(log, [7])
    end = log.partition_log("topics/in/00000").end_offset()
    c = _sub(log, range_size=4)
    ids: list[int] = []
    while (t := c.receive(3)).num_rows:
        ids += t.column("id").to_pylist()
        c.acknowledge(t)
    assert ids == [0, 1, 100, 200, 102, 202, 7]
    c.receive(1)  # reports the offsets after the last record that are never delivered
    assert c.state().mark_delete == end and not c.state().skipped


# --- transactional acknowledgements --------------------------------------------------------------------


def test_transactional_acks_apply_only_when_the_transaction_commits(env: Any) -> None:
    log, _clock, _ = env
    _produce(log, list(range(8)))
    c = _sub(log)
    got = c.receive(100)
    p = _txn(log, "worker")
    p.send("out", pa.table({"id": got.column("id")}), partition=0)
    c.acknowledge(got, transaction=p)
    st = c.state()
    assert [st.status(o) for o in range(8)] == [AckStatus.PENDING] * 8 and st.mark_delete == 0
    assert st.open_transactions() == [p.transaction_id]
    assert log.describe_transaction("worker").participants == (c.ack_log_path,)  # the send is buffered
    p.commit_transaction()
    p.wait_for_completion()
    assert set(log.describe_transaction("worker").participants) == {"topics/out/00000", c.ack_log_path}
    assert c.state().mark_delete == 8 and not c.state().txns
    assert not c.receive(10).num_rows


def test_abort_discards_transactional_acks_and_the_records_are_redelivered(env: Any) -> None:
    log, _clock, _ = env
    _produce(log, list(range(8)))
    c = _sub(log)
    got = c.receive(100)
    p = _txn(log, "worker")
    c.acknowledge(got.slice(0, 5), transaction=p)
    assert not c.receive(10).num_rows  # 0-4 pending, 5-7 in flight
    p.abort_transaction()
    p.wait_for_completion()
    assert [c.state().status(o) for o in range(8)] == [AckStatus.UNACKED] * 8
    assert _offsets(c.receive(100)) == [0, 1, 2, 3, 4]
    c.acknowledge(range(8))
    assert c.state().mark_delete == 8


def test_an_ack_of_a_record_pending_in_another_transaction_fails_with_a_conflict(env: Any) -> None:
    log, clock, _ = env
    _produce(log, list(range(4)))
    slow, fast = _sub(log, consumer_name="slow"), _sub(log, consumer_name="fast")
    assert _offsets(slow.receive(10)) == [0, 1, 2, 3]
    clock.now += TIMEOUT  # slow's lease expires: fast gets the records too
    assert _offsets(fast.receive(10)) == [0, 1, 2, 3]
    t1, t2 = _txn(log, "t1"), _txn(log, "t2")
    t1.send("out", pa.table({"id": [1]}), partition=0)
    slow.acknowledge([1, 2], transaction=t1)  # first in the ack log: wins
    t2.send("out", pa.table({"id": [2]}), partition=0)
    with pytest.raises(TransactionConflictError, match=r"1 \(pending in transaction .*\), 2 \(pending"):
        fast.acknowledge([0, 1, 2, 3], transaction=t2)
    with pytest.raises(InvalidTxnStateError, match="call abort_transaction"):
        t2.commit_transaction()
    t2.abort_transaction()
    fast.acknowledge([0, 3])  # its other records are still its own
    t1.commit_transaction()
    t1.wait_for_completion()
    st = fast.state()
    assert st.mark_delete == 4 and st.void_count == 1
    c = log.consumer()
    c.assign([("out", 0)])
    assert c.poll().column("id").to_pylist() == [1]  # only the winner's output


def test_a_plain_ack_of_a_record_another_transaction_committed_is_harmless_but_a_transactional_one_conflicts(
    env: Any,
) -> None:
    log, clock, _ = env
    _produce(log, [0])
    a, b = _sub(log, consumer_name="a"), _sub(log, consumer_name="b")
    a.receive(1)
    clock.now += TIMEOUT
    b.receive(1)
    t = _txn(log, "t")
    a.acknowledge([0], transaction=t)
    t.commit_transaction()
    t.wait_for_completion()
    t2 = _txn(log, "t2")
    with pytest.raises(TransactionConflictError, match="already acknowledged"):
        b.acknowledge([0], transaction=t2)
    t2.abort_transaction()


def test_batch_index_acks_of_interleaved_transactions_abort_restores_only_the_aborted_bits(env: Any) -> None:
    log, _clock, _ = env
    _produce(log, list(range(6)), per_entry=6)  # one entry of six records
    c = _sub(log)
    assert _offsets(c.receive(10)) == list(range(6))
    t1, t2 = _txn(log, "t1"), _txn(log, "t2")
    c.acknowledge([0], transaction=t1)
    c.acknowledge([3], transaction=t2)
    c.acknowledge([1, 5], transaction=t1)
    c.acknowledge([4], transaction=t2)
    c.acknowledge([2])
    st = c.state()
    assert format(st.pending[0][1], "06b") == "000000" and st.acked[0][1] == 0b111011
    t1.abort_transaction()
    t1.wait_for_completion()
    st = c.state()
    assert format(st.pending[0][1], "06b") == "100011"  # exactly t1's bits (0, 1, 5) are back
    t2.commit_transaction()
    t2.wait_for_completion()
    st = c.state()
    assert not st.pending and format(st.acked[0][1], "06b") == "100011"
    assert _offsets(c.receive(10)) == [0, 1, 5]  # redelivered after the abort
    c.acknowledge([0, 1, 5])
    assert c.state().mark_delete == 6


def test_a_zombie_ack_after_its_transaction_timed_out_has_no_effect(env: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    log, clock, _ = env
    monkeypatch.setattr(acklog_mod, "RESOLVE_EVERY_S", 0.0)
    _produce(log, [0, 1])
    c = _sub(log, ack_timeout_ms=60_000)
    c.receive(10)
    zombie = _txn(log, "zombie")
    c.acknowledge([0], transaction=zombie)
    clock.now += TIMEOUT + 1
    c.state()  # meets the pending ack, finds its transaction past its timeout, aborts it
    assert c.state().status(0) is AckStatus.UNACKED and not c.state().txns
    with pytest.raises(TransactionConflictError, match="already ended"):
        c.acknowledge([1], transaction=zombie)  # the frozen producer's late write lands, void
    assert c.state().status(1) is AckStatus.UNACKED
    with pytest.raises(txn_core.ProducerFencedError):
        zombie.abort_transaction()


def test_a_zombie_ack_the_ended_cache_forgot_is_dropped_through_a_logged_abort_marker(
    env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    log, clock, name = env
    monkeypatch.setattr(acklog_mod, "RESOLVE_EVERY_S", 0.0)
    monkeypatch.setattr(state_mod, "ENDED_KEPT", 1)
    _produce(log, list(range(4)))
    c = _sub(log)
    c.receive(10)
    old = _txn(log, "old")
    c.acknowledge([0], transaction=old)
    txn = old.transaction_id
    old.commit_transaction()
    old.wait_for_completion()
    for i, o in enumerate((1, 2)):  # two later transactions push "old" out of the ended cache
        t = _txn(log, f"later-{i}")
        c.acknowledge([o], transaction=t)
        t.commit_transaction()
        t.wait_for_completion()
    assert txn not in c.state().ended
    # The old producer's delayed write lands now, after its COMMIT marker.
    payload = AckRecord(AckOp.ACK, (EntryAck(3, 1, 0),), consumer="late").encode()
    log.partition_log(c.ack_log_path).append(EntryKind.DATA, payload, len(payload), crc32(payload), 1, txn=txn)
    fresh = _log(name, clock).subscription("in", 0, "s")
    st = fresh.state()  # replays it as pending, learns "old" finished, logs an ABORT marker for it
    assert st.status(3) is AckStatus.UNACKED and not st.txns
    assert c.state().status(3) is AckStatus.UNACKED and not c.state().txns  # every replica agrees
    assert c.unacknowledged() == [3]
    c.acknowledge([3])
    assert c.state().mark_delete == 4


# --- crashes and recovery ------------------------------------------------------------------------------


def test_consumer_crash_with_pending_acks_recovers_and_redelivers(env: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    log, clock, name = env
    monkeypatch.setattr(acklog_mod, "RESOLVE_EVERY_S", 0.0)
    _produce(log, list(range(5)))
    c = _sub(log)
    got = c.receive(10)
    p = _txn(log, "crashy")
    p.send("out", pa.table({"id": got.column("id")}), partition=0)
    c.acknowledge(got, transaction=p)
    del c, p  # the process dies with the transaction open and its acks pending
    clock.now += TIMEOUT + 1
    log2 = _log(name, clock)  # another process, later
    c2 = _sub(log2, create=False)
    assert _offsets(c2.receive(10)) == [0, 1, 2, 3, 4]  # aborted on timeout; its lease expired too
    assert log2.describe_transaction("crashy").state == "CompleteAbort"
    out = log2.consumer()
    out.assign([("out", 0)])
    assert not out.poll().num_rows


def test_restarted_worker_fences_its_predecessor_and_releases_its_pending_acks(env: Any) -> None:
    log, clock, name = env
    _produce(log, list(range(3)))
    c = _sub(log, ack_timeout_ms=2_000)
    old = _txn(log, "worker-1")
    c.acknowledge(c.receive(10), transaction=old)
    log2 = _log(name, clock)
    new = log2.producer("worker-1", transaction_timeout_ms=TIMEOUT)
    new.init_transactions()  # aborts the predecessor's transaction: markers reach the ack log
    clock.now += 2_000
    c2 = _sub(log2, ack_timeout_ms=2_000, create=False)
    assert _offsets(c2.receive(10)) == [0, 1, 2]


def test_a_crash_after_prepare_commit_rolls_the_acks_forward(env: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    log, clock, name = env
    monkeypatch.setattr(acklog_mod, "RESOLVE_EVERY_S", 0.0)
    _produce(log, list(range(3)))
    c = _sub(log)
    p = _txn(log, "half")
    c.acknowledge(c.receive(10), transaction=p)

    def die(*_args: Any, **_kwargs: Any) -> Any:
        raise RuntimeError("process died before writing markers")

    monkeypatch.setattr(log.coordinator, "write_markers", die)
    monkeypatch.setattr(log.coordinator, "complete", die)
    p.commit_transaction()  # PrepareCommit is durable: the commit point
    sub = _log(name, clock).subscription("in", 0, "s")
    assert sub.state().status(0) is AckStatus.PENDING  # decided, but no marker in the ack log yet
    clock.now += TIMEOUT + 1
    st = sub.state()  # prepared for too long: completes it (markers), then applies its COMMIT
    assert st.mark_delete == 3 and not st.txns


def test_snapshot_plus_tail_equals_a_full_replay(env: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    log, clock, name = env
    _produce(log, list(range(40)), per_entry=5)
    c = _sub(log)
    t = _txn(log, "t")
    for i, o in enumerate(_offsets(c.receive(40))):
        if i % 3 == 0:
            c.acknowledge([o], transaction=t)
        elif i % 3 == 1:
            c.acknowledge([o])
        if i == 20:
            c.acklog.write_snapshot(clock.now)
    meta = read_meta(log.storage, validate_ref("in", 0, "s"))
    from_snapshot = AckLog(_log(name, clock), meta).refresh().to_json()
    monkeypatch.setattr("txn_core.clients.subscriptions.store.SnapshotStore.load_latest", lambda *a, **k: None)
    full = AckLog(_log(name, clock), meta).refresh().to_json()
    assert from_snapshot == full and full["pending"]


def test_the_ack_log_is_trimmed_even_when_acknowledgements_stop(env: Any) -> None:
    log, clock, name = env
    _produce(log, list(range(15)), per_entry=2)
    c = _sub(log, trim_min_age_ms=120_000)
    for _ in range(5):
        t = _txn(log, "t")
        c.acknowledge(c.receive(3), transaction=t)
        t.commit_transaction()
        t.wait_for_completion()
    plog = log.partition_log(c.ack_log_path)
    tail = plog.tail()[0]
    assert tail >= 10 and plog.log_start(refresh=True).slot == 0
    # Acknowledgements stop; the last commit marker moved the mark-delete after the last ack record.
    # Idle polls (or a cron calling Subscription.trim) snapshot, then trim once the snapshot is old.
    for _ in range(3):
        clock.now += 80_000
        assert not c.receive(1).num_rows
    assert plog.log_start(refresh=True).slot == tail
    assert all(not log.storage.exists(plog.entries.key(s)) for s in range(tail))
    st = _sub(_log(name, clock), create=False).state()  # a new process starts from the snapshot
    assert st.mark_delete == c.state().mark_delete == 15 and st.slot == tail
    done = trim_all(log, min_age_ms=0, check_min_age=False)  # the cron form: nothing is left to trim
    assert done["in/0/s"].entries_deleted == 0


def test_records_retention_removed_before_they_were_acknowledged_are_given_up_with_skip_lost(env: Any) -> None:
    log, clock, name = env
    _produce(log, list(range(12)))  # entries [0, 4), [4, 8), [8, 12)
    c = _sub(log, consumer_name="a")
    assert _offsets(c.receive(8)) == list(range(8))
    c.acknowledge([0, 1, 2])
    clock.now += 3_600_000
    _produce(log, list(range(12, 16)))
    p = _txn(log, "worker")
    c.acknowledge([4, 5, 6, 7], transaction=p)  # held until p ends
    retained = maintenance.apply_retention(log, "in", retention_ms=60_000, min_age_ms=0, check_min_age=False)
    assert retained[0].new_start == 12
    other = _sub(_log(name, clock), consumer_name="b", create=False)  # another process of the subscription
    with pytest.raises(DataLossError, match=r"offset 3 was removed by retention.*Call skip_lost\(\)"):
        other.receive(10)
    assert other.skip_lost() == 9  # from 3 to 12: 3 unacknowledged, 4-7 held, 8-11 never delivered
    assert other.skip_lost() == 0
    assert other.state().mark_delete == 12 and not other.state().txns
    p.commit_transaction()  # what it held was given up: its commit changes nothing
    p.wait_for_completion()
    assert _offsets(other.receive(10)) == [12, 13, 14, 15]
    c.close()
    again = Subscription(_log(name, clock), "in", 0, "s")  # every replica folds the ack log alike
    assert again.state().mark_delete == 12 and again.skip_lost() == 0


def test_a_receive_that_meets_removed_offsets_first_hands_out_what_it_took(env: Any) -> None:
    log, clock, _ = env
    t0 = clock.now
    _produce(log, list(range(8)))  # entries [0, 4), [4, 8)
    a = _sub(log, consumer_name="a")
    assert _offsets(a.receive(8)) == list(range(8))
    a.acknowledge(list(range(1, 8)))  # 0 stays unacknowledged
    clock.now = t0 + 6000
    _produce(log, list(range(8, 12)))
    assert _offsets(a.receive(8)) == [8, 9, 10, 11]  # a leases their range
    a.acknowledge([8, 9, 10, 11])
    clock.now = t0 + 11_000  # the first range's lease ran out
    _produce(log, list(range(12, 16)))
    maintenance.apply_retention(log, "in", retention_ms=10_500, min_age_ms=0, check_min_age=False)  # start 8
    assert _offsets(a.receive(8)) == [12, 13, 14, 15]  # from its lease, before it meets offset 0's loss
    with pytest.raises(DataLossError, match="offset 0 was removed by retention"):
        a.receive(8)
    a.acknowledge([12, 13, 14, 15])
    assert a.skip_lost() == 16 and a.state().mark_delete == 16  # to the log start 8, then over 8-15 acknowledged


def test_a_consumer_whose_buffer_lags_reads_on_after_retention_removed_only_acknowledged_entries(env: Any) -> None:
    log, clock, name = env
    t0 = clock.now
    _produce(log, [0, 1, 2, 3])
    a = _sub(log, consumer_name="a", range_size=4)
    b = _sub(_log(name, clock), consumer_name="b", create=False, range_size=4)  # another process
    b.acknowledge(_offsets(b.receive(8)))
    clock.now = t0 + 1000
    _produce(log, list(range(4, 12)))
    a.acknowledge(_offsets(a.receive(8)))
    assert not b.receive(8).num_rows  # b's reader has seen the log up to offset 4 only
    clock.now = t0 + 2000
    _produce(log, list(range(12, 20)))
    clock.now = t0 + 2500  # b learned the log start less than 5 s ago: it does not ask again by itself
    retained = maintenance.apply_retention(log, "in", retention_ms=900, min_age_ms=0, check_min_age=False)
    assert retained[0].new_start == 12 == a.state().mark_delete  # nothing unacknowledged was removed
    assert _offsets(b.receive(8)) == list(range(12, 20))  # was: ObjectNotFoundError for a removed slot


# --- bad input -----------------------------------------------------------------------------------------


def test_clear_errors_for_bad_input(env: Any) -> None:
    log, _clock, _ = env
    _produce(log, list(range(4)))
    _sub(log).close()
    with pytest.raises(SubscriptionNotFoundError, match="existing: s"):
        log.subscribe("in", 0, "nope", create=False)
    with pytest.raises(SubscriptionNotFoundError):
        log.subscription("in", 0, "nope")
    with pytest.raises(InvalidNameError):
        log.subscribe("in", 0, "../x")
    with pytest.raises(ConfigurationError, match="no partition 3"):
        log.subscribe("in", 3, "s")
    with pytest.raises(txn_core.TopicNotFoundError):
        log.subscribe("missing", 0, "s")
    with pytest.raises(ConfigurationError, match="range_size"):
        log.subscribe("in", 0, "s", range_size=16)
    c = _sub(log)
    c.receive(2)
    with pytest.raises(InvalidOffsetError, match="not delivered"):
        c.acknowledge([3])
    with pytest.raises(OffsetOutOfRangeError, match="beyond the partition's end"):
        c.acknowledge([99])
    with pytest.raises(InvalidOffsetError):
        c.acknowledge([-1])
    p = log.producer("idle")
    p.init_transactions()
    with pytest.raises(InvalidTxnStateError, match="needs an open transaction"):
        c.acknowledge([0], transaction=p)
    c.close()
    with pytest.raises(txn_core.ProducerClosedError):
        c.receive()


def test_trimming_an_ack_log_younger_than_the_stale_writer_bound_is_refused(env: Any) -> None:
    """A producer acknowledging in a transaction writes its marker at its cached ack-log tail; a trim under
    about a minute deleted that slot first, the transaction looked open to the next replica, which aborted it,
    and ten committed acknowledgements were delivered and processed again (a user found it). Below the bound
    trimming is refused, in every form."""
    log, _clock, _name = env
    _produce(log, list(range(3)))
    with pytest.raises(ConfigurationError, match="below the safe 120000 ms"):
        _sub(log, trim_min_age_ms=30_000)
    c = _sub(log)
    sub = Subscription(log, "in", 0, "s")
    with pytest.raises(ConfigurationError, match="check_min_age=False"):
        sub.trim(min_age_ms=30_000)
    with pytest.raises(ConfigurationError, match="check_min_age=False"):
        trim_all(log, min_age_ms=0)
    assert sub.trim(min_age_ms=120_000).entries_deleted == 0
    assert c.receive(3).num_rows == 3
