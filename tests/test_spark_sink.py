"""The Spark sink in a real SparkSession (local[2]): exactly-once micro-batches, replays, failures, options.

Input comes from ``sinktest_counter`` (tests/sink_sources.py), whose batch ``b`` always holds ids
``[b * perBatch, (b + 1) * perBatch)``; output is read back with the core read_committed consumer.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import sink_sources
from sink_helpers import duplicates, garbage, ids, open_transactions, read_topic, staged_objects

import txn_core
from txn_core.clients.routing import partition_for

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def sspark(spark: Any) -> Any:
    sink_sources.register(spark)
    return spark


def start_copy(
    spark: Any,
    url: str,
    checkpoint: Path,
    *,
    total: int,
    per_batch: int,
    topic: str = "out",
    extra: dict[str, str] | None = None,
    select: str | None = None,
) -> Any:
    """Run the counter -> txnlog stream with availableNow until it ends; returns the query."""
    df = spark.readStream.format("sinktest_counter").option("total", total).option("perBatch", per_batch).load()
    if select:
        df = df.selectExpr(*select.split(";"))
    writer = (
        df.writeStream.format("txnlog")
        .option("checkpointLocation", str(checkpoint))
        .option("topic", topic)
        .trigger(availableNow=True)
    )
    for k, v in (extra or {}).items():
        writer = writer.option(k, v)
    return writer.start(url)


def run_copy(spark: Any, url: str, checkpoint: Path, **kw: Any) -> None:
    q = start_copy(spark, url, checkpoint, **kw)
    q.awaitTermination()


def run_copy_failing(spark: Any, url: str, checkpoint: Path, **kw: Any) -> str:
    q = start_copy(spark, url, checkpoint, **kw)
    with pytest.raises(Exception) as info:
        q.awaitTermination()
    return str(info.value)


def progress(log: txn_core.Log, checkpoint: Path) -> dict[str, Any]:
    query_id = json.loads((checkpoint / "metadata").read_text())["id"]
    value = log.transaction_metadata(f"spark-sink-{query_id}")
    assert value is not None
    assert value["query_id"] == query_id
    return value


def test_each_micro_batch_is_one_transaction_routed_by_key(sspark: Any, log: txn_core.Log, tmp_path: Path) -> None:
    run_copy(sspark, log.url, tmp_path / "chk", total=60, per_batch=20, extra={"partitions": "3", "keyColumn": "key"})
    out = read_topic(log, "out")
    assert ids(out) == list(range(60))
    for key, part in zip(out.column("key").to_pylist(), out.column("_partition").to_pylist(), strict=True):
        assert part == partition_for(key, 3)
    assert progress(log, tmp_path / "chk")["batch_id"] == 2
    # the last batch's markers, which no later batch carries, are written alone after their linger
    deadline = time.monotonic() + 10
    while [p.committed_transactions for p in log.describe_topic("out").partitions] != [3, 3, 3]:
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert [p.committed_transactions for p in log.describe_topic("out").partitions] == [3, 3, 3], (
        "3 micro-batches, each one transaction over every partition"
    )
    assert garbage(log, "out") == [], "committed batches leave no staged garbage"
    assert open_transactions(log, "out") == []
    assert log.topics.get("out").schema == pa.schema([("id", pa.int64()), ("key", pa.string()), ("value", pa.string())])


def test_replayed_batch_after_lost_commit_log_entry_is_a_noop(sspark: Any, log: txn_core.Log, tmp_path: Path) -> None:
    chk = tmp_path / "chk"
    stats = tmp_path / "stats"
    run_copy(sspark, log.url, chk, total=60, per_batch=20, extra={"partitions": "2", "testing.stats": str(stats)})
    # Spark's crash window: the sink committed batch 2, but commits/2 never reached the checkpoint.
    (chk / "commits" / "2").unlink()
    (chk / "commits" / ".2.crc").unlink(missing_ok=True)
    run_copy(sspark, log.url, chk, total=60, per_batch=20, extra={"testing.stats": str(stats)})
    out = read_topic(log, "out")
    assert ids(out) == list(range(60)), duplicates(ids(out))
    query_id = json.loads((chk / "metadata").read_text())["id"]
    replay = json.loads((stats / f"{query_id}.2.json").read_text())
    assert replay["outcome"] == "replayed", "batch 2 ran again and its commit was a no-op"
    assert progress(log, chk)["batch_id"] == 2
    assert garbage(log, "out") == [], "the replay deleted the objects its tasks staged"


def test_commit_failure_is_aborted_by_spark_and_restart_commits_once(
    sspark: Any, log: txn_core.Log, tmp_path: Path
) -> None:
    chk = tmp_path / "chk"
    err = run_copy_failing(
        sspark, log.url, chk, total=60, per_batch=20, extra={"partitions": "2", "testing.fault": "before_commit@1"}
    )
    assert "injected fault 'before_commit' in batch 1" in err
    assert ids(read_topic(log, "out")) == list(range(20)), "batch 1 sent its references but never committed"
    assert open_transactions(log, "out") == [], "Spark's abort settled the transaction at once"
    assert garbage(log, "out") == [], "abort deleted the batch's staged objects and manifest"
    run_copy(sspark, log.url, chk, total=60, per_batch=20)
    out = read_topic(log, "out")
    assert ids(out) == list(range(60)), duplicates(ids(out))


def test_commit_failing_after_its_commit_point_keeps_the_batch(sspark: Any, log: txn_core.Log, tmp_path: Path) -> None:
    chk = tmp_path / "chk"
    err = run_copy_failing(
        sspark, log.url, chk, total=60, per_batch=20, extra={"partitions": "2", "testing.fault": "after_prepare@1"}
    )
    assert "injected fault 'after_prepare' in batch 1" in err
    # PrepareCommit was durable: the batch is committed although commit() raised and Spark called
    # abort(); abort must see that and keep the staged objects (they are data now).
    assert ids(read_topic(log, "out")) == list(range(40))
    assert any("_manifest-" in k for k in garbage(log, "out")), "cleanup of batch 1 never ran"
    run_copy(sspark, log.url, chk, total=60, per_batch=20)
    out = read_topic(log, "out")
    assert ids(out) == list(range(60)), duplicates(ids(out))
    assert garbage(log, "out") == [], "the replay of batch 1 finished its cleanup from the manifest"


def test_failing_task_aborts_the_batch_and_its_staged_data_never_shows(
    sspark: Any, log: txn_core.Log, tmp_path: Path
) -> None:
    chk = tmp_path / "chk"
    err = run_copy_failing(
        sspark, log.url, chk, total=60, per_batch=20, extra={"partitions": "2", "testing.fault": "write@1"}
    )
    assert "injected fault 'write' in batch 1" in err
    assert ids(read_topic(log, "out")) == list(range(20))
    assert garbage(log, "out") != [], "the failed attempt's objects stay until the batch commits"
    run_copy(sspark, log.url, chk, total=60, per_batch=20)
    out = read_topic(log, "out")
    assert ids(out) == list(range(60)), duplicates(ids(out))
    assert garbage(log, "out") == [], "the replay's committer removed the failed attempt's objects"


def test_source_metadata_columns_are_ignored(sspark: Any, log: txn_core.Log, tmp_path: Path) -> None:
    log.create_topic("out", 2, pa.schema([("id", pa.int64()), ("value", pa.string())]))
    run_copy(
        sspark,
        log.url,
        tmp_path / "chk",
        total=10,
        per_batch=10,
        select="id;value;'t' as _topic;0 as _partition;id as _offset;current_timestamp() as _timestamp",
    )
    assert ids(read_topic(log, "out")) == list(range(10))


@pytest.mark.parametrize(
    ("select", "problem"),
    [
        ("id;value;current_timestamp() as _timestamp", "_topic is missing; _partition is missing; _offset is missing"),
        ("id;value;'t' as _topic;0 as _partition;id as _offset", "_timestamp is missing"),
    ],
)
def test_a_stream_with_its_own_metadata_named_column_is_refused_before_anything_is_written(
    sspark: Any, log: txn_core.Log, tmp_path: Path, select: str, problem: str
) -> None:
    """A column named like a metadata column is the user's own unless the frame carries the source's whole set
    (each once): refused, not dropped."""
    log.create_topic("out", 2, pa.schema([("id", pa.int64()), ("value", pa.string())]))
    err = run_copy_failing(sspark, log.url, tmp_path / "chk", total=10, per_batch=10, select=select)
    assert problem in err and "withColumnRenamed(" in err
    assert read_topic(log, "out").num_rows == 0
    assert staged_objects(log) == []


def test_a_batch_write_of_a_users_own_timestamp_column_is_refused_not_dropped(sspark: Any, log: txn_core.Log) -> None:
    """The user's repro: ``_timestamp`` of a frame that never saw a txnlog source was dropped, and the topic
    created without it."""
    df = sspark.sql("SELECT 1L AS id, TIMESTAMP '2024-01-01 00:00:00' AS _timestamp")
    writer = df.write.format("txnlog").mode("append").option("topic", "events").option("partitions", "1")
    with pytest.raises(Exception, match=r"the frame has column\(s\) \['_timestamp'\]") as info:
        writer.save(log.url)
    assert "df.withColumnRenamed('_timestamp', 'event_timestamp')" in str(info.value)
    assert "events" not in log.list_topics()
    df.withColumnRenamed("_timestamp", "event_timestamp").write.format("txnlog").mode("append").option(
        "topic", "events"
    ).option("partitions", "1").save(log.url)
    out = read_topic(log, "events")
    assert out.column_names[:2] == ["id", "event_timestamp"] and out.column("event_timestamp").null_count == 0


def test_a_key_column_rows_cannot_be_routed_by_is_refused_before_any_task(sspark: Any, log: txn_core.Log) -> None:
    """A struct key failed inside every task with pyarrow's ArrowNotImplementedError (dictionary_encode)."""
    df = sspark.sql("SELECT id, named_struct('a', cast(id AS int)) AS k FROM range(3)")
    writer = df.write.format("txnlog").mode("append").option("topic", "keyed").option("partitions", "2")
    with pytest.raises(Exception, match=r"keyColumn 'k' has type struct<a: int32>") as info:
        writer.option("keyColumn", "k").save(log.url)
    assert "F.to_json('k')" in str(info.value) and "ArrowNotImplementedError" not in str(info.value)
    assert "keyed" not in log.list_topics()
    df.selectExpr("id", "k", "to_json(k) AS k_key").write.format("txnlog").mode("append").option(
        "topic", "keyed"
    ).option("partitions", "2").option("keyColumn", "k_key").save(log.url)
    assert sorted(ids(read_topic(log, "keyed"))) == [0, 1, 2]


