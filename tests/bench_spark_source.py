"""Benchmark: the txnlog stream source against the ceiling PySpark's Python data source API allows.

Same rows for every source, generated once (:func:`bench_spark_sink.write_input`): ``id`` LONG, ``key``
STRING (1,000 distinct), ``value`` STRING of 100 hex characters drawn from 100,000 distinct values; written
with a transactional txnlog producer into a topic of 4 partitions (one transaction per chunk of 500k rows
for 10M rows), as parquet files of one chunk each, and, for the peer, as one Arrow IPC file per txnlog entry.

The peer, ``bench_bare_arrow_source``, is the least a Python data source can do: each task memory-maps its
Arrow IPC files and yields their record batches, already in the exact schema Spark expects, sliced to its
rows. Its files hold the rows of the txnlog entries (same bytes, same disk) plus the four metadata columns
txnlog adds, already materialised (``_topic`` STRING, ``_partition`` INT, ``_offset`` LONG, ``_timestamp``
TIMESTAMP), so the peer with metadata pays only for moving them; its tasks are the txnlog source's (each
partition cut into ``ceil(offsets / 1M)`` tasks of near-equal size, at entry edges: ``split_range``). What
txnlog costs beyond it is ours: reading entries, verifying every payload byte, applying the read_committed
filters and building metadata.

Each source is read as a stream with ``Trigger.AvailableNow`` into ``format("noop")``, and each copy runs
as a stream into a sink (``BATCHES`` micro-batches; the exactly-once txnlog -> txnlog copy and Spark's
parquet -> parquet copy, as in ``tests/bench_spark_sink.py``, which also splits the copy's cost between
source, transactions and sink). Everything runs in one SparkSession, alternating, ``TXNLOG_BENCH_ROUNDS``
(3) times each, after one read of each source that is not counted (the JVM compiles the read paths in the
first runs: a first parquet read took 7.1 s against 2.6 s later), with the page cache's dirty pages written
out before each round; the tables report rows/s of the best run and ratios to the peer measured in the same
run, and each round's ratio of txnlog to its bare peer (run back to back) is printed too: on a machine whose
speed drifts, the paired ratios show how far apart two best-of figures can fall.
Row counts are checked; nothing is asserted about time.

txnlog's modules are byte-compiled first, as ``pip install`` does: a machine that sets
``PYTHONDONTWRITEBYTECODE=1`` would otherwise compile them from source in every fresh Python process (each
query starts one on the driver), ~0.08 s that no installed copy pays and the peer, pickled by value, never does.

Run (10M rows, several minutes)::

    PYTHONPATH=. pytest -m bench -s -p no:cacheprovider tests/bench_spark_source.py

A quick run: ``TXNLOG_BENCH_ROWS=2000000``.

:func:`test_bench_task_memory_reading_a_1gb_partition` (no Spark) measures what one task holds: a child
process reads a whole 1 GB partition as a single planned range with the task's code (``read_partition``) and
hands every batch on as PySpark's worker does (struct-wrapped, written as an Arrow IPC stream), and reports
its peak RSS (``VmHWM``) before and after reading.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from bench_spark_sink import (
    BATCHES,
    PARTITIONS,
    ROUNDS,
    ROWS,
    SCHEMA,
    chunks,
    parquet_copy,
    timed,
    txnlog_copy,
    write_input,
)
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit

import txn_core
from txn_core.format import paths
from txn_core.partition.ranges import available_end, plan_range, read_range, split_range
from txn_core.partition.reader import READ_COMMITTED

#: A task of either source reads at most about this many offsets (the txnlog source's MAX_OFFSETS_PER_TASK).
OFFSETS_PER_TASK = 1_000_000
TOPIC_COLUMNS = "id LONG, key STRING, value STRING"
METADATA_COLUMNS = "_topic STRING, _partition INT, _offset LONG, _timestamp TIMESTAMP"
#: The peer's files: the Arrow schema Spark expects of a batch for both DDL strings above, in order.
BARE_SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("key", pa.string()),
        ("value", pa.string()),
        ("_topic", pa.string()),
        ("_partition", pa.int32()),
        ("_offset", pa.int64()),
        ("_timestamp", pa.timestamp("us", tz="UTC")),
    ]
)


@pytest.fixture(scope="module", autouse=True)
def byte_compiled() -> None:
    """txnlog's modules as an installed package has them: byte-compiled (see the module doc)."""
    import compileall

    root = Path(__file__).resolve().parent.parent
    for package in ("txn_core", "spark_txn_source", "spark_txn_sink"):
        assert compileall.compile_dir(str(root / package), quiet=1)


