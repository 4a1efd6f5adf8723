"""Benchmark: the exactly-once txnlog -> txnlog stream copy on a real S3 server vs on local disk, and the storage
requests each committed micro-batch costs as partitions and rows grow.

Part 1, throughput. The same rows (``id`` LONG, ``key`` STRING of 1,000 distinct values, ``value`` STRING of
100 hex characters from 100,000 distinct values) are written once to a topic of ``PARTITIONS`` partitions on
local disk (``file://``) and on SeaweedFS (``s3://``, a real Go S3 server on 127.0.0.1; storage settings go
to Spark only as ``storage.*`` options), one input transaction per micro-batch. Each log is copied by a
streaming query (``Trigger.AvailableNow``, ``maxOffsetsPerTrigger`` = one input transaction, so both copies
run the same ``BATCHES`` micro-batches) into a new topic with ``consumerGroup``: every micro-batch is one
transaction committing the staged output by reference, the source offsets and the sink's progress. Copies
alternate between the backends, ``ROUNDS`` times; the table shows the best run of each.

Part 2, storage requests per committed micro-batch, for 2 and 8 partitions and two batch sizes (10k and 100k
rows). Counted two ways: the driver's commit alone (the sink's ``testing.stats`` hook: every request of
``commit(batchId)``), and every S3 request SeaweedFS served on the bench's bucket, from every process
(planning on the driver, reads and staged writes on executors, the commit), from its Prometheus metrics.
The second is marginal: a copy of 2B batches minus a copy of B batches, divided by B, so query start-up
cancels out. Input is one transaction per micro-batch with one entry per partition, and the copy keeps
the partitioning (no ``keyColumn``: task ``i`` stages one object for partition ``i``), so a batch touches
``P`` partitions with ``P`` objects whatever its row count. Expected: requests grow with partitions, not rows.

Nothing is asserted about time; row counts, group offsets and batch counts are checked.

Run (1M rows; a few minutes)::

    /work/venv/bin/pytest tests/bench_scale_out.py -m bench -s -p no:cacheprovider

Knobs: ``TXNLOG_BENCH_ROWS`` (part 1 rows, default 1,000,000), ``TXNLOG_BENCH_BATCHES`` (5),
``TXNLOG_BENCH_ROUNDS`` (2).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from test_scale_out import storage_flags

import txn_core

ROWS = int(os.environ.get("TXNLOG_BENCH_ROWS", "1000000"))
BATCHES = int(os.environ.get("TXNLOG_BENCH_BATCHES", "5"))
ROUNDS = int(os.environ.get("TXNLOG_BENCH_ROUNDS", "2"))
PARTITIONS = 4
SCALING_PARTITIONS = (2, 8)
SCALING_ROWS = (10_000, 100_000)
SCALING_BATCHES = 3  # B: the marginal count is (copy of 2B batches - copy of B batches) / B
SCHEMA = pa.schema([("id", pa.int64()), ("key", pa.string()), ("value", pa.string())])
REQUEST_TYPES = ("PUT", "GET", "HEAD", "LIST", "DELETE")


class Rows:
    """Deterministic rows, generated a chunk at a time."""

    def __init__(self) -> None:
        self.rng = np.random.default_rng(42)
        self.keys = np.array([f"key-{i:04d}" for i in range(1_000)], dtype=object)
        self.values = np.array([self.rng.bytes(50).hex() for _ in range(100_000)], dtype=object)
        self.next_id = 0

    def take(self, n: int) -> pa.Table:
        start, self.next_id = self.next_id, self.next_id + n
        return pa.table(
            {
                "id": pa.array(np.arange(start, start + n, dtype=np.int64)),
                "key": pa.array(self.keys[self.rng.integers(0, len(self.keys), n)], pa.string()),
                "value": pa.array(self.values[self.rng.integers(0, len(self.values), n)], pa.string()),
            },
            schema=SCHEMA,
        )


def write_input(log: txn_core.Log, partitions: int, batches: int, rows_per_batch: int) -> Iterator[int]:
    """Topic ``in``: ``batches`` transactions, each one entry of ``rows_per_batch / partitions`` rows per
    partition. Yields after each transaction (its index)."""
    log.create_topic("in", partitions, SCHEMA)
    producer = log.producer("bench-input", batch_bytes=64 << 20)  # one entry per partition per transaction
    producer.init_transactions()
    rows = Rows()
    per_partition = rows_per_batch // partitions
    for b in range(batches):
        producer.begin_transaction()
        for p in range(partitions):
            producer.send("in", rows.take(per_partition), partition=p)
        producer.commit_transaction()
        yield b
    producer.close()


def copy(
    spark: Any, url: str, flags: dict[str, str], name: str, root: Path, per_trigger: int, partitions: int
) -> tuple[float, int, int, Path]:
    """The exactly-once copy ``in`` -> ``name`` to its end; returns seconds, rows, micro-batches, stats dir."""
    stats = root / f"stats-{name}"
    reader = (
        spark.readStream.format("txnlog")
        .option("topic", "in")
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(per_trigger))
    )
    for k, v in flags.items():
        reader = reader.option(k, v)
    writer = (
        reader.load(url)
        .writeStream.format("txnlog")
        .option("checkpointLocation", str(root / f"chk-{name}"))
        .option("topic", name)
        .option("partitions", str(partitions))
        .option("consumerGroup", name)
        .option("testing.stats", str(stats))
        .trigger(availableNow=True)
    )
    for k, v in flags.items():
        writer = writer.option(k, v)
    start = time.perf_counter()
    query = writer.start(url)
    query.awaitTermination()
    elapsed = time.perf_counter() - start
    progress = [p for p in query.recentProgress if p["numInputRows"]]
    return elapsed, sum(p["numInputRows"] for p in progress), len(progress), stats


def commit_stats(stats: Path) -> list[dict[str, Any]]:
    return [s for s in (json.loads(p.read_text()) for p in sorted(stats.glob("*.json"))) if s["outcome"] == "committed"]


def check_copy(log: txn_core.Log, name: str, rows: int, stats: Path) -> list[dict[str, Any]]:
    commits = commit_stats(stats)
    assert sum(c["rows"] for c in commits) == rows, "every row committed exactly once"
    group = {tp.partition: o.offset for tp, o in log.groups.committed(name).items()}
    assert group == {p.partition: p.log_end_offset for p in log.describe_topic("in").partitions}
    return commits


@pytest.mark.bench
@pytest.mark.spark
def test_bench_exactly_once_copy_on_seaweedfs_vs_local_disk_and_requests_per_batch(
    spark: Any, seaweed_s3: Any, tmp_path: Path
) -> None:
    bucket = seaweed_s3.new_bucket()
    so = seaweed_s3.storage_options()
    flags = storage_flags(so)

    # --- part 1: throughput ---------------------------------------------------------------------------
    logs = {"local disk": (f"file://{tmp_path}/log", None, {}), "SeaweedFS": (f"s3://{bucket}/throughput", so, flags)}
    written: dict[str, float] = {}
    for label, (url, options, _) in logs.items():
        t0 = time.perf_counter()
        for _ in write_input(txn_core.open_log(url, options), PARTITIONS, BATCHES, ROWS // BATCHES):
            pass
        written[label] = time.perf_counter() - t0
    per_trigger = ROWS // BATCHES + PARTITIONS  # one input transaction: its rows and one marker per partition
    best: dict[str, float] = {}
    batches: dict[str, int] = {}
    commit_requests: dict[str, float] = {}
    s3_requests: dict[str, Counter[str]] = {}
    for r in range(ROUNDS):
        for label, (url, options, fl) in logs.items():
            name = f"out{r}"
            before = seaweed_s3.request_counts(bucket)
            elapsed, rows, n, stats = copy(
                spark, url, fl, name, tmp_path / label.replace(" ", "-"), per_trigger, PARTITIONS
            )
            after = seaweed_s3.request_counts(bucket)
            assert rows == ROWS and n == BATCHES, (label, rows, n)
            commits = check_copy(txn_core.open_log(url, options), name, ROWS, stats)
            commit_requests[label] = sum(c["total"] for c in commits) / len(commits)
            if options is not None:
                s3_requests[label] = after - before
            best[label] = min(best.get(label, elapsed), elapsed)
            batches[label] = n
            print(f"round {r + 1}: {label}: {elapsed:.2f} s, {n} micro-batches")
    mb = ROWS * (8 + 9 + 100) / 1e6  # approximate payload: id, key, value bytes
    print(
        f"\n{ROWS:,} rows (~{mb:.0f} MB of payload) in {BATCHES} micro-batches, {PARTITIONS} partitions; Spark "
        f"local[2]; input written in {written['local disk']:.1f} s (local) / {written['SeaweedFS']:.1f} s "
        f"(SeaweedFS); best of {ROUNDS}\n"
    )
    print(
        "| exactly-once txnlog -> txnlog copy | micro-batches | seconds | rows/s | MB/s | driver-commit "
        "requests per batch | all S3 requests per batch (start-up included) |\n|---|---:|---:|---:|---:|---:|---:|"
    )
    for label in logs:
        s3 = s3_requests.get(label)
        all_s3 = f"{sum(s3.values()) / batches[label]:.0f}" if s3 else "-"
        print(
            f"| {label} | {batches[label]} | {best[label]:.1f} | {ROWS / best[label] / 1e6:.2f}M | "
            f"{mb / best[label]:.1f} | {commit_requests[label]:.0f} | {all_s3} |"
        )
    print(f"\nSeaweedFS runs at {best['local disk'] / best['SeaweedFS']:.2f}x the rows/s of local disk")

    # --- part 2: requests per committed micro-batch ---------------------------------------------------
    results = []
    for partitions in SCALING_PARTITIONS:
        for rows_per_batch in SCALING_ROWS:
            spans: dict[int, Counter[str]] = {}
            last: list[dict[str, Any]] = []
            for n_batches in (SCALING_BATCHES, 2 * SCALING_BATCHES):
                url = f"s3://{bucket}/scaling-{uuid.uuid4().hex[:8]}"
                log = txn_core.open_log(url, so)
                for _ in write_input(log, partitions, n_batches, rows_per_batch):
                    pass
                before = seaweed_s3.request_counts(bucket)
                _, rows, n, stats = copy(
                    spark,
                    url,
                    flags,
                    "out",
                    tmp_path / f"scaling-{uuid.uuid4().hex[:8]}",
                    rows_per_batch + partitions,
                    partitions,
                )
                spans[n_batches] = seaweed_s3.request_counts(bucket) - before
                total_rows = (rows_per_batch // partitions) * partitions * n_batches
                assert (rows, n) == (total_rows, n_batches), (partitions, rows_per_batch, rows, n)
                last = check_copy(log, "out", total_rows, stats)
            marginal = {
                t: (spans[2 * SCALING_BATCHES][t] - spans[SCALING_BATCHES][t]) / SCALING_BATCHES
                for t in set(spans[SCALING_BATCHES]) | set(spans[2 * SCALING_BATCHES])
            }
            results.append(
                (
                    partitions,
                    rows_per_batch,
                    sum(c["objects"] for c in last) / len(last),
                    sum(c["total"] for c in last) / len(last),
                    marginal,
                )
            )
    print(
        f"\nStorage requests per committed micro-batch on SeaweedFS (input: one transaction per batch, one entry "
        f"per partition; all S3 requests: marginal, (copy of {2 * SCALING_BATCHES} batches - copy of "
        f"{SCALING_BATCHES}) / {SCALING_BATCHES})\n"
    )
    print(
        "| partitions | rows per batch | staged objects per batch | driver-commit requests | all S3 requests | "
        + " | ".join(REQUEST_TYPES)
        + " |\n|---:|---:|---:|---:|---:|"
        + "---:|" * len(REQUEST_TYPES)
    )
    for partitions, rows_per_batch, objects, commit_total, marginal in results:
        other = sum(v for t, v in marginal.items() if t not in REQUEST_TYPES)
        cells = " | ".join(f"{marginal.get(t, 0):.1f}" for t in REQUEST_TYPES)
        print(
            f"| {partitions} | {rows_per_batch:,} | {objects:.0f} | {commit_total:.0f} | "
            f"{sum(marginal.values()):.0f} | {cells} |" + (f" (+{other:.1f} other)" if other else "")
        )