def test_schema_mismatch_fails_before_anything_is_written(sspark: Any, log: txn_core.Log, tmp_path: Path) -> None:
    log.create_topic("out", 2, pa.schema([("id", pa.int64()), ("value", pa.int32())]))
    err = run_copy_failing(sspark, log.url, tmp_path / "chk", total=10, per_batch=10, select="id;key;value")
    assert "column 'value' has type string, the topic expects int32" in err
    assert "column 'key' is not in the topic schema" in err
    assert read_topic(log, "out").num_rows == 0
    assert staged_objects(log) == []


def test_missing_topic_without_partitions_is_a_clear_error(sspark: Any, log: txn_core.Log, tmp_path: Path) -> None:
    err = run_copy_failing(sspark, log.url, tmp_path / "chk", total=10, per_batch=10, topic="nope")
    assert "unknown topic 'nope'" in err
    assert ".option('partitions', N)" in err


def test_complete_output_mode_is_refused(sspark: Any, log: txn_core.Log, tmp_path: Path) -> None:
    df = sspark.readStream.format("sinktest_counter").option("total", 10).load().groupBy("key").count()
    q = (
        df.writeStream.format("txnlog")
        .outputMode("complete")
        .option("checkpointLocation", str(tmp_path / "c"))
        .option("topic", "counts")
        .option("partitions", "1")
        .trigger(availableNow=True)
        .start(log.url)
    )
    with pytest.raises(Exception, match=r"outputMode\('append'\) only"):
        q.awaitTermination()


