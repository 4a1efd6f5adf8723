"""Retention, snapshots on demand, transaction-log compaction and staged-data cleanup.

Each test runs on the in-memory store and, in the ``seaweedfs`` tier, on a real S3 server: maintenance lists
and deletes objects, and judges staged objects' age by the store's own modification times.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest
from damaging import damage_segment_payload
from fakeclock import FakeClock

import txn_core
from conftest import make_location
from txn_core.clients.consumer import Consumer
from txn_core.clock import system_clock
from txn_core.coordinator.service import coordinator_for
from txn_core.errors import ConfigurationError, DataLossError
from txn_core.format import paths
from txn_core.format.entry import EntryKind
from txn_core.ops import maintenance
from txn_core.ops.rolling import BackgroundRoller, RollPolicy
from txn_core.partition import staging
from txn_core.partition.partition import PartitionLog
from txn_core.storage import MemoryStorage, Storage, open_storage

SCHEMA = pa.schema([("id", pa.int64())])


@pytest.fixture(params=["memory", pytest.param("seaweedfs", marks=pytest.mark.seaweedfs)])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Storage:
    """A fresh, empty store: in memory, or a new prefix on SeaweedFS."""
    if request.param == "memory":
        return MemoryStorage(uuid.uuid4().hex)
    location = make_location("seaweedfs", request, tmp_path)
    return open_storage(location.url, location.storage_options)


def _entries(log: txn_core.Log, clock: FakeClock, n: int, start: int = 0) -> None:
    p = log.producer()
    for i in range(start, start + n):
        p.send("t", pa.table({"id": [i]}), partition=0)
        p.flush()


def _read(log: txn_core.Log) -> list[int]:
    c = log.consumer()
    c.assign([("t", 0)])
    out: list[int] = []
    while (got := c.poll()).num_rows:
        out.extend(got.column("id").to_pylist())
    return out


def test_retention_by_age_moves_the_log_start_and_deletes_entries(storage: Storage) -> None:
    clock = FakeClock(2_000_000_000_000)
    log = txn_core.Log(storage, clock=clock)
    log.create_topic("t", 1, SCHEMA, retention_ms=60_000)
    _entries(log, clock, 10)
    clock.now = 10**15  # far later than every entry's timestamp
    result = maintenance.apply_retention(log, "t", min_age_ms=0, check_min_age=False)[0]
    assert (result.old_start, result.new_start, result.entries_deleted) == (0, 10, 10)
    d = log.describe_topic("t").partitions[0]
    assert (d.log_start_offset, d.log_end_offset) == (10, 10)
    assert _read(txn_core.Log(log.storage, clock=clock)) == []
    p = log.producer()
    p.send("t", pa.table({"id": [99]}), partition=0)
    p.flush()
    assert _read(txn_core.Log(log.storage, clock=clock)) == [99]
    assert len(log.storage.list(paths.entries(paths.partition_log_path("t", 0)))) == 1


def test_retention_by_size_keeps_the_newest_bytes(storage: Storage) -> None:
    clock = FakeClock(2_000_000_000_000)
    log = txn_core.Log(storage, clock=clock)
    log.create_topic("t", 1, SCHEMA)
    _entries(log, clock, 10)
    size = log.describe_topic("t").partitions[0].size_bytes
    maintenance.apply_retention(log, "t", retention_bytes=size // 2, min_age_ms=0, check_min_age=False)
    kept = _read(txn_core.Log(log.storage, clock=clock))
    assert kept == list(range(10 - len(kept), 10)) and 4 <= len(kept) <= 6


def test_retention_never_deletes_an_open_transaction_or_young_entries(storage: Storage) -> None:
    clock = FakeClock(2_000_000_000_000)
    log = txn_core.Log(storage, clock=clock)
    log.create_topic("t", 1, SCHEMA, retention_ms=1)
    _entries(log, clock, 3)
    p = log.producer("open", transaction_timeout_ms=900_000)
    p.init_transactions()
    p.begin_transaction()
    p.send("t", pa.table({"id": [100]}), partition=0)
    p.flush()
    _entries(log, clock, 3, start=3)
    assert maintenance.apply_retention(log, "t", min_age_ms=10**15)[0].entries_deleted == 0  # too young
    clock.now += 10_000  # every entry is past retention; the transaction is within its timeout
    result = maintenance.apply_retention(log, "t", min_age_ms=0, check_min_age=False)[0]
    assert result.new_start == 3  # stops at the open transaction's first offset
    p.commit_transaction()
    assert sorted(_read(txn_core.Log(log.storage, clock=clock))) == [3, 4, 5, 100]


def test_a_reader_behind_retention_gets_data_loss_not_silence(storage: Storage) -> None:
    clock = FakeClock(2_000_000_000_000)
    log = txn_core.Log(storage, clock=clock)
    log.create_topic("t", 1, SCHEMA, retention_ms=1)
    _entries(log, clock, 6)
    reader = txn_core.Log(log.storage, clock=clock)
    c = Consumer(reader, window_bytes=1)  # reads one entry ahead at most
    c.assign([("t", 0)])
    assert c.poll().column("id").to_pylist() == [0]
    assert c.poll().column("id").to_pylist() == [1]
    clock.now = 10**15
    _entries(log, clock, 2, start=6)
    maintenance.apply_retention(log, "t", retention_ms=10**14, min_age_ms=0, check_min_age=False)
    with pytest.raises(DataLossError, match="removed by retention"):
        for _ in range(10):
            c.poll()
            c._readers[txn_core.TopicPartition("t", 0)].log._start_checked = 0.0  # no 5 s wait in a test
    with pytest.raises(DataLossError, match="log starts at 6"):
        c.seek(("t", 0), 3)
    c.seek(("t", 0), 6)
    assert c.poll().column("id").to_pylist() + c.poll().column("id").to_pylist() == [6, 7]


def test_retention_needs_a_setting(storage: Storage) -> None:
    log = txn_core.Log(storage)
    log.create_topic("t", 1, SCHEMA)
    with pytest.raises(ConfigurationError, match="keeps everything"):
        maintenance.apply_retention(log, "t")


def test_transaction_log_compaction_keeps_state(storage: Storage) -> None:
    clock = FakeClock(2_000_000_000_000)
    log = txn_core.Log(storage, clock=clock)
    log.create_topic("t", 1, SCHEMA)
    p = log.producer("c1")
    p.init_transactions()
    for i in range(5):
        p.begin_transaction()
        p.send("t", pa.table({"id": [i]}), partition=0)
        p.commit_transaction(metadata={"n": i})
    p.close()
    deleted = maintenance.compact_transaction_log(log, min_age_ms=0, check_min_age=False)
    assert deleted > 0
    fresh = txn_core.Log(log.storage, clock=clock)
    assert fresh.transaction_metadata("c1") == {"n": 4}
    p2 = fresh.producer("c1")
    p2.init_transactions()  # continues from the compacted state (epoch bumped, not reset)
    assert p2.producer_id == p.producer_id and p2.epoch > p.epoch
    assert _read(fresh) == [0, 1, 2, 3, 4]


def test_staged_objects_nobody_references_are_swept(storage: Storage) -> None:
    clock = FakeClock(2_000_000_000_000)
    log = txn_core.Log(storage, clock=clock)
    log.create_topic("t", 1, SCHEMA)
    prefix = staging.staging_prefix("owner", 1)
    batch = pa.record_batch({"id": [1, 2]})
    kept = staging.write_staged(log.storage, prefix, "t", 0, [batch], SCHEMA, tag="a", clock=system_clock)
    orphan = staging.write_staged(log.storage, prefix, "t", 0, [batch], SCHEMA, tag="b", clock=system_clock)
    assert kept is not None and orphan is not None
    p = log.producer("st", marker_linger_ms=0)  # markers alone: two slots per transaction, as counted below
    p.init_transactions()
    p.begin_transaction()
    p.send_staged([kept])
    p.commit_transaction()
    p.close()
    assert maintenance.sweep_staging(log, older_than_ms=0, now_ms=10**15, check_min_age=False) == 1
    assert log.storage.exists(kept.key) and not log.storage.exists(orphan.key)
    assert _read(log) == [1, 2]


def _staged_committer(log: txn_core.Log) -> tuple[txn_core.Producer, Callable[[int], None]]:
    """A transactional producer, and ``commit(i)``: one transaction referencing a staged object of id ``i``."""
    p = log.producer("st", marker_linger_ms=0)  # markers alone: two slots per transaction, as counted below
    p.init_transactions()

    def commit(i: int) -> None:
        batch = pa.record_batch({"id": [i]})
        ref = staging.write_staged(
            log.storage, staging.staging_prefix("w", i), "t", 0, [batch], SCHEMA, clock=system_clock
        )
        assert ref is not None
        p.begin_transaction()
        p.send_staged([ref])
        p.commit_transaction()

    return p, commit


def _rolled_with_references(
    storage: Storage, clock: FakeClock
) -> tuple[txn_core.Log, txn_core.Producer, Callable[[int], None]]:
    """Topic ``t``: 40 committed references (80 slots, past every probe beyond slot 0), rolled."""
    log = txn_core.Log(storage, clock=clock)
    log.create_topic("t", 1, SCHEMA)
    p, commit = _staged_committer(log)
    for i in range(40):
        commit(i)
    p.wait_for_completion()
    clock.now += 10_000
    (rolled,) = maintenance.roll_segments(
        log, "t", policy=RollPolicy(entries=1, bytes=1), min_age_ms=0, check_min_age=False
    )
    assert rolled.chain_end == 80 and rolled.deleted_entries == 80
    return log, p, commit


def test_the_sweep_keeps_what_entries_past_the_segments_reference(storage: Storage) -> None:
    """A rolled partition has no loose entries below its segments' chain end. The sweep looks for references
    from there on: looking from the log start, it took the first rolled slot for the end of the log and
    deleted the staged objects of every committed entry after the segments."""
    clock = FakeClock(2_000_000_000_000)
    log, p, commit = _rolled_with_references(storage, clock)
    for i in range(40, 43):
        commit(i)
    p.close()
    assert maintenance.sweep_staging(log, older_than_ms=0, now_ms=10**15, check_min_age=False) == 0
    assert _read(txn_core.Log(log.storage, clock=clock)) == list(range(43))


def test_the_sweep_scans_again_when_retention_moves_the_log_start_under_it(
    storage: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Retention deletes the loose entries from the sweep's floor on between the sweep reading that floor
    and probing past it: the first deleted slot passes for the end of the log. The sweep sees the floor
    moved past that end and scans again from the new one."""
    clock = FakeClock(2_000_000_000_000)
    log = txn_core.Log(storage, clock=clock)
    log.create_topic("t", 1, SCHEMA)
    p, commit = _staged_committer(log)
    for i in range(40):  # slots 0..79: old
        commit(i)
    clock.now += 10**9
    for i in range(40, 45):  # slots 80..89: young, kept by retention
        commit(i)
    p.close()
    free_slot = PartitionLog.free_slot
    raced: list[object] = []

    def retention_first(plog: PartitionLog, lower: int) -> int:
        if not raced:
            raced.append(maintenance.apply_retention(log, "t", retention_ms=10**8, min_age_ms=0, check_min_age=False))
        return free_slot(plog, lower)

    monkeypatch.setattr(PartitionLog, "free_slot", retention_first)
    assert maintenance.sweep_staging(log, older_than_ms=0, now_ms=10**15, check_min_age=False) == 0
    monkeypatch.undo()
    assert raced and _read(txn_core.Log(log.storage, clock=clock)) == list(range(40, 45))


