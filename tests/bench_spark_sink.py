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

    .venv/bin/pytest tests/bench_spark_sink.py -m bench -s -p no:cacheprovider

A quick run: ``TXNLOG_BENCH_ROWS=1000000``. ``TXNLOG_BENCH_ROUNDS`` (3) sets the runs per copy.

Two more benchmarks, also runnable as a script (``.venv/bin/python tests/bench_spark_sink.py
2000000:1000000:strings --rounds 3 --small``): ``test_bench_copy_sizes`` copies every case of ``CASES`` (rows,
micro-batch rows, "strings" or "numeric" rows) four ways, each right after a parquet run: the exactly-once copy;
the same with ``includeMetadata=false``; parquet into a bare Python Arrow sink (the floor of any sink written with
PySpark's Python data source API); and a bare Python Arrow source into that sink (the floor of any Python source
-> Python sink copy: both hops of the API and nothing else). It reports the ratio of each pair and their range (on
a shared machine only same-run ratios mean anything);
``test_bench_small_micro_batch`` runs steady micro-batches of 8,000 rows (one input transaction or parquet file
each) and reports the median milliseconds per phase of Spark's progress, txnlog -> txnlog against parquet ->
parquet.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from bare_peers import into_bare_sink, register_bare_peers

import txn_core
from txn_core.format import paths
from txn_core.partition.ranges import MAX_BATCH_ROWS

ROWS = int(os.environ.get("TXNLOG_BENCH_ROWS", "10000000"))
#: Runs per case (the first also warms up the JVM); the best is reported.
ROUNDS = int(os.environ.get("TXNLOG_BENCH_ROUNDS", "3"))
BATCHES = int(os.environ.get("TXNLOG_BENCH_BATCHES", "5"))
FILES_PER_BATCH = 4
CHUNK = max(1, math.ceil(ROWS / (BATCHES * FILES_PER_BATCH)))  # 500k rows for 10M rows in 5 batches
PARTITIONS = 4
SCHEMA = pa.schema([("id", pa.int64()), ("key", pa.string()), ("value", pa.string())])
#: The numeric rows: as many columns, no strings.
NUMERIC = pa.schema([("id", pa.int64()), ("a", pa.int64()), ("b", pa.float64()), ("c", pa.int32())])
DDL = {"strings": "id LONG, key STRING, value STRING", "numeric": "id LONG, a LONG, b DOUBLE, c INT"}


def chunks(rows: int, chunk: int = CHUNK, shape: str = "strings") -> Iterator[pa.Table]:
    """The input rows in tables of ``chunk`` rows; ``shape`` "strings" (``SCHEMA``) or "numeric" (``NUMERIC``)."""
    rng = np.random.default_rng(42)
    if shape == "numeric":
        for start in range(0, rows, chunk):
            n = min(chunk, rows - start)
            yield pa.table(
                {
                    "id": pa.array(np.arange(start, start + n, dtype=np.int64)),
                    "a": pa.array(rng.integers(0, 1 << 40, n)),
                    "b": pa.array(rng.random(n)),
                    "c": pa.array(rng.integers(0, 1_000, n).astype(np.int32)),
                },
                schema=NUMERIC,
            )
        return
    keys = np.array([f"key-{i:04d}" for i in range(1_000)], dtype=object)
    values = np.array([rng.bytes(50).hex() for _ in range(100_000)], dtype=object)
    for start in range(0, rows, chunk):
        n = min(chunk, rows - start)
        yield pa.table(
            {
                "id": pa.array(np.arange(start, start + n, dtype=np.int64)),
                "key": pa.array(keys[rng.integers(0, len(keys), n)], pa.string()),
                "value": pa.array(values[rng.integers(0, len(values), n)], pa.string()),
            },
            schema=SCHEMA,
        )


