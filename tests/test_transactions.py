"""Transactions: visibility, the last stable offset, fencing, epochs, timeouts, offsets, admin."""

from __future__ import annotations

import datetime
import threading
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from fakeclock import FakeClock
from raw_entries import append_data

import txn_core
from conftest import EMULATED, make_location
from txn_core.errors import ConfigurationError, InvalidTxnStateError, ProducerFencedError, TransactionTimedOutError
from txn_core.format.states import (
    CLIENT_TRANSITIONS,
    COORDINATOR_TRANSITIONS,
    ClientState,
    CoordinatorState,
    check_client_transition,
    check_coordinator_transition,
)
from txn_core.storage import MemoryStorage, Storage, open_storage

SCHEMA = pa.schema([("id", pa.int64())])


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1_800_000_000_000)


#: Where the transaction suite runs: on memory by default, on a real S3 server (SeaweedFS) in its tier, on the
#: GCS and Azure emulators in theirs, and on SeaweedFS behind 25 ms of added round-trip time in the latency
#: tier (where overlapped requests and read-ahead really overlap, and every request answers late).
STORES = [
    "memory",
    pytest.param("seaweedfs", marks=pytest.mark.seaweedfs),
    *EMULATED,
    pytest.param("latency", marks=pytest.mark.latency),
]


@pytest.fixture(params=STORES)
def log(request: pytest.FixtureRequest, clock: FakeClock, tmp_path: Path) -> txn_core.Log:
    return make_log(request, clock, tmp_path)


def make_log(request: pytest.FixtureRequest, clock: FakeClock, tmp_path: Path) -> txn_core.Log:
    """A log with topic ``t`` (3 partitions) on ``request.param``'s store (:data:`STORES`)."""
    storage: Storage
    if request.param == "memory":
        storage = MemoryStorage(uuid.uuid4().hex)
    else:
        location = make_location(request.param, request, tmp_path)
        storage = open_storage(location.url, location.storage_options)
    log = txn_core.Log(storage, clock=clock)
    log.create_topic("t", 3, SCHEMA)
    return log


def ids(log: txn_core.Log, isolation: str = "read_committed", parts: int = 3) -> list[int]:
    c = log.consumer(isolation_level=isolation)
    c.assign([("t", p) for p in range(parts)])
    out: list[int] = []
    while (got := c.poll()).num_rows:
        out.extend(got.column("id").to_pylist())
    return sorted(out)


def tx(log: txn_core.Log, tid: str = "tx", timeout: int = 10_000) -> txn_core.Producer:
    p = log.producer(tid, transaction_timeout_ms=timeout)
    p.init_transactions()
    return p


def send(p: txn_core.Producer, values: list[int], partition: int | None = None) -> None:
    if partition is None:
        p.send("t", pa.table({"id": values}), key_column="id")
    else:
        p.send("t", pa.table({"id": values}), partition=partition)


# --- visibility ---------------------------------------------------------------------------------


def test_commit_makes_every_partition_visible_and_abort_none(log: txn_core.Log) -> None:
    p = tx(log)
    p.begin_transaction()
    send(p, list(range(30)))
    p.flush()
    assert ids(log) == []
    assert ids(log, "read_uncommitted") == list(range(30))
    p.commit_transaction()
    assert ids(log) == list(range(30))
    p.begin_transaction()
    send(p, list(range(100, 130)))
    p.flush()
    p.abort_transaction()
    assert ids(log) == list(range(30))
    assert ids(log, "read_uncommitted") == list(range(30)) + list(range(100, 130))