# --- the peer: a bare Python data source over Arrow IPC files ----------------------------------------


class _BareTask(InputPartition):
    """Rows ``[lo, hi)`` of each of some Arrow IPC files, in order."""

    def __init__(self, pieces: list[tuple[str, int, int]]) -> None:
        super().__init__(pieces)
        self.pieces = pieces


class _BareStreamReader(DataSourceStreamReader):
    """One micro-batch holding every task of the manifest; ``read`` yields the files' batches as stored."""

    def __init__(self, manifest: str, columns: int) -> None:
        self.manifest = manifest
        self.columns = columns

    def initialOffset(self) -> dict[str, int]:  # noqa: N802 - Spark API
        return {"read": 0}

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:  # noqa: N802 - Spark API
        return {"read": 1}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        if start == end:
            return []
        with open(self.manifest) as f:
            return [_BareTask([tuple(p) for p in task]) for task in json.load(f)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, _BareTask)
        for path, lo, hi in partition.pieces:
            with pa.memory_map(path) as source:
                reader = pa.ipc.open_file(source)
                first = 0
                for i in range(reader.num_record_batches):
                    batch = reader.get_batch(i)
                    a, b = max(lo - first, 0), min(hi - first, batch.num_rows)
                    first += batch.num_rows
                    if a < b:
                        piece = batch if (a, b) == (0, batch.num_rows) else batch.slice(a, b - a)
                        yield piece if self.columns == piece.num_columns else piece.select(range(self.columns))

    def commit(self, end: dict[str, int]) -> None:
        pass


class BareArrowSource(DataSource):
    """``format("bench_bare_arrow_source")``: the peer the txnlog source is measured against."""

    @classmethod
    def name(cls) -> str:
        return "bench_bare_arrow_source"

    def schema(self) -> str:
        metadata = self.options.get("includemetadata", "true") == "true"
        return f"{TOPIC_COLUMNS}, {METADATA_COLUMNS}" if metadata else TOPIC_COLUMNS

    def streamReader(self, schema: Any) -> DataSourceStreamReader:  # noqa: N802 - Spark API
        return _BareStreamReader(self.options["path"], len(schema.fields))


def write_bare_files(log: txn_core.Log, topic: str, root: Path) -> str:
    """One Arrow IPC file per txnlog entry of ``topic``, holding its committed rows and metadata columns in
    the exact Arrow schema Spark expects; returns a manifest of the tasks: the txnlog source's own split
    (:func:`txn_core.partition.ranges.split_range`, as its planner calls it), each task the same rows."""
    schema = BARE_SCHEMA
    tasks: list[list[tuple[str, int, int]]] = []
    for info in log.describe_topic(topic).partitions:
        state = log.partition_state(paths.partition_log_path(topic, info.partition))
        plog = state.log
        rng = plan_range(state, topic, info.partition, 0, info.last_stable_offset, "read_committed")
        files: list[tuple[str, int, int]] = []  # path, first offset, rows (an entry's offsets are consecutive)
        for i, batch in enumerate(read_range(plog, rng, max_batch_rows=1 << 62)):
            path = str(root / f"p{info.partition}-{i:05d}.arrow")
            arrays = [col.cast(f.type) for col, f in zip(batch.columns, schema, strict=True)]
            with pa.ipc.new_file(path, schema) as writer:
                writer.write_batch(pa.RecordBatch.from_arrays(arrays, schema=schema))
            files.append((path, batch.column("_offset")[0].as_py(), batch.num_rows))
        for piece in split_range(plog, rng, math.ceil(rng.size / OFFSETS_PER_TASK)):
            tasks.append(
                [
                    (path, max(piece.start - first, 0), min(piece.end - first, n))
                    for path, first, n in files
                    if first < piece.end and first + n > piece.start
                ]
            )
    manifest = root / "manifest.json"
    manifest.write_text(json.dumps(tasks))
    return str(manifest)


# --- the benchmark ---------------------------------------------------------------------------------