def test_the_sweep_keeps_the_staged_objects_of_a_partition_with_an_entry_marked_lost(storage: Storage) -> None:
    """A lost entry may have been a reference nobody can read now, also inside a segment, below the loose
    entries the sweep reads: every staged object of its partition stays."""
    clock = FakeClock(2_000_000_000_000)
    log, p, _ = _rolled_with_references(storage, clock)
    p.close()
    plog = log.partition_log(paths.partition_log_path("t", 0))
    slot = damage_segment_payload(
        log, plog.segments.key(0), lambda h: h.kind is EntryKind.DATA_REF and h.base_offset == 0
    )
    txn_core.Log(log.storage, clock=clock).mark_lost("t", 0, slot, reason="bit rot")
    orphan = staging.write_staged(
        log.storage,
        staging.staging_prefix("w", "x"),
        "t",
        0,
        [pa.record_batch({"id": [9]})],
        SCHEMA,
        clock=system_clock,
    )
    assert orphan is not None
    assert maintenance.sweep_staging(log, older_than_ms=0, now_ms=10**15, check_min_age=False) == 0
    assert log.storage.exists(orphan.key)


def test_a_fresh_process_sees_counts_and_sizes_after_retention(storage: Storage) -> None:
    clock = FakeClock(2_000_000_000_000)
    log = txn_core.Log(storage, clock=clock)
    log.create_topic("t", 1, SCHEMA)
    p = log.producer("r", marker_linger_ms=0)  # markers alone: two offsets per transaction
    p.init_transactions()
    for i in range(4):
        p.begin_transaction()
        p.send("t", pa.table({"id": [i]}), partition=0)
        p.flush()
        p.abort_transaction() if i % 2 else p.commit_transaction()
    p.close()
    before = log.describe_topic("t").partitions[0]
    assert before.aborted_transactions == 2 and before.size_bytes > 0
    clock.now += 10
    maintenance.apply_retention(log, "t", retention_ms=1, min_age_ms=0, check_min_age=False)
    after = txn_core.Log(log.storage, clock=clock).describe_topic("t").partitions[0]
    assert (after.log_start_offset, after.log_end_offset) == (8, 8)
    assert after.aborted_transactions == 0 and after.size_bytes == 0
    p2 = log.producer()
    p2.send("t", pa.table({"id": [9]}), partition=0)
    p2.flush()
    grown = txn_core.Log(log.storage, clock=clock).describe_topic("t").partitions[0]
    assert 0 < grown.size_bytes < before.size_bytes


