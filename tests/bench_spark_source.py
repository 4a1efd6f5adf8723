"""Benchmark: the txnlog stream source vs Spark's built-in parquet file source, both into the noop sink.

Same rows for both, generated once: ``id`` LONG, ``key`` STRING (1,000 distinct), ``value`` STRING of 100 hex
characters drawn from 100,000 distinct values. They are written with a transactional txnlog producer (one
transaction per chunk) into a topic of 4 partitions, and as parquet files. Each source is read as a stream
with ``Trigger.AvailableNow`` into ``format("noop")``, in the same SparkSession, alternating,
``TXNLOG_BENCH_ROUNDS`` (3) times each; the table reports rows/s of the best run and the ratio
txnlog / parquet. Nothing is asserted about time.

Run (10M rows, a few minutes)::

    /work/venv/bin/pytest tests/bench_spark_source.py -m bench -s -p no:cacheprovider

A quick run: ``TXNLOG_BENCH_ROWS=1000000``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import txn_core

ROWS = int(os.environ.get("TXNLOG_BENCH_ROWS", "10000000"))
#: Runs per case (the first also warms up the JVM); the best is reported.
ROUNDS = int(os.environ.get("TXNLOG_BENCH_ROUNDS", "3"))
CHUNK = 500_000
PARTITIONS = 4
SCHEMA = pa.schema([("id", pa.int64()), ("key", pa.string()), ("value", pa.string())])


def chunks(rows: int) -> Any:
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


def write_data(root: Path) -> tuple[str, str]:
    url = f"file://{root}/log"
    log = txn_core.open_log(url)
    log.create_topic("bench", PARTITIONS, SCHEMA)
    producer = log.producer("bench-writer")
    producer.init_transactions()
    parquet_dir = root / "parquet"
    parquet_dir.mkdir()
    for i, table in enumerate(chunks(ROWS)):
        producer.begin_transaction()
        for p in range(PARTITIONS):
            producer.send(
                "bench",
                table.slice(
                    p * len(table) // PARTITIONS,
                    (p + 1) * len(table) // PARTITIONS - p * len(table) // PARTITIONS,
                ),
                partition=p,
            )
        producer.commit_transaction()
        pq.write_table(table, parquet_dir / f"part-{i:05d}.parquet")
    producer.close()
    return url, str(parquet_dir)


def timed_stream(spark: Any, df: Any, checkpoint: str) -> tuple[float, int]:
    start = time.perf_counter()
    q = df.writeStream.format("noop").option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
    q.awaitTermination()
    elapsed = time.perf_counter() - start
    rows = sum(p["numInputRows"] for p in q.recentProgress)
    return elapsed, rows


@pytest.mark.bench
@pytest.mark.spark
def test_bench_txnlog_stream_vs_parquet_into_noop(spark: Any, tmp_path: Path) -> None:
    t0 = time.perf_counter()
    url, parquet_dir = write_data(tmp_path)
    written = time.perf_counter() - t0
    spark_schema = "id LONG, key STRING, value STRING"
    readers = {
        "parquet": lambda: spark.readStream.schema(spark_schema).parquet(parquet_dir),
        "txnlog": lambda: (
            spark.readStream.format("txnlog").option("topic", "bench").option("startingOffsets", "earliest").load(url)
        ),
        "txnlog (includeMetadata=false)": lambda: (
            spark.readStream.format("txnlog")
            .option("topic", "bench")
            .option("startingOffsets", "earliest")
            .option("includeMetadata", "false")
            .load(url)
        ),
    }
    best: dict[str, float] = {}
    for round_ in range(ROUNDS):
        for name, make in readers.items():
            elapsed, rows = timed_stream(spark, make(), str(tmp_path / f"ck-{name}-{round_}".replace(" ", "_")))
            assert rows == ROWS, (name, rows)  # both sources read every row (correctness, not time)
            best[name] = min(best.get(name, elapsed), elapsed)
            print(f"round {round_ + 1}: {name}: {elapsed:.2f} s")
    base = ROWS / best["parquet"]
    print(
        f"\n{ROWS:,} rows (id LONG, key STRING x1,000, value STRING 100 hex x100,000); data written in "
        f"{written:.1f} s; Spark local[2]; best of {ROUNDS} runs each\n"
    )
    print("| source into noop | rows/s | vs parquet |\n|---|---:|---:|")
    for name in readers:
        rate = ROWS / best[name]
        print(f"| {name} | {rate / 1e6:.2f}M | {rate / base:.2f}x |")