def timed_stream(spark: Any, df: Any, checkpoint: str) -> tuple[float, int]:
    """Seconds and rows of reading ``df`` to its end into ``noop``. The JVM collects its garbage first, so
    a query does not pay for the one before it (each source follows another in a round)."""
    spark.sparkContext._jvm.System.gc()
    start = time.perf_counter()
    q = df.writeStream.format("noop").option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
    q.awaitTermination()
    elapsed = time.perf_counter() - start
    return elapsed, sum(p["numInputRows"] for p in q.recentProgress)


def bare_peer(kind: str) -> str:
    """The bare source a txnlog source ``kind`` is measured against (the one with the same columns)."""
    return "bare_nometa" if kind.endswith("_nometa") else "bare"


SOURCES = {
    "parquet": "parquet (Spark built-in)",
    "bare": "bare Python Arrow source, 4 metadata columns",
    "txnlog": "txnlog, read_committed",
    "bare_nometa": "bare Python Arrow source, no metadata",
    "txnlog_nometa": "txnlog, read_committed, `includeMetadata=false`",
}
COPIES = {
    "copy_parquet": "parquet -> parquet (Spark built-in, not exactly-once)",
    "copy_txnlog": "txnlog -> txnlog, exactly-once",
    "copy_txnlog_nometa": "txnlog -> txnlog, exactly-once, `includeMetadata=false`",
}


@pytest.mark.bench
@pytest.mark.spark
def test_bench_txnlog_source_vs_bare_python_source_and_parquet(spark: Any, tmp_path: Path) -> None:
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # type: ignore[no-untyped-call]
    spark.dataSource.register(BareArrowSource)
    t0 = time.perf_counter()
    log, parquet_dir, files = write_input(tmp_path)
    (tmp_path / "bare").mkdir()
    manifest = write_bare_files(log, "in", tmp_path / "bare")
    written = time.perf_counter() - t0
    offsets_per_trigger = math.ceil((ROWS + files * PARTITIONS) / BATCHES)  # one marker per partition and chunk
    files_per_trigger = math.ceil(files / BATCHES)

    def source(kind: str) -> Any:
        if kind == "parquet":
            return spark.readStream.schema(TOPIC_COLUMNS).parquet(parquet_dir)
        metadata = "false" if kind.endswith("_nometa") else "true"
        if kind.startswith("bare"):
            return spark.readStream.format("bench_bare_arrow_source").option("includeMetadata", metadata).load(manifest)
        return (
            spark.readStream.format("txnlog")
            .option("topic", "in")
            .option("startingOffsets", "earliest")
            .option("includeMetadata", metadata)
            .load(log.url)
        )

    os.sync()  # the input was just written
    for kind, label in SOURCES.items():  # warm-up, not counted: the JVM compiles the read paths in the first run
        elapsed, rows = timed_stream(spark, source(kind), str(tmp_path / f"ck-{kind}-warm-up"))
        assert rows == ROWS, (kind, rows)
        print(f"warm-up: {label}: {elapsed:.2f} s")
    best: dict[str, float] = {}
    paired: dict[str, list[float]] = {"txnlog": [], "txnlog_nometa": []}  # each round's txnlog / bare ratio
    for r in range(ROUNDS):
        os.sync()  # the previous round's copies wrote ~3 GB: their writeback must not land in these reads
        times: dict[str, float] = {}
        for kind, label in SOURCES.items():
            elapsed, rows = timed_stream(spark, source(kind), str(tmp_path / f"ck-{kind}-{r}"))
            assert rows == ROWS, (kind, rows)  # every source reads every row (correctness, not time)
            best[kind] = min(best.get(kind, elapsed), elapsed)
            times[kind] = elapsed
            print(f"round {r + 1}: {label}: {elapsed:.2f} s")
        for kind, ratios in paired.items():
            ratios.append(times[bare_peer(kind)] / times[kind])
        for kind, label in COPIES.items():
            name = f"{kind}{r}"
            if kind == "copy_parquet":
                q = parquet_copy(spark, parquet_dir, tmp_path, name, files_per_trigger)
            else:
                stats = tmp_path / f"stats-{name}"
                q = txnlog_copy(spark, log, tmp_path, name, offsets_per_trigger, stats, kind == "copy_txnlog")
            elapsed, rows, batches = timed(q)
            assert rows == ROWS, (kind, rows)
            best[kind] = min(best.get(kind, elapsed), elapsed)
            print(f"round {r + 1}: {label}: {elapsed:.2f} s, {batches} micro-batches")

    def rate(kind: str) -> float:
        return ROWS / best[kind]

    print(
        f"\n{ROWS:,} rows (id LONG, key STRING x1,000, value STRING 100 hex x100,000), {PARTITIONS} partitions, "
        f"data written in {written:.1f} s; Spark local[2]; best of {ROUNDS} runs each\n"
    )
    print("| source into noop | rows/s | vs bare Python source | vs parquet |\n|---|---:|---:|---:|")
    for kind, label in SOURCES.items():
        vs_bare = f"{rate(kind) / rate(bare_peer(kind)):.2f}x" if kind != "parquet" else ""
        print(f"| {label} | {rate(kind) / 1e6:.2f}M | {vs_bare} | {rate(kind) / rate('parquet'):.2f}x |")
    for kind, ratios in paired.items():
        print(f"{SOURCES[kind]} vs its bare peer, round by round: {', '.join(f'{x:.2f}x' for x in ratios)}")
    print(f"\n| stream copy, {BATCHES} micro-batches | rows/s | vs parquet -> parquet |\n|---|---:|---:|")
    for kind, label in COPIES.items():
        print(f"| {label} | {rate(kind) / 1e6:.2f}M | {rate(kind) / rate('copy_parquet'):.2f}x |")


