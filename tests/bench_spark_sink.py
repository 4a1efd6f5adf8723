"""Benchmark: an exactly-once txnlog -> txnlog stream copy vs Spark's parquet -> parquet stream copy.

Same rows for both, generated once: ``id`` LONG, ``key`` STRING (1,000 distinct), ``value`` STRING of 100 hex
characters drawn from 100,000 distinct values; written as a txnlog topic of 4 partitions (one transaction
per chunk of 500k rows) and as parquet files of one chunk each (20 files). Each copy runs as a stream with
``Trigger.AvailableNow`` and the same number of micro-batches (``BATCHES``: ``maxOffsetsPerTrigger`` for
txnlog, ``maxFilesPerTrigger`` for parquet), in the same SparkSession, alternating, twice each.

The txnlog copy is the full exactly-once path: every micro-batch is one transaction that commits the staged
output by reference together with the source offsets to a consumer group and the sink's progress. Two more
copies show where the time goes: the same txnlog source into a bare Arrow sink (one IPC file per task, no
transactions, no fsync: what the transactions cost), and parquet files into the txnlog sink (the sink
alone against Spark's parquet sink). The table reports rows/s of the best run of each, the ratios to the
parquet copy, and the storage requests the driver's commit made per micro-batch (counted by the sink's
``testing.stats`` hook). Nothing is asserted about time; the row counts and group offsets are checked.

Run (10M rows, several minutes)::

    /work/venv/bin/pytest tests/bench_spark_sink.py -m bench -s -p no:cacheprovider

A quick run: ``TXNLOG_BENCH_ROWS=1000000``. ``TXNLOG_BENCH_ROUNDS`` (3) sets the runs per copy.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter, WriterCommitMessage

import txn_core

ROWS = int(os.environ.get("TXNLOG_BENCH_ROWS", "10000000"))
#: Runs per case (the first also warms up the JVM); the best is reported.
ROUNDS = int(os.environ.get("TXNLOG_BENCH_ROUNDS", "3"))
BATCHES = int(os.environ.get("TXNLOG_BENCH_BATCHES", "5"))
FILES_PER_BATCH = 4
CHUNK = max(1, math.ceil(ROWS / (BATCHES * FILES_PER_BATCH)))  # 500k rows for 10M rows in 5 batches
PARTITIONS = 4
SCHEMA = pa.schema([("id", pa.int64()), ("key", pa.string()), ("value", pa.string())])


def chunks(rows: int) -> Iterator[pa.Table]:
    rng = np.random.default_rng(42)
    keys = np.array([f"key-{i:04d}" for i in range(1_000)], dtype=object)
    values = np.array([rng.bytes(50).hex() for _ in range(100_000)], dtype=object)
    for start in range(0, rows, CHUNK):
        n = min(CHUNK, rows - start)
        yield pa.table(
            {
                "id": pa.array(np.arange(start, start + n, dtype=np.int64)),
                "key": pa.array(keys[rng.integers(0, len(keys), n)], pa.string()),
                "value": pa.array(values[rng.integers(0, len(values), n)], pa.string()),
            },
            schema=SCHEMA,
        )


def write_input(root: Path) -> tuple[txn_core.Log, str, int]:
    """The rows as topic ``in`` and as parquet files; returns the log, the parquet directory, file count."""
    log = txn_core.open_log(f"file://{root}/log")
    log.create_topic("in", PARTITIONS, SCHEMA)
    producer = log.producer("bench-input")
    producer.init_transactions()
    parquet_dir = root / "parquet-in"
    parquet_dir.mkdir()
    files = 0
    for i, table in enumerate(chunks(ROWS)):
        producer.begin_transaction()
        step = math.ceil(table.num_rows / PARTITIONS)
        for p in range(PARTITIONS):
            producer.send("in", table.slice(p * step, step), partition=p)
        producer.commit_transaction()
        pq.write_table(table, parquet_dir / f"part-{i:05d}.parquet")
        files += 1
    producer.close()
    return log, str(parquet_dir), files


def timed(query: Any) -> tuple[float, int, int]:
    start = time.perf_counter()
    query.awaitTermination()
    elapsed = time.perf_counter() - start
    progress = [p for p in query.recentProgress if p["numInputRows"]]
    return elapsed, sum(p["numInputRows"] for p in progress), len(progress)


def txnlog_copy(
    spark: Any, log: txn_core.Log, root: Path, name: str, offsets_per_trigger: int, stats: Path, metadata: bool = True
) -> Any:
    df = (
        spark.readStream.format("txnlog")
        .option("topic", "in")
        .option("startingOffsets", "earliest")
        .option("includeMetadata", str(metadata).lower())
        .option("maxOffsetsPerTrigger", str(offsets_per_trigger))
        .load(log.url)
    )
    return (
        df.writeStream.format("txnlog")
        .option("checkpointLocation", str(root / f"chk-{name}"))
        .option("topic", name)
        .option("partitions", str(PARTITIONS))
        .option("consumerGroup", name)
        .option("testing.stats", str(stats))
        .trigger(availableNow=True)
        .start(log.url)
    )


def parquet_copy(spark: Any, parquet_dir: str, root: Path, name: str, files_per_trigger: int) -> Any:
    df = (
        spark.readStream.schema("id LONG, key STRING, value STRING")
        .option("maxFilesPerTrigger", str(files_per_trigger))
        .parquet(parquet_dir)
    )
    return (
        df.writeStream.format("parquet")
        .option("path", str(root / name))
        .option("checkpointLocation", str(root / f"chk-{name}"))
        .trigger(availableNow=True)
        .start()
    )


class _BareMessage(WriterCommitMessage):
    pass


class _BareArrowWriter(DataSourceStreamArrowWriter):
    """Streams each task's batches into one Arrow IPC file: no transactions, no fsync, no commit."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        import uuid

        writer = None
        with open(os.path.join(self.directory, uuid.uuid4().hex), "wb") as f:
            for batch in iterator:
                if writer is None:
                    writer = pa.ipc.new_stream(f, batch.schema)
                writer.write_batch(batch)
            if writer is not None:
                writer.close()
        return _BareMessage()

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        pass

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        pass