def test_an_open_transaction_holds_the_last_stable_offset(log: txn_core.Log) -> None:
    plain = log.producer()
    send(plain, [1], partition=0)
    plain.flush()
    p = tx(log)
    p.begin_transaction()
    send(p, [2, 3], partition=0)
    p.flush()
    send(plain, [4], partition=0)  # after the open transaction: held back too
    send(plain, [5], partition=1)  # another partition: not held
    plain.flush()
    d = log.describe_topic("t").partitions
    assert (d[0].last_stable_offset, d[0].log_end_offset) == (1, 4)
    assert (d[1].last_stable_offset, d[1].log_end_offset) == (1, 1)
    assert [o.first_offset for o in d[0].ongoing_transactions] == [1]
    assert d[0].ongoing_transactions[0].transactional_id == "tx"
    assert ids(log) == [1, 5]
    p.commit_transaction()
    assert ids(log) == [1, 2, 3, 4, 5]  # visible as soon as the decision is durable
    p.wait_for_completion()
    d = log.describe_topic("t").partitions
    assert d[0].last_stable_offset == d[0].log_end_offset == 5  # two data entries, one plain, one marker
    assert ids(log) == [1, 2, 3, 4, 5]


def test_reader_in_the_middle_sees_the_commit_at_once(log: txn_core.Log) -> None:
    p = tx(log)
    p.begin_transaction()
    send(p, list(range(60)))
    p.flush()
    c = log.consumer()
    c.assign([("t", i) for i in range(3)])
    assert c.poll().num_rows == 0
    p.commit_transaction()
    assert sorted(c.poll().column("id").to_pylist()) == list(range(60))


def test_decision_is_the_commit_point_even_before_markers(log: txn_core.Log) -> None:
    """PrepareCommit landed, markers not yet written: readers see the transaction on every partition."""
    p = tx(log)
    p.begin_transaction()
    send(p, list(range(30)))
    p.flush()
    txn = p.transaction_id
    assert txn is not None
    log.coordinator.end("tx", p.producer_id, p.epoch, txn, True, complete=False)
    fresh = txn_core.Log(log.storage, clock=log.clock)
    assert ids(fresh) == list(range(30))
    for part in fresh.describe_topic("t").partitions:
        assert part.last_stable_offset == part.log_end_offset


def test_group_offsets_commit_with_the_transaction(log: txn_core.Log) -> None:
    p = tx(log)
    tp = txn_core.TopicPartition("in", 0)
    p.begin_transaction()
    send(p, [1])
    p.send_offsets_to_transaction({("in", 0): 42}, "g")
    p.flush()
    assert tp not in log.groups.committed("g")
    p.commit_transaction()
    assert log.groups.committed("g")[tp].offset == 42
    p.begin_transaction()
    p.send_offsets_to_transaction({("in", 0): 99}, "g")
    p.abort_transaction()
    assert txn_core.Log(log.storage).groups.committed("g")[tp].offset == 42


def test_commit_metadata_is_stored_with_the_decision(log: txn_core.Log) -> None:
    p = tx(log, "sink-1")
    p.begin_transaction()
    p.commit_transaction(metadata={"batch": 7})  # an empty transaction with progress still commits
    assert log.transaction_metadata("sink-1") == {"batch": 7}
    p.begin_transaction()
    send(p, [1])
    p.abort_transaction()
    assert txn_core.Log(log.storage).transaction_metadata("sink-1") == {"batch": 7}


@pytest.mark.parametrize(
    ("metadata", "named"),
    [({"when": datetime.datetime(2026, 1, 1)}, "'when'"), ({"x": float("nan")}, "'x'"), ([1], "list"), ({1: 2}, "1")],
)
def test_commit_metadata_that_is_not_json_is_refused_before_anything_moves(
    log: txn_core.Log, metadata: Any, named: str
) -> None:
    p = tx(log, "sink-2")
    p.begin_transaction()
    send(p, [5])
    with pytest.raises(ConfigurationError, match=named):
        p.commit_transaction(metadata=metadata)
    assert p.state is ClientState.IN_TRANSACTION  # still open: nothing flushed, nothing decided
    assert ids(log) == []
    p.commit_transaction(metadata={"when": "2026-01-01T00:00:00"})
    assert ids(log) == [5]
    assert log.transaction_metadata("sink-2") == {"when": "2026-01-01T00:00:00"}


# --- fencing and epochs ---------------------------------------------------------------------------