# --- what one task holds ---------------------------------------------------------------------------

#: Size of the partition the memory measurement reads in one task.
RSS_PARTITION_BYTES = int(os.environ.get("TXNLOG_BENCH_RSS_BYTES", str(1 << 30)))


def peak_rss_kib() -> int:
    """This process's peak resident set size. ``VmHWM``, not ``ru_maxrss``: Linux carries ru_maxrss over
    an exec, so a child would report its parent's (pytest's) peak."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))


def read_whole_partition(url: str) -> None:
    """(Child process) read partition 0 of topic ``big`` as ONE planned range with the task's code, hand
    every batch on as PySpark's worker does, and print the rows and the peak RSS before and after."""
    from pyspark.sql.conversion import ArrowBatchTransformer

    from spark_txn_source.options import parse_options
    from spark_txn_source.reader import RangePartition, read_partition, source_schema

    options = {"path": url, "topic": "big"}
    opts, schema = parse_options(options, streaming=False), source_schema(options)
    state = txn_core.open_log(url).partition_state(paths.partition_log_path("big", 0))
    rng = plan_range(state, "big", 0, 0, available_end(state, READ_COMMITTED), READ_COMMITTED)
    before = peak_rss_kib()
    rows = 0
    writer = None
    with open(os.devnull, "wb") as sink:
        for batch in read_partition(opts, schema, RangePartition(rng)):
            rows += batch.num_rows
            wrapped = ArrowBatchTransformer.wrap_struct(batch)
            if writer is None:
                writer = pa.ipc.new_stream(pa.PythonFile(sink), wrapped.schema)
            writer.write_batch(wrapped)
        if writer is not None:
            writer.close()
    print(json.dumps({"rows": rows, "rss_before_kb": before, "rss_peak_kb": peak_rss_kib()}))


@pytest.mark.bench
def test_bench_task_memory_reading_a_1gb_partition(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/log"
    log = txn_core.open_log(url)
    log.create_topic("big", 1, SCHEMA)
    producer = log.producer("bench-big")
    producer.init_transactions()
    written = rows = 0
    for table in chunks(1 << 40):  # transactions of a chunk each, entries of 125k rows (as in the source bench)
        if written >= RSS_PARTITION_BYTES:
            break
        producer.begin_transaction()
        for piece in table.to_batches(max_chunksize=125_000):
            producer.send("big", pa.Table.from_batches([piece]), partition=0)
        producer.commit_transaction()
        written += table.nbytes
        rows += table.num_rows
    producer.close()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), *sys.path])}
    out = subprocess.run(
        [sys.executable, __file__, url], capture_output=True, text=True, check=True, env=env, timeout=600
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["rows"] == rows  # every row read (correctness, not memory)
    print(
        f"\none task reading a {written / 2**30:.2f} GiB partition ({rows:,} rows) as one range: peak RSS "
        f"{got['rss_peak_kb'] / 1024:.0f} MiB ({got['rss_before_kb'] / 1024:.0f} MiB before reading)"
    )


if __name__ == "__main__":
    read_whole_partition(sys.argv[1])
