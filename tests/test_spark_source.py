"""The txnlog source in Spark (local[2]): batch reads, streaming under concurrent transactions, restarts,
AvailableNow with rate limits, errors at query start, and Spark Connect.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import txn_core
from txn_core.format import paths

pytestmark = pytest.mark.spark

SCHEMA = pa.schema([("id", pa.int64()), ("txn", pa.string())])


def new_log(tmp_path: Path, partitions: int = 2) -> tuple[str, txn_core.Log]:
    url = f"file://{tmp_path}/log"
    log = txn_core.open_log(url)
    log.create_topic("t", partitions, SCHEMA)
    return url, log


def send(p: txn_core.Producer, ids: list[int], label: str, partition: int) -> None:
    p.send("t", pa.table({"id": ids, "txn": [label] * len(ids)}, schema=SCHEMA), partition=partition)


def transactional(log: txn_core.Log, tid: str, timeout_ms: int = 60_000) -> txn_core.Producer:
    p = log.producer(tid, transaction_timeout_ms=timeout_ms)
    p.init_transactions()
    return p


class Collector:
    """A foreachBatch sink keeping each batch's rows by batch id (a replayed batch replaces its first run)."""

    def __init__(self, check: Any = None) -> None:
        self.batches: dict[int, list[tuple[int, str, int, int]]] = {}
        self.check = check
        self.errors: list[str] = []

    def __call__(self, df: Any, batch_id: int) -> None:
        rows = [
            (r.id, r.txn, r._partition, r._offset) for r in df.select("id", "txn", "_partition", "_offset").collect()
        ]
        if self.check is not None:
            self.errors.extend(self.check(rows))
        self.batches[batch_id] = rows

    def ids(self) -> list[int]:
        return [r[0] for rows in self.batches.values() for r in rows]


def stream(spark: Any, url: str, **options: str) -> Any:
    reader = spark.readStream.format("txnlog").option("topic", "t").option("startingOffsets", "earliest")
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load(url)


def available_now(frame: Any, name: str, checkpoint: Path) -> Any:
    """Start ``frame`` into the in-memory table ``name`` with Trigger.AvailableNow; returns the query."""
    return (
        frame.writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )


# --- batch -----------------------------------------------------------------------------------------


def test_batch_read_returns_committed_rows_within_offsets_and_applies_pushed_filters(
    spark: Any, tmp_path: Path
) -> None:
    url, log = new_log(tmp_path)
    p = transactional(log, "w")
    for i in range(4):
        p.begin_transaction()
        send(p, list(range(i * 10, i * 10 + 10)), f"c{i}", partition=i % 2)
        p.commit_transaction()
    p.begin_transaction()
    send(p, [-1, -2], "aborted", partition=0)
    p.abort_transaction()
    p.begin_transaction()
    send(p, [-3], "open", partition=1)  # still open: past the last stable offset
    p.flush()
    df = spark.read.format("txnlog").option("topic", "t").load(url)
    rows = df.collect()
    assert sorted(r.id for r in rows) == list(range(40))
    assert {r._topic for r in rows} == {"t"}
    by_offset = {(r._partition, r._offset): r.id for r in rows}
    assert by_offset[(0, 0)] == 0 and by_offset[(1, 11)] == 30  # offset 10 of partition 1 is a commit marker

    ranged = (
        spark.read.format("txnlog")
        .option("topic", "t")
        .option("startingOffsets", '{"t": {"0": 5, "1": -2}}')
        .option("endingOffsets", '{"t": {"0": 15, "1": 3}}')
        .load(url)
    )
    assert sorted(r.id for r in ranged.collect()) == [5, 6, 7, 8, 9, 10, 11, 12, 20, 21, 22, 23]

    filtered = df.where("_partition = 1 AND _offset >= 5 AND _offset < 13")
    assert sorted(r.id for r in filtered.collect()) == [15, 16, 17, 18, 19, 30, 31]
    first_ts = min(r._timestamp for r in rows if r.id == 20)
    later = df.where(df._timestamp >= first_ts).where("_partition = 1")
    assert sorted(r.id for r in later.collect()) == sorted(
        r.id for r in rows if r._partition == 1 and r._timestamp >= first_ts
    )
    plan = filtered._jdf.queryExecution().executedPlan().toString()
    assert "Filter" in plan.split("BatchScan")[0]  # applied by Spark, not pushed (batch.PUSHDOWN_NARROWS_PLANS)