def test_read_uncommitted_skips_aborted_staged_data_that_cleanup_removed(storage: Storage) -> None:
    from txn_core.partition.ranges import plan_range, read_range

    log = txn_core.Log(storage)
    log.create_topic("t", 1, SCHEMA)
    prefix = staging.staging_prefix("o", 1)
    ref = staging.write_staged(
        log.storage, prefix, "t", 0, [pa.record_batch({"id": [1, 2]})], SCHEMA, clock=system_clock
    )
    assert ref is not None
    p = log.producer("s")
    p.init_transactions()
    p.begin_transaction()
    p.send_staged([ref])
    p.abort_transaction()
    p.close()
    staging.delete_keys(log.storage, [ref.key])  # what the sink's abort does
    plain = log.producer()
    plain.send("t", pa.table({"id": [3]}), partition=0)
    plain.flush()
    c = log.consumer(isolation_level="read_uncommitted")
    c.assign([("t", 0)])
    assert c.poll().column("id").to_pylist() == [3]
    state = log.partition_state(paths.partition_log_path("t", 0), shared=False)
    state.scan_to_end()
    rng = plan_range(state, "t", 0, 0, state.buffer.position, "read_uncommitted")
    got = [i for b in read_range(log.partition_log(rng.path), rng) for i in b.column("id").to_pylist()]
    assert got == [3]