def test_zombie_producer_is_fenced_after_restart(log: txn_core.Log) -> None:
    zombie = tx(log)
    zombie.begin_transaction()
    send(zombie, [1, 2, 3])
    zombie.flush()
    successor = tx(txn_core.Log(log.storage, clock=log.clock))  # fences the zombie, aborts its transaction
    assert ids(log) == []
    with pytest.raises(ProducerFencedError, match="fenced"):
        zombie.commit_transaction()
    assert zombie.state == ClientState.FATAL_ERROR
    with pytest.raises(ProducerFencedError):
        zombie.begin_transaction()
    # Its late writes land (storage cannot refuse them) but are never visible.
    append_data(
        log,
        "t",
        0,
        pa.record_batch({"id": [666]}),
        SCHEMA,
        producer_id=zombie.producer_id,
        epoch=zombie.epoch,
        txn=zombie.transaction_id,
        base_sequence=99,
    )
    successor.begin_transaction()
    send(successor, [10])
    successor.commit_transaction()
    assert ids(log) == [10]
    d = log.describe_topic("t").partitions
    assert all(x.last_stable_offset == x.log_end_offset for x in d)  # the zombie write holds nothing


def test_epoch_is_bumped_by_every_completed_transaction(log: txn_core.Log) -> None:
    p = tx(log)
    epochs = [p.epoch]
    for _ in range(3):
        p.begin_transaction()
        send(p, [1])
        p.commit_transaction()
        p.wait_for_completion()
        epochs.append(p.epoch)
    assert epochs == sorted(set(epochs)) and len(epochs) == 4
    # A delayed end request of the last transaction cannot land again in a new one (KIP-890).
    last = log.coordinator.state("tx")
    assert last is not None and last.txn is not None
    p.begin_transaction()
    send(p, [2])
    p.flush()
    with pytest.raises((ProducerFencedError, InvalidTxnStateError)):
        log.coordinator.end("tx", p.producer_id, last.epoch - 1, p.transaction_id, True)  # type: ignore[arg-type]


def test_init_transactions_rolls_forward_a_prepared_transaction(log: txn_core.Log) -> None:
    p = tx(log)
    p.begin_transaction()
    send(p, list(range(9)))
    p.flush()
    log.coordinator.end("tx", p.producer_id, p.epoch, p.transaction_id, True, complete=False)  # type: ignore[arg-type]
    tx(txn_core.Log(log.storage, clock=log.clock))
    state = log.coordinator.state("tx")
    assert state is not None and state.state == CoordinatorState.EMPTY
    assert ids(log) == list(range(9))
    assert log.describe_topic("t").partitions[0].committed_transactions >= 1  # the markers were written


# --- timeouts -------------------------------------------------------------------------------------


def test_a_dead_producer_cannot_hold_readers_beyond_its_timeout(log: txn_core.Log, clock: FakeClock) -> None:
    dead = tx(log, timeout=5_000)
    dead.begin_transaction()
    send(dead, [1, 2], partition=0)
    dead.flush()
    plain = log.producer()
    send(plain, [3], partition=0)
    plain.flush()
    assert ids(log) == []
    clock.now += 4_000
    assert ids(log) == []  # still within its timeout
    clock.now += 2_000
    assert ids(log) == [3]  # the reader aborted it
    st = log.coordinator.state("tx")
    assert st is not None and st.state == CoordinatorState.COMPLETE_ABORT and st.abort_reason == "timeout"
    with pytest.raises(TransactionTimedOutError, match="exceeded its timeout of 5000 ms"):
        dead.commit_transaction()


def test_an_abort_after_a_reader_timed_the_transaction_out_says_so(log: txn_core.Log, clock: FakeClock) -> None:
    """The application gives up on a transaction a reader has already aborted for its timeout: the abort
    says why the producer is fenced (TransactionTimedOutError, what an application restarts on), not a bare
    fencing."""
    slow = tx(log, timeout=1_000)
    slow.begin_transaction()
    send(slow, [1], partition=0)
    slow.flush()
    clock.now += 1_500
    assert ids(log) == []  # the reader aborts it
    with pytest.raises(TransactionTimedOutError, match="exceeded its timeout of 1000 ms"):
        slow.abort_transaction()