@pytest.mark.spark
def test_a_filtered_scan_does_not_narrow_the_other_scans_of_the_same_dataframe(spark: Any, tmp_path: Path) -> None:
    """With filter pushdown on (as in these tests), PySpark 4.3 keeps the read its pushdown step planned on
    the data source object every scan of a DataFrame, view or table shares: a filter on ``_partition``
    pushed by one scan narrowed the others, in the same query and in later ones (wrong counts, no error)."""
    url, log = new_log(tmp_path)
    p = transactional(log, "w")
    p.begin_transaction()
    send(p, list(range(10)), "a", partition=0)
    send(p, list(range(10, 30)), "b", partition=1)
    p.commit_transaction()
    df = spark.read.format("txnlog").option("topic", "t").load(url)
    p0 = df.where("_partition = 0")
    assert df.union(p0).count() == 40
    assert df.join(p0, "id", "left_anti").count() == 20
    assert p0.count() == 10 and df.count() == 30
    assert sorted(tuple(r) for r in df.groupBy("_partition").count().collect()) == [(0, 10), (1, 20)]
    df.createOrReplaceTempView("both_partitions")
    union = "SELECT id FROM both_partitions UNION ALL SELECT id FROM both_partitions WHERE _partition = 1"
    assert spark.sql(union).count() == 50
    assert spark.sql("SELECT count(*) FROM both_partitions").first()[0] == 30


# --- streaming -------------------------------------------------------------------------------------