@pytest.mark.parametrize(
    ("run", "floor"),
    [
        (lambda log, age, check: maintenance.apply_retention(log, "t", min_age_ms=age, check_min_age=check), 120_000),
        (lambda log, age, check: maintenance.roll_segments(log, "t", min_age_ms=age, check_min_age=check), 120_000),
        (
            lambda log, age, check: maintenance.compact_transaction_log(log, min_age_ms=age, check_min_age=check),
            3_600_000,
        ),
        (lambda log, age, check: BackgroundRoller(log, min_age_ms=age, check_min_age=check), 120_000),
        (lambda log, age, check: maintenance.sweep_staging(log, older_than_ms=age, check_min_age=check), 3_600_000),
    ],
    ids=["retention", "roll", "compact", "background-roller", "sweep-staging"],
)
def test_a_minimum_age_below_the_stale_writer_bound_is_refused(run: Callable[..., object], floor: int) -> None:
    """A writer in another process trusts its cached tail for up to 60 s (a transaction-log slot it saw free
    for 30 min): deleting younger objects let its next append land in a deleted slot, where readers had
    passed (committed records skipped, a fenced producer's write seen). Below the bound the call is refused,
    naming the bound and the way out; at the bound, or told not to check, it runs."""
    log = txn_core.Log(MemoryStorage(uuid.uuid4().hex))
    log.create_topic("t", 1, SCHEMA, retention_ms=1)
    with pytest.raises(ConfigurationError) as refused:
        run(log, floor - 1, True)
    message = str(refused.value)
    assert f"below the safe {floor} ms" in message and "check_min_age=False" in message
    run(log, floor, True)
    run(log, 0, False)