class BareArrowSink(DataSource):
    """``format("bench_bare_arrow")``: the peer the transactional sink is measured against."""

    @classmethod
    def name(cls) -> str:
        return "bench_bare_arrow"

    def streamWriter(self, schema: Any, overwrite: bool) -> DataSourceStreamArrowWriter:  # noqa: N802
        directory = self.options["path"]
        os.makedirs(directory, exist_ok=True)
        return _BareArrowWriter(directory)


def bare_copy(spark: Any, log: txn_core.Log, root: Path, name: str, offsets_per_trigger: int) -> Any:
    df = (
        spark.readStream.format("txnlog")
        .option("topic", "in")
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(offsets_per_trigger))
        .load(log.url)
    )
    return (
        df.writeStream.format("bench_bare_arrow")
        .option("checkpointLocation", str(root / f"chk-{name}"))
        .trigger(availableNow=True)
        .start(str(root / name))
    )


def sink_only_copy(
    spark: Any, log: txn_core.Log, parquet_dir: str, root: Path, name: str, files_per_trigger: int
) -> Any:
    df = (
        spark.readStream.schema("id LONG, key STRING, value STRING")
        .option("maxFilesPerTrigger", str(files_per_trigger))
        .parquet(parquet_dir)
    )
    return (
        df.writeStream.format("txnlog")
        .option("checkpointLocation", str(root / f"chk-{name}"))
        .option("topic", name)
        .option("partitions", str(PARTITIONS))
        .trigger(availableNow=True)
        .start(log.url)
    )


