"""State that would otherwise only grow is bounded: idle producer states expire by log time
(PROTOCOL.md "Idempotence"), deterministically, so snapshots stay interchangeable; finished transactional
ids expire too (PROTOCOL.md "Transaction log"), so the snapshot objects of the transaction log and of a
partition stop growing under a steady stream of one-shot writers (PROTOCOL.md "Snapshots")."""

from __future__ import annotations

import uuid
from pathlib import Path

import pyarrow as pa
import pytest

import txn_core
from txn_core.format import paths
from txn_core.format.entry import EntryKind, crc32, encode_arrow
from txn_core.partition.sequences import PRODUCER_STATE_RETENTION_MS

SCHEMA = pa.schema([("x", pa.int64())])
HOUR = 3600 * 1000
PATH = paths.partition_log_path("t", 0)


def append(log: txn_core.Log, producer_id: int, sequence: int, ts: int) -> None:
    payload = encode_arrow([pa.record_batch([pa.array([producer_id], pa.int64())], schema=SCHEMA)], SCHEMA).to_pybytes()
    log.partition_log("topics/t/00000").append(
        EntryKind.DATA,
        payload,
        len(payload),
        crc32(payload),
        1,
        producer_id=producer_id,
        base_sequence=sequence,
        timestamp_ms=ts,
    )


def producers(log: txn_core.Log) -> list[int]:
    state = log.partition_state("topics/t/00000", shared=False)
    state.scan_to_end()
    return sorted(state.buffer.producers.producers)


def test_idle_producer_states_are_dropped_after_a_day_of_log_time(tmp_path: Path) -> None:
    t0 = 1_800_000_000_000
    with txn_core.open_log(f"file://{tmp_path}/log") as log:
        log.create_topic("t", 1, SCHEMA)
        for pid in range(40):
            append(log, pid, 0, t0 + pid)
        assert producers(log) == list(range(40))
        append(log, 7, 1, t0 + 10 * HOUR)  # producer 7 stays active
        assert producers(log) == list(range(40)), "kept for a day"
        append(log, 100, 0, t0 + PRODUCER_STATE_RETENTION_MS + 3 * HOUR)
        assert producers(log) == [7, 100], "the 38 idle for more than a day are gone; 40 kept forever before"

        state = log.partition_state("topics/t/00000", shared=False)
        state.scan_to_end()
        state.snapshots.write(state.buffer, 0)  # a snapshot holds only the live states
        reloaded = log.partition_state("topics/t/00000", shared=False)
        assert sorted(reloaded.buffer.producers.producers) == [7, 100]
        assert reloaded.buffer.log_time_ms == state.buffer.log_time_ms


def test_finished_transactional_ids_expire_but_application_progress_is_kept() -> None:
    """10,000 one-shot producers over 28 days of a fake clock: the coordinator's state and snapshots hold
    the last week's ids only (the snapshots stop growing), while an id whose commit metadata is an
    application's progress (the Spark sink's streaming queries) is kept however long it is idle."""
    from fakeclock import FakeClock

    from txn_core.coordinator.txnlog import TID_EXPIRATION_MS

    clock = FakeClock(1_800_000_000_000)
    url = f"memory://{uuid.uuid4().hex}"
    log = txn_core.open_log(url, clock=clock, coordinator_partitions=1)
    log.create_topic("t", 1, SCHEMA)
    keeper = log.producer("stream-query", transaction_timeout_ms=60_000)
    keeper.init_transactions()
    keeper.begin_transaction()
    keeper.send("t", pa.table({"x": [1]}, schema=SCHEMA))
    keeper.commit_transaction(metadata={"query_id": "q", "batch_id": 41})
    keeper.close()
    once = log.producer("batch-write-1")
    once.init_transactions()
    once.begin_transaction()
    once.send("t", pa.table({"x": [2]}, schema=SCHEMA))
    once.commit_transaction(metadata={"write_id": "w1", "ephemeral": True})
    once.close()

    view = log.views.get(0)
    sizes = []
    for i in range(10_000):
        clock.now += 4 * 60 * 1000  # 28 days in all
        log.coordinator.init_producer(f"spark-write-{i}", 60_000)
        if i % 2_500 == 2_499:
            view.snapshot_now()
            sizes.append(len(view.tids))
    week = TID_EXPIRATION_MS // (4 * 60 * 1000)
    assert sizes[0] == 2_500 + 2 and max(sizes[1:]) <= week + 16, sizes  # bounded by a week of ids
    assert sizes[-1] <= sizes[1] + 16, f"the state stopped growing: {sizes}"
    assert view.state("stream-query") is not None, "application progress is never expired"
    assert log.transaction_metadata("stream-query") == {"query_id": "q", "batch_id": 41}
    assert view.state("batch-write-1") is None and view.state("spark-write-0") is None

    fresh = txn_core.open_log(url, clock=clock)  # replay from the snapshot: the same state
    fresh_view = fresh.views.get(0)
    fresh_view.refresh()
    assert sorted(fresh_view.tids) == sorted(view.tids)

    again = fresh.producer("spark-write-0")  # an expired id starts afresh
    again.init_transactions()
    again.close()