def write_input(
    root: Path,
    rows: int = ROWS,
    chunk: int = CHUNK,
    shape: str = "strings",
    topic: str = "in",
    log: txn_core.Log | None = None,
) -> tuple[txn_core.Log, str, int]:
    """The rows as topic ``topic`` (one transaction per chunk, spread over ``PARTITIONS``) and as parquet
    files of one chunk each; returns the log, the parquet directory and the file count."""
    if log is None:
        log = txn_core.open_log(f"file://{root}/log")
    log.create_topic(topic, PARTITIONS, NUMERIC if shape == "numeric" else SCHEMA)
    producer = log.producer(f"bench-input-{topic}")
    producer.init_transactions()
    parquet_dir = root / f"parquet-{topic}"
    parquet_dir.mkdir()
    (root / f"arrow-{topic}").mkdir()
    files = 0
    for i, table in enumerate(chunks(rows, chunk, shape)):
        producer.begin_transaction()
        step = math.ceil(table.num_rows / PARTITIONS)
        for p in range(PARTITIONS):
            producer.send(topic, table.slice(p * step, step), partition=p)
        producer.commit_transaction()
        pq.write_table(table, parquet_dir / f"part-{i:05d}.parquet")
        with (
            pa.OSFile(str(root / f"arrow-{topic}" / f"{i:05d}.arrow"), "wb") as sink,
            pa.ipc.new_file(sink, table.schema) as ipc,
        ):
            ipc.write_table(table, max_chunksize=MAX_BATCH_ROWS)  # txnlog's reads' batches
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
    spark: Any,
    log: txn_core.Log,
    root: Path,
    name: str,
    offsets_per_trigger: int,
    stats: Path | None,
    metadata: bool = True,
    source: str = "in",
    trigger: dict[str, Any] | None = None,
) -> Any:
    df = (
        spark.readStream.format("txnlog")
        .option("topic", source)
        .option("startingOffsets", "earliest")
        .option("includeMetadata", str(metadata).lower())
        .option("maxOffsetsPerTrigger", str(offsets_per_trigger))
        .load(log.url)
    )
    writer = (
        df.writeStream.format("txnlog")
        .option("checkpointLocation", str(root / f"chk-{name}"))
        .option("topic", name)
        .option("partitions", str(PARTITIONS))
        .option("consumerGroup", name)
    )
    if stats is not None:
        writer = writer.option("testing.stats", str(stats))
    return writer.trigger(**(trigger or {"availableNow": True})).start(log.url)


def parquet_stream(spark: Any, parquet_dir: str, files_per_trigger: int, ddl: str = DDL["strings"]) -> Any:
    """The input's parquet files as a stream of ``files_per_trigger`` files per micro-batch."""
    return spark.readStream.schema(ddl).option("maxFilesPerTrigger", str(files_per_trigger)).parquet(parquet_dir)


def parquet_copy(
    spark: Any,
    parquet_dir: str,
    root: Path,
    name: str,
    files_per_trigger: int,
    ddl: str = DDL["strings"],
    trigger: dict[str, Any] | None = None,
) -> Any:
    df = parquet_stream(spark, parquet_dir, files_per_trigger, ddl)
    return (
        df.writeStream.format("parquet")
        .option("path", str(root / name))
        .option("checkpointLocation", str(root / f"chk-{name}"))
        .trigger(**(trigger or {"availableNow": True}))
        .start()
    )


def bare_pair_copy(spark: Any, arrow_dir: str, root: Path, name: str, files_per_trigger: int, ddl: str) -> Any:
    """:class:`BareArrowSource` into :class:`BareArrowSink`: both hops of the Python data source API and
    nothing else, the floor of any Python source -> Python sink copy."""
    df = (
        spark.readStream.format("bench_bare_arrow_source")
        .option("path", arrow_dir)
        .option("ddl", ddl)
        .option("maxFilesPerTrigger", str(files_per_trigger))
        .load()
    )
    return into_bare_sink(df, root, name)


def bare_copy(spark: Any, log: txn_core.Log, root: Path, name: str, offsets_per_trigger: int) -> Any:
    df = (
        spark.readStream.format("txnlog")
        .option("topic", "in")
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(offsets_per_trigger))
        .load(log.url)
    )
    return into_bare_sink(df, root, name)


def sink_only_copy(
    spark: Any, log: txn_core.Log, parquet_dir: str, root: Path, name: str, files_per_trigger: int
) -> Any:
    df = parquet_stream(spark, parquet_dir, files_per_trigger)
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
    register_bare_peers(spark)
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


# --- copies of several sizes, and the steady small micro-batch -------------------------------------------


#: The copies of :func:`copy_ratios`, each run right after a parquet -> parquet run of the same rows: the
#: exactly-once copy as a user writes it (metadata columns included, the default), the same without them, and
#: the floor of any Python sink: parquet files into a sink that only appends its Arrow batches to a file.
RATIO_COPIES = {
    "txnlog": "txnlog -> txnlog",
    "nometa": "txnlog -> txnlog, includeMetadata=false",
    "floor": "parquet -> bare Python Arrow sink",
    "pair": "bare Python Arrow source -> bare Python Arrow sink",
}
#: Per round: rows/s of parquet -> parquet and of each of ``RATIO_COPIES`` (key "parquet" and its keys), and each
#: copy's ratio to the parquet run right before it (key "<copy>/parquet").
Rates = dict[str, list[float]]


def floor_copy(spark: Any, parquet_dir: str, root: Path, name: str, files_per_trigger: int, ddl: str) -> Any:
    """Parquet files into :class:`BareArrowSink`: what PySpark's Python data source writer costs by itself
    (rows handed to a Python worker as Arrow batches, appended to one file per task)."""
    return into_bare_sink(parquet_stream(spark, parquet_dir, files_per_trigger, ddl), root, name)