def test_a_commit_after_the_timeout_nobody_else_noticed_aborts_and_says_so(log: txn_core.Log, clock: FakeClock) -> None:
    """Nobody met the transaction while it ran past its timeout: its own commit used to succeed, though any
    reader looking a moment earlier would have aborted it. The producer's commit now records the abort a
    reader would have (fencing the producer, markers written) and raises TransactionTimedOutError."""
    slow = tx(log, timeout=1_000)
    slow.begin_transaction()
    send(slow, [1, 2], partition=0)
    slow.flush()
    clock.now += 1_500
    with pytest.raises(TransactionTimedOutError, match=r"1000 ms \(it was 500 ms past its deadline when its commit"):
        slow.commit_transaction()
    st = log.coordinator.state("tx")
    assert st is not None and st.state == CoordinatorState.COMPLETE_ABORT and st.abort_reason == "timeout"
    assert ids(log) == [] and ids(log, "read_uncommitted") == [1, 2]
    assert log.describe_topic("t").partitions[0].aborted_transactions == 1, "its abort marker was written"
    with pytest.raises(ProducerFencedError):
        slow.begin_transaction()

    within = tx(log, "within", timeout=1_000)
    within.begin_transaction()
    send(within, [3], partition=0)
    clock.now += 900
    within.commit_transaction()  # within its timeout: committed as before
    assert ids(log) == [3]


def test_expire_transactions_aborts_every_late_one(log: txn_core.Log, clock: FakeClock) -> None:
    for i in range(4):
        p = tx(log, f"late-{i}", timeout=1_000)
        p.begin_transaction()
        send(p, [i])
        p.flush()
    clock.now += 2_000
    assert log.expire_transactions() == 4
    assert log.list_transactions() == []


# --- state machines ---------------------------------------------------------------------------


def test_invalid_client_transitions_name_the_id_and_both_states(log: txn_core.Log) -> None:
    p = log.producer("sm")
    with pytest.raises(InvalidTxnStateError, match=r"'sm': invalid producer transition Uninitialized -> InTransaction"):
        p.begin_transaction()
    with pytest.raises(InvalidTxnStateError, match="init_transactions"):
        send(p, [1])
    p.init_transactions()
    p.begin_transaction()
    with pytest.raises(InvalidTxnStateError, match="InTransaction -> InTransaction"):
        p.begin_transaction()
    p.commit_transaction()
    with pytest.raises(InvalidTxnStateError, match="Ready -> CommittingTransaction"):
        p.commit_transaction()
    with pytest.raises(InvalidTxnStateError, match="needs a transactional producer"):
        log.producer().begin_transaction()


@pytest.mark.parametrize("target", list(CoordinatorState))
def test_coordinator_transition_table_is_enforced(target: CoordinatorState) -> None:
    for current in [None, *CoordinatorState]:
        if current in COORDINATOR_TRANSITIONS[target]:
            check_coordinator_transition("x", current, target)
        else:
            with pytest.raises(InvalidTxnStateError, match=f"'x': invalid coordinator transition .* -> {target.value}"):
                check_coordinator_transition("x", current, target)


@pytest.mark.parametrize("target", list(ClientState))
def test_client_transition_table_is_enforced(target: ClientState) -> None:
    for current in ClientState:
        if current in CLIENT_TRANSITIONS[target]:
            check_client_transition("x", current, target)
        else:
            with pytest.raises(InvalidTxnStateError):
                check_client_transition("x", current, target)


# --- admin ------------------------------------------------------------------------------------


def test_admin_lists_describes_and_aborts(log: txn_core.Log, clock: FakeClock) -> None:
    p = tx(log, "hang", timeout=60_000)
    p.begin_transaction()
    send(p, [1, 2, 3], partition=2)
    p.flush()
    listing = log.list_transactions()
    assert [(t.transactional_id, t.state) for t in listing] == [("hang", "Ongoing")]
    clock.now += 1_234
    d = log.describe_transaction("hang")
    assert d.participants == ("topics/t/00002",) and d.age_ms == 1_234 and d.state == "Ongoing"
    assert log.find_hanging_transactions(max_age_ms=1_000)[0].txn == p.transaction_id
    assert log.find_hanging_transactions(max_age_ms=10_000) == []
    result = log.abort_transaction("hang")
    assert result.state == "CompleteAbort" and result.abort_reason == "aborted by an operator"
    with pytest.raises(ProducerFencedError):
        p.commit_transaction()
    part = log.describe_topic("t").partitions[2]
    assert part.last_stable_offset == part.log_end_offset