def _snapshot_sizes(log: txn_core.Log) -> tuple[int, int]:
    """Bytes of a coordinator snapshot and of a partition-buffer snapshot's final object written now."""
    view = log.views.get(0)
    coordinator = paths.coordinator_snapshots(0) + paths.slot_name(view.snapshot_now())
    state = log.partition_state(PATH, shared=False)
    state.scan_to_end()
    final = paths.buffer_snapshots(PATH) + paths.slot_name(state.snapshots.write(state.buffer.copy(), 0))
    return log.storage.size(coordinator), log.storage.size(final)


@pytest.mark.slow
def test_snapshots_stop_growing_under_10000_one_shot_transactional_writers(monkeypatch: pytest.MonkeyPatch) -> None:
    """10,000 one-shot transactional writers (what Spark batch writes are: each commits once, its progress
    marked ephemeral) over 28 days of log time, each committing one record to one partition, through real
    producers. Everything the coordinator snapshot and the partition's buffer snapshot hold is bounded:
    finished ids by a week of log time and producer states by a day (the real values), the recent outcomes
    and ended transactions by counts (``RECENT_OUTCOMES``, ``ENDED_KEPT``), lowered here so that 10,000
    transactions cross them. Both snapshot objects grow for the first week, then stop."""
    from fakeclock import FakeClock

    from txn_core.coordinator import txnlog
    from txn_core.partition import snapshots

    monkeypatch.setattr(txnlog, "RECENT_OUTCOMES", 1_000)
    monkeypatch.setattr(snapshots, "ENDED_KEPT", 1_000)
    clock = FakeClock(1_800_000_000_000)
    log = txn_core.open_log(f"memory://{uuid.uuid4().hex}", clock=clock, coordinator_partitions=1)
    log.create_topic("t", 1, SCHEMA)
    sizes: dict[int, tuple[int, int]] = {}
    for i in range(1, 10_001):
        clock.now += 4 * 60 * 1000  # 28 days in all: 2,500 writers a week
        writer = log.producer(f"spark-write-{i}")
        writer.init_transactions()
        writer.begin_transaction()
        writer.send("t", pa.table({"x": [i]}, schema=SCHEMA), partition=0)
        writer.commit_transaction(metadata={"write_id": f"w-{i}", "ephemeral": True})
        writer.close()
        if i in (250, 2_500, 5_000, 7_500, 10_000):
            sizes[i] = _snapshot_sizes(log)
    coordinator = {i: c for i, (c, _) in sizes.items()}
    partition = {i: b for i, (_, b) in sizes.items()}
    assert coordinator[2_500] > 2 * coordinator[250] and partition[2_500] > 2 * partition[250], sizes
    # Weeks 3 and 4 are no larger than week 2 but for the digits numbers gain as offsets and transaction
    # sequences grow (a logarithmic few percent; growth with the writers would double them).
    for week in (7_500, 10_000):
        assert coordinator[week] <= coordinator[5_000] * 1.1, f"the coordinator snapshot grew: {coordinator}"
        assert partition[week] <= partition[5_000] * 1.1, f"the buffer snapshot grew: {partition}"
    fresh = txn_core.open_log(log.url, clock=clock)  # and reading from the snapshots sees every record
    consumer = fresh.consumer()
    consumer.assign([("t", 0)])
    seen: list[int] = []
    while (table := consumer.poll()).num_rows:
        seen.extend(table.column("x").to_pylist())
    assert seen == list(range(1, 10_001))


def test_a_partition_touched_by_10000_idempotent_producers_keeps_a_bounded_buffer_snapshot() -> None:
    """10,000 idempotent producers (a fresh producer id each) append one record each to one partition over
    ten days of log time: the buffer snapshot holds the producer states of the last day only, so its size
    stops growing after the first day."""
    from fakeclock import FakeClock

    clock = FakeClock(1_800_000_000_000)
    log = txn_core.open_log(f"memory://{uuid.uuid4().hex}", clock=clock, coordinator_partitions=1)
    log.create_topic("t", 1, SCHEMA)
    sizes: dict[int, int] = {}
    producers: dict[int, int] = {}
    for i in range(1, 10_001):
        clock.now += 86_400  # ten days in all: 1,000 producers a day
        with log.producer() as producer:
            producer.send("t", pa.table({"x": [i]}, schema=SCHEMA), partition=0)
        if i % 1_000 == 0:
            state = log.partition_state(PATH, shared=False)
            state.scan_to_end()
            producers[i // 1_000] = len(state.buffer.producers.producers)
            final = paths.buffer_snapshots(PATH) + paths.slot_name(state.snapshots.write(state.buffer.copy(), 0))
            sizes[i // 1_000] = log.storage.size(final)
    assert producers[1] == 1_000 and max(producers.values()) <= 1_000 + 50, producers  # a day and an hour
    assert all(sizes[day] <= sizes[2] * 1.05 for day in range(3, 11)), f"the buffer snapshot grew: {sizes}"