def test_stream_under_concurrent_commits_aborts_and_a_dead_producer_sees_every_committed_row_once(
    spark: Any, tmp_path: Path
) -> None:
    url, _ = new_log(tmp_path, partitions=3)
    committing: set[str] = set()  # a transaction's label is added before its commit starts
    committed: set[int] = set()
    aborted: set[int] = set()
    lock = threading.Lock()

    def check(rows: list[tuple[int, str, int, int]]) -> list[str]:
        with lock:
            return [f"row {r} of a transaction not committing at the time" for r in rows if r[1] not in committing]

    # A producer that dies with its transaction open: it must hold the stream no longer than its timeout.
    dead = transactional(txn_core.open_log(url), "dead", timeout_ms=3_000)
    dead.begin_transaction()
    send(dead, [-999], "dead", partition=0)
    dead.flush()
    aborted.add(-999)

    sink = Collector(check)
    query = (
        stream(spark, url, maxOffsetsPerTrigger="150")
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )

    def produce(worker: int) -> None:
        p = transactional(txn_core.open_log(url), f"w{worker}")
        for n in range(12):
            label = f"w{worker}-{n}"
            ids = [worker * 100_000 + n * 100 + k for k in range(20)]
            p.begin_transaction()
            for part in range(3):
                send(p, ids[part::3], label, partition=part)
                p.flush()
            if (n + worker) % 3 == 0:
                p.abort_transaction()
                with lock:
                    aborted.update(ids)
            else:
                with lock:
                    committing.add(label)
                p.commit_transaction()
                with lock:
                    committed.update(ids)
            time.sleep(0.05)

    threads = [threading.Thread(target=produce, args=(w,)) for w in range(3)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        deadline = time.monotonic() + 90
        while len(set(sink.ids())) < len(committed) and time.monotonic() < deadline and query.isActive:
            time.sleep(0.5)
    finally:
        query.stop()
    assert not sink.errors, sink.errors[:3]
    ids = sink.ids()
    assert len(ids) == len(set(ids)), "a row was delivered twice"
    assert set(ids) == committed
    assert not set(ids) & aborted
    rows = [r for rows in sink.batches.values() for r in rows]
    for part in range(3):  # per partition, offsets strictly increase across batches
        offsets = [
            r[3] for b in sorted(sink.batches) for r in sorted(sink.batches[b], key=lambda r: r[3]) if r[2] == part
        ]
        assert offsets == sorted(offsets)
    assert len(rows) == len(committed)


def test_restart_from_a_checkpoint_resumes_exactly_where_it_stopped_and_replays_a_batch_identically(
    spark: Any, tmp_path: Path
) -> None:
    url, log = new_log(tmp_path)
    p = transactional(log, "w")
    next_id = 0

    def commit_rows(n: int) -> None:
        nonlocal next_id
        p.begin_transaction()
        for part in range(2):
            send(p, list(range(next_id, next_id + n)), "c", partition=part)
            next_id += n
        p.commit_transaction()

    for _ in range(3):
        commit_rows(20)
    p.wait_for_markers()  # the last transaction's markers too: the end offsets below are then fixed
    ck = tmp_path / "ck"
    sink = Collector()

    def run() -> Any:
        q = (
            stream(spark, url, maxOffsetsPerTrigger="30")
            .writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(ck))
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination()
        return q

    first = run()
    assert len(sink.batches) >= 4 and sorted(sink.ids()) == list(range(next_id))
    last_end = json.loads(first.lastProgress["sources"][0]["endOffset"])
    # 60 records; the first two transactions' markers travel in the next one's entries, the last one's alone
    assert last_end["topics"] == {"t": {"0": 61, "1": 61}}

    commit_rows(15)
    second = run()
    resumed = json.loads(second.recentProgress[0]["sources"][0]["startOffset"])
    assert resumed == last_end  # starts exactly where the previous run ended
    assert sorted(sink.ids()) == list(range(next_id))

    # Crash after batch N's data was processed but before Spark recorded it: batch N runs again, planned
    # by a new driver, and must read exactly the same rows.
    last = max(sink.batches)
    before = sorted(sink.batches[last])
    for name in (str(last), f".{last}.crc"):  # the commit record and Hadoop's checksum of it
        (ck / "commits" / name).unlink(missing_ok=True)
    commit_rows(5)  # newer data must not leak into the replayed batch
    run()
    assert sorted(sink.batches[last]) == before
    ids = sink.ids()
    assert len(ids) == len(set(ids)) and sorted(ids) == list(range(next_id))


def test_available_now_with_max_offsets_runs_several_batches_and_reports_the_backlog(
    spark: Any, tmp_path: Path
) -> None:
    url, log = new_log(tmp_path)
    p = log.producer()
    for part in range(2):
        send(p, list(range(part * 50, part * 50 + 50)), "plain", partition=part)
    p.flush()
    q = available_now(stream(spark, url, maxOffsetsPerTrigger="25"), "avail_now", tmp_path / "ck")
    q.awaitTermination()
    progress = [x for x in q.recentProgress if x["numInputRows"]]
    assert [x["numInputRows"] for x in progress] == [25, 25, 25, 25]
    first = progress[0]["sources"][0]
    assert json.loads(first["latestOffset"])["topics"] == {"t": {"0": 50, "1": 50}}  # the true end, from batch 0
    assert json.loads(first["endOffset"])["topics"] == {"t": {"0": 12, "1": 13}}  # fair split of 25
    assert spark.sql("SELECT count(DISTINCT id) AS n FROM avail_now").first().n == 100


# --- damage (txn_core PROTOCOL.md "Damage") -----------------------------------------------------------


def test_a_damaged_entry_fails_batch_and_stream_reads_naming_it_unless_fail_on_data_loss_is_false(
    spark: Any, tmp_path: Path
) -> None:
    url, log = new_log(tmp_path, partitions=1)
    p = log.producer()
    for n in range(3):
        send(p, [2 * n, 2 * n + 1], "plain", partition=0)
        p.flush()
    key = paths.entries(paths.partition_log_path("t", 0)) + paths.slot_name(1)
    entry = tmp_path / "log" / key
    data = bytearray(entry.read_bytes())
    data[20] ^= 0x01  # the middle entry's header checksum no longer matches
    entry.write_bytes(bytes(data))
    named = f"{key} is damaged.*failOnDataLoss=false"

    with pytest.raises(Exception, match=named):
        spark.read.format("txnlog").option("topic", "t").load(url).collect()
    lenient = spark.read.format("txnlog").option("topic", "t").option("failOnDataLoss", "false").load(url)
    assert sorted(r.id for r in lenient.collect()) == [0, 1, 4, 5]

    skipping = available_now(stream(spark, url, failOnDataLoss="false"), "damage_skipped", tmp_path / "ck-skip")
    skipping.awaitTermination(120)
    assert sorted(r.id for r in spark.sql("SELECT id FROM damage_skipped").collect()) == [0, 1, 4, 5]
    stopping = available_now(stream(spark, url), "damage_stopped", tmp_path / "ck-stop")
    with pytest.raises(Exception, match=named):
        stopping.awaitTermination(120)  # once everything before the damaged entry was read
    assert sorted(r.id for r in spark.sql("SELECT id FROM damage_stopped").collect()) == [0, 1]


# --- errors at query start ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "pattern"),
    [
        ({"fooBar": "1"}, "unknown option 'foobar'"),
        (
            {"startingOffsets": "newest"},
            "option 'startingOffsets' = 'newest' is not valid; accepted values: earliest",
        ),
        ({"topic": "nope"}, "unknown topic 'nope'; existing topics: t"),
        ({"endingOffsets": "latest"}, "'endingOffsets' applies to batch reads"),
    ],
)
def test_a_bad_option_fails_the_query_at_start_with_a_clear_error(
    spark: Any, tmp_path: Path, options: dict[str, str], pattern: str
) -> None:
    url, _ = new_log(tmp_path)
    with pytest.raises(Exception, match=pattern):
        stream(spark, url, **options).writeStream.format("noop").option(
            "checkpointLocation", str(tmp_path / "ck")
        ).start().awaitTermination(60)