def test_find_hanging_reports_data_the_coordinator_never_registered(log: txn_core.Log) -> None:
    """A transaction wrote to a partition it never registered, then ended: that partition has no marker."""
    p = tx(log)
    p.begin_transaction()
    send(p, [1], partition=0)
    p.flush()
    txn = p.transaction_id
    append_data(log, "t", 1, pa.record_batch({"id": [2]}), SCHEMA, producer_id=p.producer_id, epoch=p.epoch, txn=txn)
    p.commit_transaction()
    p.wait_for_completion()
    hanging = log.find_hanging_transactions("t")
    assert [(h.topic_partition.partition, h.txn) for h in hanging] == [(1, txn)]
    # Readers are not stalled by it, and never see it: data in a partition the transaction did not
    # register is not part of the transaction, before and after its markers alike.
    assert ids(log) == [1]
    d = log.describe_topic("t").partitions[1]
    assert d.last_stable_offset == d.log_end_offset


def test_data_in_an_unregistered_partition_is_never_visible(log: txn_core.Log) -> None:
    """Prepared or complete, data a transaction wrote where it never registered stays invisible."""
    p = tx(log)
    p.begin_transaction()
    send(p, [1], partition=0)
    p.flush()
    txn = p.transaction_id
    assert txn is not None
    append_data(
        log,
        "t",
        1,
        pa.record_batch({"id": [2]}),
        SCHEMA,
        producer_id=p.producer_id,
        epoch=p.epoch,
        txn=txn,
    )
    prepared = log.coordinator.end("tx", p.producer_id, p.epoch, txn, True, complete=False)
    assert ids(txn_core.Log(log.storage, clock=log.clock)) == [1]
    log.coordinator.complete(prepared)
    assert ids(txn_core.Log(log.storage, clock=log.clock)) == [1]