def discard(directory: Path) -> None:
    """Remove a measured copy's output: a run of every case writes tens of GB otherwise."""
    shutil.rmtree(directory, ignore_errors=True)


def copy_ratios(spark: Any, root: Path, rows: int, batch_rows: int, shape: str, rounds: int) -> Rates:
    """Each of ``RATIO_COPIES`` against parquet -> parquet, ``rounds`` times each, every copy right after a
    parquet run (its peer in that round). Input: ``rows`` in transactions (and parquet files) of
    ``batch_rows / 4`` rows, copied in micro-batches of ``batch_rows``."""
    register_bare_peers(spark)
    chunk = max(1, batch_rows // FILES_PER_BATCH)
    topic = f"in-{shape}-{rows}-{batch_rows}"
    log, parquet_dir, _ = write_input(root, rows, chunk, shape, topic)
    offsets_per_trigger = batch_rows + FILES_PER_BATCH * PARTITIONS  # one marker per partition per transaction
    rates: Rates = {}
    for r in range(rounds):
        for kind, label in RATIO_COPIES.items():
            name = f"{kind}-{topic}-r{r}"  # the copy's output (a topic for txnlog's), its group, its checkpoint
            elapsed_p, n, _ = timed(parquet_copy(spark, parquet_dir, root, f"pq-{name}", FILES_PER_BATCH, DDL[shape]))
            assert n == rows, (name, n)
            discard(root / f"pq-{name}")
            if kind == "floor":
                q = floor_copy(spark, parquet_dir, root, name, FILES_PER_BATCH, DDL[shape])
            elif kind == "pair":
                q = bare_pair_copy(spark, str(root / f"arrow-{topic}"), root, name, FILES_PER_BATCH, DDL[shape])
            else:
                q = txnlog_copy(spark, log, root, name, offsets_per_trigger, None, kind == "txnlog", source=topic)
            elapsed, n, _ = timed(q)
            assert n == rows, (name, n)
            if kind in ("txnlog", "nometa"):
                group = log.groups.committed(name)
                assert {tp.partition: o.offset for tp, o in group.items()} == {
                    p.partition: p.log_end_offset for p in log.describe_topic(topic).partitions
                }
                discard(root / "log" / paths.topic_root(name))  # checked; nothing reads it again
            else:
                discard(root / name)
            rates.setdefault("parquet", []).append(rows / elapsed_p)
            rates.setdefault(kind, []).append(rows / elapsed)
            rates.setdefault(f"{kind}/parquet", []).append(elapsed_p / elapsed)
            print(
                f"{shape} {rows:,} rows in batches of {batch_rows:,}, round {r + 1}: parquet {elapsed_p:.2f} s, "
                f"{label} {elapsed:.2f} s, {elapsed_p / elapsed:.2f}x",
                flush=True,
            )
    log.close()
    return rates


PHASES = ("latestOffset", "queryPlanning", "walCommit", "addBatch", "commitOffsets", "triggerExecution")


def batch_phases(query: Any, skip: int = 2) -> dict[str, float]:
    """Median milliseconds per phase of a query's micro-batches that read rows, the first ``skip`` left out
    (warm-up); ``batches`` is how many were measured."""
    progress = [p for p in query.recentProgress if p["numInputRows"]][skip:]
    out = {phase: statistics.median([float(p["durationMs"].get(phase, 0)) for p in progress]) for phase in PHASES}
    out["batches"] = float(len(progress))
    return out


def small_batch_times(
    spark: Any, root: Path, rows: int, batches: int, rounds: int
) -> tuple[list[dict[str, float]], list[dict[str, float]]]:
    """Steady micro-batches of ``rows`` rows: one input transaction (one parquet file) per micro-batch; per
    round the median phases of txnlog -> txnlog (exactly-once) and of parquet -> parquet."""
    topic = f"small-{rows}"
    log, parquet_dir, _ = write_input(root, rows * batches, rows, "strings", topic)
    txn, parquet = [], []
    for r in range(rounds):
        q = parquet_copy(spark, parquet_dir, root, f"pq-{topic}-r{r}", 1)
        q.awaitTermination()
        parquet.append(batch_phases(q))
        q = txnlog_copy(spark, log, root, f"tx-{topic}-r{r}", rows + PARTITIONS, None, source=topic)
        q.awaitTermination()
        txn.append(batch_phases(q))
        print(
            f"{rows:,}-row micro-batches, round {r + 1}: parquet {parquet[-1]['triggerExecution']:.0f} ms, "
            f"txnlog {txn[-1]['triggerExecution']:.0f} ms",
            flush=True,
        )
    log.close()
    return txn, parquet


def report_copies(cases: list[tuple[int, int, str]], results: list[Rates]) -> None:
    print("\n| rows | micro-batch | row shape | copy | rows/s | vs parquet -> parquet, per round (median) |")
    print("|---:|---:|---|---|---:|---:|")
    for (rows, batch_rows, shape), rates in zip(cases, results, strict=True):
        for kind, label in {"parquet": "parquet -> parquet", **RATIO_COPIES}.items():
            rate = f"{min(rates[kind]) / 1e6:.2f}-{max(rates[kind]) / 1e6:.2f}M"
            ratios = rates.get(f"{kind}/parquet")
            shown = f"{min(ratios):.2f}-{max(ratios):.2f}x ({statistics.median(ratios):.2f}x)" if ratios else "1.00x"
            print(f"| {rows / 1e6:g}M | {batch_rows / 1e6:g}M | {shape} | {label} | {rate} | {shown} |")


def report_small(rows: int, txn: list[dict[str, float]], parquet: list[dict[str, float]]) -> None:
    ratios = [t["triggerExecution"] / p["triggerExecution"] for t, p in zip(txn, parquet, strict=True)]
    print(f"\n{rows:,}-row micro-batches, median ms per phase per round (txnlog / parquet):")
    for phase in PHASES:
        t = ", ".join(f"{x[phase]:.0f}" for x in txn)
        p = ", ".join(f"{x[phase]:.0f}" for x in parquet)
        print(f"  {phase}: txnlog {t}; parquet {p}")
    print(
        f"txnlog / parquet per micro-batch: {min(ratios):.2f}-{max(ratios):.2f}x "
        f"(median {statistics.median(ratios):.2f}x), "
        f"{int(txn[0]['batches'])} micro-batches measured per run"
    )


#: rows, micro-batch rows, row shape: the sizes the copy is measured at (``TXNLOG_BENCH_CASES`` overrides,
#: e.g. ``2000000:1000000:strings,2000000:1000000:numeric``).
CASES = [
    (10_000_000, 2_000_000, "strings"),
    (5_000_000, 1_000_000, "strings"),
    (10_000_000, 2_000_000, "numeric"),
    (5_000_000, 1_000_000, "numeric"),
]


def _cases(spec: str | None) -> list[tuple[int, int, str]]:
    if not spec:
        return CASES
    out = []
    for case in spec.split(","):
        rows, batch_rows, shape = case.split(":")
        out.append((int(rows), int(batch_rows), shape))
    return out


@pytest.mark.bench
@pytest.mark.spark
def test_bench_copy_sizes(spark: Any, tmp_path: Path) -> None:
    """The exactly-once copy against parquet's at every size of ``CASES``: ratios per round, and their range."""
    cases = _cases(os.environ.get("TXNLOG_BENCH_CASES"))
    results = [copy_ratios(spark, tmp_path, rows, b, shape, ROUNDS) for rows, b, shape in cases]
    report_copies(cases, results)


SMALL_ROWS = 8_000
SMALL_BATCHES = 12


@pytest.mark.bench
@pytest.mark.spark
def test_bench_small_micro_batch(spark: Any, tmp_path: Path) -> None:
    """A steady micro-batch of 8,000 rows: the fixed cost every low-latency stream pays."""
    txn, parquet = small_batch_times(spark, tmp_path, SMALL_ROWS, SMALL_BATCHES, ROUNDS)
    report_small(SMALL_ROWS, txn, parquet)


def main() -> None:
    """``python tests/bench_spark_sink.py [ROWS:BATCH_ROWS:SHAPE,...] [--rounds N] [--small] [--no-copy]``."""
    import argparse
    import sys
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="?", help="e.g. 2000000:1000000:strings,2000000:1000000:numeric")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--small", action="store_true", help="also the steady 8,000-row micro-batch")
    parser.add_argument("--no-copy", action="store_true", help="only the steady small micro-batch")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import conftest

    with tempfile.TemporaryDirectory(prefix="bench-spark-sink-") as root:
        session_iter = conftest.spark.__wrapped__()  # type: ignore[attr-defined]
        spark = next(session_iter)
        try:
            if not args.no_copy:
                cases = _cases(args.cases)
                results = [copy_ratios(spark, Path(root), r, b, s, args.rounds) for r, b, s in cases]
                report_copies(cases, results)
            if args.small or args.no_copy:
                txn, parquet = small_batch_times(spark, Path(root), SMALL_ROWS, SMALL_BATCHES, args.rounds)
                report_small(SMALL_ROWS, txn, parquet)
        finally:
            spark.stop()


if __name__ == "__main__":
    main()