def test_batch_append_is_one_transaction(sspark: Any, log: txn_core.Log) -> None:
    df = sspark.range(0, 1000, numPartitions=4).selectExpr("id", "cast(id % 10 as string) as key")
    df.write.format("txnlog").mode("append").option("topic", "b").option("partitions", "3").option(
        "keyColumn", "key"
    ).option("transactionalId", "loader").save(log.url)
    out = read_topic(log, "b")
    assert ids(out) == list(range(1000))
    meta = log.transaction_metadata("loader")
    assert meta is not None and meta["rows"] == 1000
    assert garbage(log, "b") == []
    # every row landed in one transaction: one commit marker per partition
    assert all(p.committed_transactions == 1 for p in log.describe_topic("b").partitions)


@pytest.mark.parametrize(
    ("mode", "options", "message"),
    [
        ("overwrite", {}, r"mode\('append'\) only"),
        ("append", {"topic": "b,c"}, "names several topics, but a txnlog write goes to one topic"),
        ("append", {"keyColum": "id"}, r"unknown txnlog sink option\(s\) \['keycolum'\]"),
        ("append", {"partitions": "zero"}, "'partitions' must be an integer"),
    ],
)
def test_bad_batch_writes_fail_with_a_clear_message(
    sspark: Any, log: txn_core.Log, mode: str, options: dict[str, str], message: str
) -> None:
    writer = sspark.range(3).write.format("txnlog").mode(mode).option("topic", "b").option("partitions", "1")
    for k, v in options.items():
        writer = writer.option(k, v)
    with pytest.raises(Exception, match=message):
        writer.save(log.url)
    assert "b" not in log.list_topics() or read_topic(log, "b").num_rows == 0


@pytest.mark.s3
@pytest.mark.slow
def test_stream_to_an_object_store_log_with_storage_options(sspark: Any, moto_s3: Any, tmp_path: Path) -> None:
    bucket = moto_s3.new_bucket()
    url = f"s3://{bucket}/log"
    so = moto_s3.storage_options()
    extra = {
        "partitions": "2",
        "keyColumn": "key",
        "storage.key": so["key"],
        "storage.secret": so["secret"],
        "storage.client_kwargs": json.dumps(so["client_kwargs"]),
    }
    run_copy(sspark, url, tmp_path / "chk", total=40, per_batch=20, extra=extra)
    log = txn_core.open_log(url, so)
    out = read_topic(log, "out")
    assert ids(out) == list(range(40)), duplicates(ids(out))
    assert garbage(log, "out") == []