def test_a_write_after_the_commit_marker_is_dropped_even_when_forgotten(
    log: txn_core.Log, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A zombie write landing after its transaction's commit marker, read by a buffer that no longer
    remembers that transaction ended, is still dropped (the coordinator says finished; no marker follows)."""
    import txn_core.partition.buffer as buffer_module

    p = tx(log)
    p.begin_transaction()
    send(p, [1], partition=0)
    p.commit_transaction()
    p.wait_for_completion()
    txn, epoch = log.coordinator.state("tx").txn, p.epoch - 1  # type: ignore[union-attr]
    append_data(
        log,
        "t",
        0,
        pa.record_batch({"id": [666]}),
        SCHEMA,
        producer_id=p.producer_id,
        epoch=epoch,
        txn=txn,
        base_sequence=-1,
    )
    monkeypatch.setattr(buffer_module, "ENDED_CACHE", 0)  # the buffer forgets ended transactions at once
    assert ids(txn_core.Log(log.storage, clock=log.clock)) == [1]


def test_describe_after_a_timeout_abort_reports_the_final_state_at_once(log: txn_core.Log, clock: FakeClock) -> None:
    p = tx(log, timeout=1_000)
    p.begin_transaction()
    send(p, [1], partition=0)
    p.flush()
    assert log.describe_topic("t").partitions[0].ongoing_transactions[0].state == "Ongoing"
    clock.now += 5_000
    d = log.describe_topic("t").partitions[0]  # deciding aborts it; the description includes the marker
    assert d.ongoing_transactions == () and d.last_stable_offset == d.log_end_offset == 2
    assert d.aborted_transactions == 1


def test_an_operator_can_abort_a_hanging_transaction_in_one_partition(log: txn_core.Log) -> None:
    p = tx(log)
    p.begin_transaction()
    send(p, [1], partition=0)
    p.flush()
    append_data(
        log,
        "t",
        1,
        pa.record_batch({"id": [2]}),
        SCHEMA,
        producer_id=p.producer_id,
        epoch=p.epoch,
        txn=p.transaction_id,
    )
    txn = p.transaction_id
    assert txn is not None
    with pytest.raises(txn_core.ConfigurationError, match=r"still ongoing .* transactional id 'tx'"):
        log.abort_hanging_transaction("t", 1, txn)
    p.commit_transaction()
    p.wait_for_completion()
    assert len(log.find_hanging_transactions("t")) == 1
    offset = log.abort_hanging_transaction("t", 1, txn)
    assert offset == 1
    assert log.find_hanging_transactions("t") == []
    assert ids(log) == [1]
    with pytest.raises(txn_core.ConfigurationError, match="holds no data without a marker"):
        log.abort_hanging_transaction("t", 1, txn)


def test_resuming_from_a_group_waits_for_its_open_offset_transaction(log: txn_core.Log, clock: FakeClock) -> None:
    """Kafka's require_stable: offsets pending in an open transaction are neither returned nor skipped."""
    first = tx(log, "copier")
    first.begin_transaction()
    first.send_offsets_to_transaction({("in", 0): 10}, "g")
    first.commit_transaction()
    first.begin_transaction()
    first.send_offsets_to_transaction({("in", 0): 20}, "g")
    first.flush()
    tp = txn_core.TopicPartition("in", 0)
    assert log.groups.committed("g")[tp].offset == 10  # read_committed view: the open one is invisible
    with pytest.raises(txn_core.UnstableOffsetsError, match=r"pending in open transaction .* .copier."):
        log.groups.committed("g", require_stable=True, timeout_s=0.2)
    first.commit_transaction()
    assert log.groups.committed("g", require_stable=True, timeout_s=5)[tp].offset == 20


def test_a_failing_coordinator_snapshot_never_fails_the_committed_append(monkeypatch: pytest.MonkeyPatch) -> None:
    """Snapshot maintenance runs after the record landed: a store that fails it (any error) costs the
    snapshot, never the append, and the next record tries the snapshot again."""
    from txn_core.coordinator import snapshots
    from txn_core.storage.base import DelegatingStorage

    class NoSnapshots(DelegatingStorage):
        failures = 0

        def create(self, key: str, chunks: Any) -> None:
            if "/snapshots/" in key and key.startswith("_txnlog/coordinators/"):
                NoSnapshots.failures += 1
                raise (txn_core.StorageError if NoSnapshots.failures % 2 else RuntimeError)("injected")
            self.inner.create(key, chunks)

    monkeypatch.setattr(snapshots, "SNAPSHOT_EVERY", 2)
    inner = MemoryStorage(uuid.uuid4().hex)
    log = txn_core.Log(NoSnapshots(inner))
    log.create_topic("t", 1, SCHEMA)
    p = log.producer("snap")
    p.init_transactions()
    for i in range(4):
        p.begin_transaction()
        p.send("t", pa.table({"id": [i]}), partition=0)
        p.commit_transaction()  # every record is a snapshot point: each one fails, none fails the commit
        p.wait_for_completion()
    p.close()
    assert NoSnapshots.failures >= 3
    assert ids(txn_core.Log(inner), parts=1) == [0, 1, 2, 3]


def _committed_three(url: str) -> tuple[txn_core.Log, int]:
    """Three committed transactions of id ``w``; returns the log and w's coordinator partition."""
    from txn_core.coordinator.service import coordinator_for

    log = txn_core.open_log(url)
    log.create_topic("t", 1, SCHEMA)
    with log.producer("w") as p:
        p.init_transactions()
        for i in range(3):
            p.begin_transaction()
            p.send("t", pa.table({"id": [i]}), partition=0)
            p.commit_transaction()
    return log, coordinator_for("w", log.coordinator_partitions)


def test_a_deleted_transaction_log_record_is_damage_and_nothing_is_written_into_its_slot() -> None:
    """A coordinator record deleted by hand (or lost by the store) with later records present: replay took the
    missing slot for the end, showed a stale state, and the next ``init_transactions`` created a different
    record there (a restore from backup then impossible) before failing on the intact record after it.
    Now every fresh view fails naming the missing record and the way out, and nothing is appended."""
    url = f"memory://{uuid.uuid4().hex}"
    log, c = _committed_three(url)
    slots = log.views.get(c).slots
    hole = 2
    before = log.storage.read(slots.key(hole))
    log.storage.delete(slots.key(hole))
    assert slots.exists(hole + 1), "the case this test is about: later records exist"

    fresh = txn_core.open_log(url)
    with pytest.raises(txn_core.CorruptDataError) as failed:
        fresh.producer("w").init_transactions()
    message = str(failed.value)
    assert slots.key(hole) in message and "missing" in message and "restored from a backup" in message
    assert not slots.exists(hole), "nothing was written into the hole"
    with pytest.raises(txn_core.CorruptDataError, match="missing"):
        txn_core.open_log(url).describe_transaction("w")

    log.storage.create(slots.key(hole), [before])  # restored from a backup: everything works again
    with txn_core.open_log(url).producer("w") as p:
        p.init_transactions()
        p.begin_transaction()
        p.send("t", pa.table({"id": [3]}), partition=0)
        p.commit_transaction()
    assert ids(txn_core.open_log(url), parts=1) == [0, 1, 2, 3]


def test_a_record_created_between_the_miss_and_the_probe_is_not_a_hole() -> None:
    """A refresh reads slot n (missing) while another writer creates n and n + 1: the probe of n + 1 sees it.
    Only a second read of n, asked after n + 1 was seen, tells a race from a hole."""
    from txn_core.storage.base import DelegatingStorage

    url = f"memory://{uuid.uuid4().hex}"
    log, c = _committed_three(url)
    key = log.views.get(c).slots.key(2)

    class LateFirstRead(DelegatingStorage):
        missed = False

        def read(self, k: str, start: int | None = None, end: int | None = None) -> bytes:
            if k == key and not LateFirstRead.missed:
                LateFirstRead.missed = True  # as if the read had been answered before the record landed
                raise txn_core.ObjectNotFoundError(f"{k} does not exist", k)
            return self.inner.read(k, start, end)

    racing = txn_core.Log(LateFirstRead(log.storage))
    described = racing.describe_transaction("w")
    assert LateFirstRead.missed
    assert described.state == "CompleteCommit", described


def test_a_hole_below_an_unreadable_newest_snapshot_is_reported_not_reloaded_for_ever() -> None:
    """A record missing between two snapshots, the newer one unreadable: the listing's newer snapshot said
    "compaction", the reload fell back to the older one below the hole, and the refresh went round for ever
    holding the view's lock. One reload per missing slot; then the hole is reported."""
    from txn_core.format import paths

    url = f"memory://{uuid.uuid4().hex}"
    log, c = _committed_three(url)
    view = log.views.get(c)
    older = view.snapshot_now()
    with log.producer("w") as p:
        p.init_transactions()
        for i in range(3, 6):
            p.begin_transaction()
            p.send("t", pa.table({"id": [i]}), partition=0)
            p.commit_transaction()
    newer = view.snapshot_now()
    key = paths.coordinator_snapshots(c) + paths.slot_name(newer)
    data = bytearray(log.storage.read(key))
    data[-5] ^= 1
    log.storage.delete(key)
    log.storage.create(key, [bytes(data)])
    log.storage.delete(view.slots.key(older + 2))

    outcome: list[BaseException] = []

    def describe() -> None:
        try:
            txn_core.open_log(url).describe_transaction("w")
        except txn_core.CorruptDataError as exc:
            outcome.append(exc)

    worker = threading.Thread(target=describe, daemon=True)
    worker.start()
    worker.join(30)
    assert not worker.is_alive(), "the refresh went round for ever"
    assert outcome and view.slots.key(older + 2) in str(outcome[0]) and "missing" in str(outcome[0])