def commit_requests(stats: Path) -> dict[str, float]:
    """Average storage requests of one micro-batch commit on the driver, by operation."""
    files = [json.loads(p.read_text()) for p in stats.glob("*.json")]
    files = [f for f in files if f["outcome"] == "committed"]
    ops: dict[str, float] = {}
    for f in files:
        for op, n in f["requests"].items():
            ops[op] = ops.get(op, 0) + n / len(files)
    ops["total"] = sum(f["total"] for f in files) / len(files)
    ops["objects"] = sum(f["objects"] for f in files) / len(files)
    ops["rows"] = sum(f["rows"] for f in files)
    return ops


COPIES = {
    "parquet": "parquet -> parquet (Spark built-in)",
    "txnlog": "txnlog -> txnlog, exactly-once",
    "txnlog_nometa": "txnlog -> txnlog, exactly-once, includeMetadata=false",
    "bare": "txnlog -> bare Arrow IPC files (no transactions)",
    "sink": "parquet -> txnlog, exactly-once",
}


@pytest.mark.bench
@pytest.mark.spark
def test_bench_exactly_once_txnlog_copy_vs_parquet_copy(spark: Any, tmp_path: Path) -> None:
    import sys

    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # type: ignore[no-untyped-call]
    spark.dataSource.register(BareArrowSink)
    t0 = time.perf_counter()
    log, parquet_dir, files = write_input(tmp_path)
    written = time.perf_counter() - t0
    markers = files * PARTITIONS  # one commit marker per partition per input transaction
    offsets_per_trigger = math.ceil((ROWS + markers) / BATCHES)
    files_per_trigger = math.ceil(files / BATCHES)
    best: dict[str, float] = {}
    batches: dict[str, int] = {}
    requests: dict[str, float] = {}
    for r in range(ROUNDS):
        for kind, label in COPIES.items():
            name = f"{kind}{r}"
            if kind == "parquet":
                q = parquet_copy(spark, parquet_dir, tmp_path, name, files_per_trigger)
            elif kind in ("txnlog", "txnlog_nometa"):
                q = txnlog_copy(
                    spark,
                    log,
                    tmp_path,
                    name,
                    offsets_per_trigger,
                    tmp_path / f"stats-{name}",
                    metadata=kind == "txnlog",
                )
            elif kind == "bare":
                q = bare_copy(spark, log, tmp_path, name, offsets_per_trigger)
            else:
                q = sink_only_copy(spark, log, parquet_dir, tmp_path, name, files_per_trigger)
            elapsed, rows, n = timed(q)
            assert rows == ROWS, (name, rows)
            if kind in ("txnlog", "txnlog_nometa"):
                requests = commit_requests(tmp_path / f"stats-{name}")
                assert requests["rows"] == ROWS, "every row committed exactly once"
                group = log.groups.committed(name)
                assert {tp.partition: o.offset for tp, o in group.items()} == {
                    p.partition: p.log_end_offset for p in log.describe_topic("in").partitions
                }
            best[kind] = min(best.get(kind, elapsed), elapsed)
            batches[kind] = n
            print(f"round {r + 1}: {label}: {elapsed:.2f} s, {n} micro-batches")
    base = ROWS / best["parquet"]
    print(
        f"\n{ROWS:,} rows (id LONG, key STRING x1,000, value STRING 100 hex x100,000), input written in "
        f"{written:.1f} s; Spark local[2]; best of {ROUNDS} runs each\n"
    )
    print("| stream copy | micro-batches | rows/s | vs parquet -> parquet |\n|---|---:|---:|---:|")
    for kind, label in COPIES.items():
        rate = ROWS / best[kind]
        print(f"| {label} | {batches[kind]} | {rate / 1e6:.2f}M | {rate / base:.2f}x |")
    print(
        f"\ntransactions cost: txnlog -> txnlog runs at {best['bare'] / best['txnlog']:.2f}x of the same copy into "
        "a bare Arrow sink"
    )
    detail = ", ".join(f"{op} {requests[op]:.1f}" for op in sorted(requests) if op not in ("total", "objects", "rows"))
    print(
        f"storage requests per committed micro-batch (driver commit): {requests['total']:.1f} ({detail}); "
        f"staged objects committed by reference per micro-batch: {requests['objects']:.1f}"
    )
