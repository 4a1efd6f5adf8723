"""One injected clock: every time txnlog writes or compares comes from the clock the log was opened with
(``txn_core.clock``), so a fake clock drives groups, snapshots, topics and every cache's staleness."""

from __future__ import annotations

import uuid

import pyarrow as pa
from fakeclock import FakeClock

import txn_core
from txn_core.format import envelope, paths
from txn_core.partition.snapshots import SNAPSHOT_EVERY_MS, SNAPSHOT_MIN_ENTRIES
from txn_core.storage import MemoryStorage

SCHEMA = pa.schema([("id", pa.int64())])


def _log(clock: FakeClock) -> txn_core.Log:
    return txn_core.Log(MemoryStorage(uuid.uuid4().hex), clock=clock)


def test_topics_are_stamped_with_the_logs_clock() -> None:
    clock = FakeClock(1_234_567_000)
    log = _log(clock)
    assert log.create_topic("t", 1, SCHEMA).created_ms == 1_234_567_000
    assert log.topics.get("t").created_ms == 1_234_567_000
    fmt = envelope.read_json(log.storage, paths.FORMAT_KEY, envelope.ObjectKind.FORMAT)
    assert fmt["created_ms"] == 1_234_567_000


def test_group_offsets_are_stamped_with_the_logs_clock_in_and_out_of_transactions() -> None:
    clock = FakeClock(1_800_000_000_000)
    log = _log(clock)
    log.create_topic("t", 1, SCHEMA)
    log.groups.commit("g", {("t", 0): 3})
    assert log.groups.committed("g")[txn_core.TopicPartition("t", 0)].commit_ms == clock.now
    clock.now += 5_000
    p = log.producer("tx")
    p.init_transactions()
    p.begin_transaction()
    p.send_offsets_to_transaction({("t", 0): 9}, "g")
    p.commit_transaction()
    p.close()
    assert log.groups.committed("g")[txn_core.TopicPartition("t", 0)].commit_ms == clock.now


def test_a_buffer_snapshot_falls_due_by_the_logs_clock() -> None:
    """A partition that saw a few entries is snapshotted once the log's clock says the snapshot age
    passed, not the machine's: nothing is written while the fake clock stands still."""
    clock = FakeClock()
    log = _log(clock)
    log.create_topic("t", 1, SCHEMA)
    p = log.producer()
    for i in range(SNAPSHOT_MIN_ENTRIES):
        p.send("t", pa.table({"id": [i]}, schema=SCHEMA), partition=0)
        p.flush()
    path = paths.partition_log_path("t", 0)

    state = log.partition_state(path)

    def finals() -> list[str]:  # after the snapshot written behind the scan (PROTOCOL.md "Snapshots")
        return [paths.slot_name(pos) for pos in state.snapshots.finals()]

    state.scan_to_end()
    first = finals()
    p.send("t", pa.table({"id": [-1]}, schema=SCHEMA), partition=0)
    p.flush()
    state.scan_to_end()
    assert finals() == first, "no snapshot while the clock stands still"
    clock.now += SNAPSHOT_EVERY_MS + 1
    for i in range(SNAPSHOT_MIN_ENTRIES):
        p.send("t", pa.table({"id": [i]}, schema=SCHEMA), partition=0)
        p.flush()
    state.scan_to_end()
    newest = max(finals())
    snap = envelope.read_json(log.storage, paths.buffer_snapshots(path) + newest, envelope.ObjectKind.BUFFER_SNAPSHOT)
    assert len(finals()) > len(first) and snap["time_ms"] == clock.now
    p.close()


def test_a_fake_clock_ages_process_caches_too() -> None:
    """The clock's monotonic time ages a partition's cached log start: moving the fake clock past the
    re-check interval makes the next lookup read the start again (one LIST)."""
    from txn_core.partition.partition import LOG_START_RECHECK_S

    clock = FakeClock()
    log = _log(clock)
    log.create_topic("t", 1, SCHEMA)
    plog = log.partition_log(paths.partition_log_path("t", 0))
    plog.recent_log_start()
    checked = plog._start_checked
    plog.recent_log_start()
    assert plog._start_checked == checked, "fresh: not re-read"
    clock.now += int(LOG_START_RECHECK_S * 1000) + 1
    plog.recent_log_start()
    assert plog._start_checked == clock.monotonic()