def test_a_read_schema_retyping_a_topic_column_is_refused_before_any_task(spark: Any, tmp_path: Path) -> None:
    """The user's repro: ``.schema("id timestamp")`` on a bigint column read wrong instants (and a string gave
    text); now the read fails while Spark creates the reader, naming the column, both types and the fix."""
    url, log = new_log(tmp_path)
    with log.producer() as p:
        send(p, [1], "a", 0)
    jobs = spark.sparkContext.statusTracker().getJobIdsForGroup()
    for wanted in ("timestamp", "string"):
        df = spark.read.format("txnlog").schema(f"id {wanted}").option("topic", "t").load(url)
        with pytest.raises(Exception, match=f"column 'id' is requested as {wanted}, the topics store bigint") as info:
            df.collect()
        assert "Failed to initialize Python data source reader" in str(info.value)  # planning, not a task
        assert "Drop .schema(...)" in str(info.value)
    assert spark.sparkContext.statusTracker().getJobIdsForGroup() == jobs  # no Spark job ran
    df = spark.read.format("txnlog").schema("id bigint not null, txn string").option("topic", "t").load(url)
    assert [tuple(r) for r in df.collect()] == [(1, "a")]  # the topic's own types read as before


# --- other deployments: S3 through storage options, Spark Connect, executors in separate processes ----


def test_a_log_on_s3_is_read_with_storage_options_passed_to_every_executor(spark: Any, moto_s3: Any) -> None:
    url = f"s3://{moto_s3.new_bucket()}/log"
    storage = moto_s3.storage_options()
    log = txn_core.open_log(url, storage)
    log.create_topic("t", 2, SCHEMA)
    p = transactional(log, "w")
    p.begin_transaction()
    send(p, [1, 2], "c", partition=0)
    send(p, [3], "c", partition=1)
    p.commit_transaction()
    reader = spark.read.format("txnlog").option("topic", "t")
    for key, value in storage.items():
        reader = reader.option(f"storage.{key}", json.dumps(value) if isinstance(value, dict) else value)
    assert sorted(r.id for r in reader.load(url).collect()) == [1, 2, 3]


OUT_OF_PROCESS_SCRIPT = textwrap.dedent("""
    import json, sys
    from pyspark.sql import SparkSession
    import spark_txn_source
    mode, url, ck = sys.argv[1:4]
    builder = SparkSession.builder.config("spark.sql.python.filterPushdown.enabled", "true")
    if mode == "connect":
        builder = builder.remote("local[2]")
    else:  # two executor JVMs, each with its own Python workers
        builder = builder.master("local-cluster[2,1,1024]").config("spark.ui.enabled", "false")
    spark = builder.getOrCreate()
    spark_txn_source.register(spark)
    batch = spark.read.format("txnlog").option("topic", "t").load(url)
    out = {"batch": sorted(r.id for r in batch.collect()),
           "filtered": sorted(r.id for r in batch.where("_partition = 1").collect())}
    q = (spark.readStream.format("txnlog").option("topic", "t").option("startingOffsets", "earliest")
         .option("maxOffsetsPerTrigger", "3").load(url)
         .writeStream.format("memory").queryName("out_of_process").option("checkpointLocation", ck)
         .trigger(availableNow=True).start())
    q.awaitTermination()
    out["stream"] = sorted(r.id for r in spark.sql("SELECT id FROM out_of_process").collect())
    print("RESULT " + json.dumps(out))
    spark.stop()
""")


