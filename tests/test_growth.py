"""State that would otherwise only grow is bounded: idle producer states expire by log time
(PROTOCOL.md "Idempotence"), deterministically, so snapshots stay interchangeable."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

import txn_core
from txn_core.entry import EntryKind, crc32, encode_arrow
from txn_core.producer_state import PRODUCER_STATE_RETENTION_MS

SCHEMA = pa.schema([("x", pa.int64())])
HOUR = 3600 * 1000


def append(log: txn_core.Log, producer_id: int, sequence: int, ts: int) -> None:
    payload = encode_arrow([pa.record_batch([pa.array([producer_id], pa.int64())], schema=SCHEMA)],
                           SCHEMA).to_pybytes()
    log.partition_log("topics/t/00000").append(EntryKind.DATA, payload, len(payload), crc32(payload), 1,
                                               producer_id=producer_id, base_sequence=sequence, timestamp_ms=ts)


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