def test_the_cli_refuses_a_minimum_age_below_the_bound_before_opening_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from txn_core import cli

    log = txn_core.open_log(str(tmp_path / "log"))
    log.create_topic("t", 1, SCHEMA, retention_ms=1)
    for verb, age, floor in (
        ("compact", "600000", "3600000"),
        ("roll", "0", "120000"),
        ("retention", "60000", "120000"),
        ("sweep-staging", "0", "3600000"),
    ):
        option = "--older-than-ms" if verb == "sweep-staging" else "--min-age-ms"
        assert cli.main(["maintenance", verb, str(tmp_path / "missing"), option, age]) == 1
        err = capsys.readouterr().err
        assert f"below the safe {floor} ms" in err and "--no-age-check" in err and "no txnlog" not in err, err
        assert cli.main(["maintenance", verb, str(tmp_path / "log"), option, age, "--no-age-check"]) == 0


#: What a slot directory may hold besides slots: a store's temporary file, an operator's note, a name int()
#: would take for a slot, one that sorts after every slot.
FOREIGN = (".tmp-3f2a", "+0000000000000000001", "zz-notes.txt")


def test_names_that_are_not_slots_are_neither_read_nor_deleted(storage: Storage) -> None:
    """Log starts, snapshots (buffer, coordinator, group) and lost-entry records are found by listing: a
    name there that is not 20 digits is not the log's. Readers ignore it (a note sorting after the newest
    log start was read as the log start: every reader failed), and maintenance never deletes it (it kept
    the note as the newest marker and deleted the real ones)."""
    clock = FakeClock(2_000_000_000_000)
    log = txn_core.Log(storage, clock=clock)
    log.create_topic("t", 1, SCHEMA)
    p = log.producer("c1")
    p.init_transactions()
    p.begin_transaction()
    p.send("t", pa.table({"id": [-1]}), partition=0)
    p.commit_transaction(metadata={"n": 1})
    p.close()
    _entries(log, clock, 6)  # offsets 2-7, after the transaction's entry and marker
    log.groups.commit("g", {("t", 0): 3})
    maintenance.take_snapshots(log, "t")
    coordinator = coordinator_for("c1", log.coordinator_partitions)
    log.coordinator.views.get(coordinator).snapshot_now()
    path = paths.partition_log_path("t", 0)
    dirs = [
        paths.log_start(path),
        paths.lost_entries(path),
        f"{path}/snapshots/",
        f"{paths.coordinator_root(0)}snapshots/",
        f"{paths.GROUPS}g/snapshots/",
    ]
    for d in dirs:
        for name in FOREIGN:
            storage.create(d + name, [b"not txnlog's"])
    for _ in range(2):  # twice: markers beyond the kept ones are deleted, never a foreign name
        clock.now += 10_000
        maintenance.apply_retention(log, "t", retention_ms=1, min_age_ms=0, check_min_age=False)
    _entries(log, clock, 2, start=6)
    fresh = txn_core.Log(storage, clock=clock)
    assert _read(fresh) == [6, 7]
    assert fresh.describe_partition("t", 0).log_start_offset == 8
    assert fresh.groups.committed("g")[txn_core.TopicPartition("t", 0)].offset == 3
    assert fresh.transaction_metadata("c1") == {"n": 1}
    for d in dirs:
        assert set(FOREIGN) <= set(storage.list(d)), d