def run_out_of_process(mode: str, tmp_path: Path) -> dict[str, list[int]]:
    """Batch, filtered and streaming reads in a fresh process (this one already has a classic session)."""
    url, log = new_log(tmp_path)
    p = transactional(log, "w")
    p.begin_transaction()
    send(p, [1, 2, 3], "c", partition=0)
    send(p, [4, 5], "c", partition=1)
    p.commit_transaction()
    p.begin_transaction()
    send(p, [-1], "a", partition=1)
    p.abort_transaction()
    script = tmp_path / "read_out_of_process.py"
    script.write_text(OUT_OF_PROCESS_SCRIPT)
    root = str(Path(__file__).parent.parent)
    env = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, str(script), mode, url, str(tmp_path / "ck")],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    lines = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    assert lines, done.stdout[-2000:] + done.stderr[-4000:]
    result: dict[str, list[int]] = json.loads(lines[0][len("RESULT ") :])
    return result


EXPECTED = {"batch": [1, 2, 3, 4, 5], "filtered": [4, 5], "stream": [1, 2, 3, 4, 5]}


@pytest.mark.slow
def test_reads_work_under_spark_connect(tmp_path: Path) -> None:
    assert run_out_of_process("connect", tmp_path) == EXPECTED


@pytest.mark.cluster
@pytest.mark.soak  # CI's cluster test copies txnlog to txnlog on separate executors: it reads there too
def test_reads_work_with_executors_in_separate_processes(tmp_path: Path) -> None:
    assert run_out_of_process("cluster", tmp_path) == EXPECTED


# --- chaos: many restarts while producers run ---------------------------------------------------------


@pytest.mark.chaos
def test_stopping_and_restarting_mid_stream_many_times_loses_and_duplicates_nothing(spark: Any, tmp_path: Path) -> None:
    url, _ = new_log(tmp_path, partitions=3)
    committed: set[int] = set()
    aborted: set[int] = set()
    stop = threading.Event()

    def produce(worker: int) -> None:
        p = transactional(txn_core.open_log(url), f"w{worker}")
        n = 0
        while not stop.is_set():
            ids = [worker * 1_000_000 + n * 10 + k for k in range(9)]
            p.begin_transaction()
            for part in range(3):
                send(p, ids[part::3], f"w{worker}-{n}", partition=part)
            if n % 4 == 3:
                p.abort_transaction()
                aborted.update(ids)
            else:
                p.commit_transaction()
                committed.update(ids)
            n += 1
            time.sleep(0.02)

    sink = Collector()
    ck = str(tmp_path / "ck")
    threads = [threading.Thread(target=produce, args=(w,)) for w in range(2)]
    for t in threads:
        t.start()
    try:
        for restart in range(6):
            q = (
                stream(spark, url, maxOffsetsPerTrigger="40")
                .writeStream.foreachBatch(sink)
                .option("checkpointLocation", ck)
                .trigger(processingTime="100 milliseconds")
                .start()
            )
            time.sleep(1.5 + restart * 0.37)
            q.stop()  # mid-batch or between batches: either must be safe
    finally:
        stop.set()
        for t in threads:
            t.join()
    q = (
        stream(spark, url)
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", ck)
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination()
    ids = sink.ids()
    assert len(ids) == len(set(ids)), "a row was delivered twice"
    assert set(ids) == committed
    assert not set(ids) & aborted


@pytest.mark.spark
def test_batch_reads_work_with_spark_default_settings(spark: Any, tmp_path: Path) -> None:
    """spark.sql.python.filterPushdown.enabled is false by default: reads must not require it."""
    url, log = new_log(tmp_path)
    p = transactional(log, "w")
    p.begin_transaction()
    send(p, [1, 2, 3], "a", partition=0)
    p.commit_transaction()
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "false")
    try:
        df = spark.read.format("txnlog").option("topic", "t").load(url)
        assert sorted(r.id for r in df.where("_offset >= 1").collect()) == [2, 3]
    finally:
        spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
