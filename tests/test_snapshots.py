"""Transaction-buffer snapshots: multi-part, never used half-written, verified, cost independent of history."""

from __future__ import annotations

import uuid

import pyarrow as pa
import pytest

import txn_core
from txn_core.clock import system_clock
from txn_core.format import envelope, paths
from txn_core.format.ids import TxnId
from txn_core.partition import snapshots
from txn_core.partition.buffer import TxnBuffer
from txn_core.partition.state import PartitionState
from txn_core.storage import MemoryStorage

SCHEMA = pa.schema([("id", pa.int64())])
PATH = paths.partition_log_path("t", 0)


def _aborting_log(n_aborted: int, n_committed: int = 0) -> txn_core.Log:
    log = txn_core.Log(MemoryStorage(uuid.uuid4().hex))
    log.create_topic("t", 1, SCHEMA)
    p = log.producer("ab")
    p.init_transactions()
    for i in range(n_aborted + n_committed):
        p.begin_transaction()
        p.send("t", pa.table({"id": [i]}), partition=0)
        p.flush()
        if i < n_aborted:
            p.abort_transaction()
        else:
            p.commit_transaction()
    p.close()
    return log


def _summary(b: TxnBuffer) -> tuple[object, ...]:
    return (
        b.position,
        b.slot,
        b.max_read_position,
        b.aborted.to_table().sort_by("txn").to_pylist(),
        b.skips.to_list(),
        b.producers.to_list(),
        b.committed_count,
        b.aborted_count,
    )


def test_large_aborted_set_is_split_into_parts_and_reloads_equal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(snapshots, "PART_ROWS", 4)
    log = _aborting_log(11, 2)
    state = log.partition_state(PATH)
    state.scan_to_end()
    store = snapshots.SnapshotStore(log.storage, PATH, clock=system_clock)
    store.write(state.buffer)
    names = log.storage.list(paths.buffer_snapshots(PATH) + "parts/")
    assert len(names) == 2  # 11 aborted rows: two sealed parts of 4, 3 rows inline in the final object
    loaded = snapshots.SnapshotStore(log.storage, PATH, clock=system_clock).load_latest(PATH)
    assert loaded is not None
    assert _summary(loaded) == _summary(state.buffer)
    loaded._check()


def test_a_snapshot_whose_final_object_is_missing_is_never_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """Crash after the parts, before the final object: the previous snapshot (or a replay) is used."""
    monkeypatch.setattr(snapshots, "PART_ROWS", 2)
    log = _aborting_log(6)
    state = log.partition_state(PATH)
    state.scan_to_end()
    store = snapshots.SnapshotStore(log.storage, PATH, clock=system_clock)
    first = store.write(state.buffer)
    p = log.producer("ab")
    p.init_transactions()
    for i in range(5):
        p.begin_transaction()
        p.send("t", pa.table({"id": [100 + i]}), partition=0)
        p.flush()
        p.abort_transaction()
    p.close()
    state.scan_to_end()

    real_create = envelope.create_json

    def crash_on_final(storage: object, key: str, kind: envelope.ObjectKind, value: dict) -> bool:  # type: ignore[type-arg]
        if kind == envelope.ObjectKind.BUFFER_SNAPSHOT:
            raise RuntimeError("crash before the final object")
        return real_create(storage, key, kind, value)  # type: ignore[arg-type]

    monkeypatch.setattr(envelope, "create_json", crash_on_final)
    with pytest.raises(RuntimeError):
        store.write(state.buffer)
    monkeypatch.setattr(envelope, "create_json", real_create)
    fresh = snapshots.SnapshotStore(log.storage, PATH, clock=system_clock)
    assert fresh.finals() == [first]
    rebuilt = PartitionState(
        txn_core.Log(log.storage).partition_log(PATH), log.coordinator.resolve, write_snapshots=False
    )
    rebuilt.scan_to_end()
    assert _summary(rebuilt.buffer) == _summary(state.buffer)


@pytest.mark.parametrize("damage", ["part", "final"])
def test_a_damaged_snapshot_falls_back_to_an_older_one_or_replay(damage: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(snapshots, "PART_ROWS", 2)
    log = _aborting_log(7)
    state = log.partition_state(PATH)
    state.scan_to_end()
    snapshots.SnapshotStore(log.storage, PATH, clock=system_clock).write(state.buffer)
    prefix = paths.buffer_snapshots(PATH)
    key = prefix + (
        "parts/" + log.storage.list(prefix + "parts/")[0]
        if damage == "part"
        else [n for n in log.storage.list(prefix) if not n.endswith("/")][-1]
    )
    data = bytearray(log.storage.read(key))
    data[-3] ^= 0xFF
    log.storage.delete(key)
    log.storage.create(key, [bytes(data)])
    assert snapshots.SnapshotStore(log.storage, PATH, clock=system_clock).load_latest(PATH) is None
    rebuilt = PartitionState(
        txn_core.Log(log.storage).partition_log(PATH), log.coordinator.resolve, write_snapshots=False
    )
    rebuilt.scan_to_end()
    assert _summary(rebuilt.buffer) == _summary(state.buffer)


def test_snapshots_are_taken_every_n_transactions(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(snapshots, "SNAPSHOT_EVERY_TXNS", 5)
    log = _aborting_log(0, 12)
    c = log.consumer()
    c.assign([("t", 0)])
    while c.poll().num_rows:
        pass
    finals = snapshots.SnapshotStore(log.storage, PATH, clock=system_clock).finals()
    assert finals, "a reader that crossed N transactions took a snapshot"
    assert len(finals) <= snapshots.SNAPSHOTS_KEPT


def test_rebuild_reads_the_snapshot_and_the_tail_not_the_history(monkeypatch: pytest.MonkeyPatch) -> None:
    """Cost independent of partition length: after a snapshot, rebuilding reads only entries after it."""
    log = _aborting_log(20, 20)
    state = log.partition_state(PATH)
    state.scan_to_end()
    snapshots.SnapshotStore(log.storage, PATH, clock=system_clock).write(state.buffer)

    reads: list[str] = []
    inner = log.storage

    class Counting(MemoryStorage):
        def read(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
            reads.append(key)
            return inner.read(key, start, end)

    counting = Counting(inner.name)  # type: ignore[attr-defined]
    fresh = PartitionState(txn_core.Log(counting).partition_log(PATH), log.coordinator.resolve, write_snapshots=False)
    fresh.scan_to_end()
    entry_reads = [k for k in reads if "/log/" in k and k.startswith("topics/")]
    assert len(entry_reads) <= 2, entry_reads  # the tail probe only
    assert _summary(fresh.buffer) == _summary(state.buffer)


def test_retention_drops_aborted_entries_whose_data_is_gone() -> None:
    b = TxnBuffer()
    b.aborted.add(TxnId(1, 5), 0, 3, 4)
    b.aborted.add(TxnId(1, 9), 10, 12, 20)
    b.prune(log_start=10)
    assert TxnId(1, 5) not in b.aborted and TxnId(1, 9) in b.aborted
