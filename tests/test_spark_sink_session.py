"""Settings Delta and Databricks users rely on: the session's checkpoint root, ``partitionBy``, stream-static joins.

* ``spark.sql.streaming.checkpointLocation`` (the session's root) instead of ``.option("checkpointLocation")``:
  Spark checkpoints a query at ``<root>/<queryName>`` (an unnamed one at ``<root>/<random UUID>``), and the
  sink is exactly-once there as with the option.
* ``partitionBy``: PySpark (4.3) shows a Python sink nothing of it; what each path does is pinned here.
* A stream-static join whose static side is a txnlog read: under Spark's default settings PySpark keeps the
  static side's planned read for the whole query; pinned here with the two workarounds the README gives.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import sink_sources
from sink_helpers import duplicates, garbage, ids, read_topic

import txn_core

pytestmark = pytest.mark.spark

ROOT_CONF = "spark.sql.streaming.checkpointLocation"
PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


@pytest.fixture(scope="module")
def sspark(spark: Any) -> Any:
    sink_sources.register(spark)
    return spark


@pytest.fixture
def root(sspark: Any, tmp_path: Path) -> Iterator[Path]:
    """The session's checkpoint root, set for one test."""
    path = tmp_path / "checkpoints"
    sspark.conf.set(ROOT_CONF, str(path))
    try:
        yield path
    finally:
        sspark.conf.unset(ROOT_CONF)


def commit_rows(log: txn_core.Log, *tables: tuple[str, pa.Table]) -> None:
    """Each ``(topic, rows)`` as one committed transaction of a core producer."""
    producer = log.producer("loader")
    producer.init_transactions()
    for topic, rows in tables:
        producer.begin_transaction()
        producer.send(topic, rows)
        producer.commit_transaction()
    producer.close()


def txnlog_stream(spark: Any, url: str, topic: str) -> Any:
    """The whole of ``topic`` as a stream, without the metadata columns."""
    reader = spark.readStream.format("txnlog").option("topic", topic).option("startingOffsets", "earliest")
    return reader.option("includeMetadata", "false").load(url)


def counter_stream(spark: Any, *, total: int, per_batch: int) -> Any:
    df = spark.readStream.format("sinktest_counter").option("total", total).option("perBatch", per_batch).load()
    return df.writeStream.format("txnlog").option("topic", "out").option("partitions", "2").trigger(availableNow=True)


def test_the_sessions_checkpoint_root_with_a_query_name_is_exactly_once_where_spark_checkpoints(
    sspark: Any, root: Path, log: txn_core.Log
) -> None:
    counter_stream(sspark, total=40, per_batch=20).queryName("orders_copy").start(log.url).awaitTermination()
    chk = root / "orders_copy"  # Spark's own location for a named query: <root>/<queryName>
    query_id = json.loads((chk / "metadata").read_text())["id"]
    progress = log.transaction_metadata(f"spark-sink-{query_id}")
    assert progress is not None and progress["batch_id"] == 1, "the sink's state is the checkpoint's query's"
    # Spark's crash window: the sink committed batch 1, but commits/1 never reached the checkpoint.
    (chk / "commits" / "1").unlink()
    (chk / "commits" / ".1.crc").unlink(missing_ok=True)
    counter_stream(sspark, total=60, per_batch=20).queryName("orders_copy").start(log.url).awaitTermination()
    out = read_topic(log, "out")
    assert ids(out) == list(range(60)), duplicates(ids(out))
    assert json.loads((chk / "metadata").read_text())["id"] == query_id, "the restart resumed the same query"
    assert garbage(log, "out") == []


def test_an_unnamed_query_under_the_sessions_root_commits_its_source_offsets_to_the_group(
    sspark: Any, root: Path, log: txn_core.Log
) -> None:
    """Spark checkpoints an unnamed query at ``<root>/<random UUID>``; with ``consumerGroup`` the commit reads
    the batch's source offsets from there."""
    schema = pa.schema([("id", pa.int64())])
    log.create_topic("in", 2, schema)
    commit_rows(log, ("in", pa.table({"id": list(range(25))}, schema=schema)))
    commit_rows(log, ("in", pa.table({"id": list(range(25, 50))}, schema=schema)))
    query = (
        txnlog_stream(sspark, log.url, "in")
        .writeStream.format("txnlog")
        .option("topic", "out")
        .option("partitions", "1")
        .option("consumerGroup", "copier")
        .trigger(availableNow=True)
        .start(log.url)
    )
    query.awaitTermination()
    assert ids(read_topic(log, "out")) == list(range(50))
    (chk,) = list(root.iterdir())
    assert json.loads((chk / "metadata").read_text())["id"] == str(query.id)
    ends = {p.partition: p.last_stable_offset for p in log.describe_topic("in").partitions}
    assert {tp.partition: o.offset for tp, o in log.groups.committed("copier").items()} == ends


def partitions_of_each_key(log: txn_core.Log) -> dict[str, set[int]]:
    out = read_topic(log, "out")
    seen: dict[str, set[int]] = {}
    for key, part in zip(out.column("key").to_pylist(), out.column("_partition").to_pylist(), strict=True):
        seen.setdefault(key, set()).add(part)
    return seen


def test_write_stream_partition_by_never_reaches_the_sink_and_key_column_routes_by_key(
    sspark: Any, log: txn_core.Log, tmp_path: Path
) -> None:
    """PySpark 4.3 passes a Python streaming sink nothing of ``writeStream.partitionBy`` (no option, no schema
    change, no task property): Spark drops it. The README's fix is ``keyColumn``; this pins Spark's behaviour."""
    df = sspark.readStream.format("sinktest_counter").option("total", 28).option("perBatch", 28).load()
    writer = (
        df.writeStream.format("txnlog")
        .option("topic", "out")
        .option("partitions", "2")
        .trigger(availableNow=True)
        .partitionBy("key")
    )
    writer.option("checkpointLocation", str(tmp_path / "chk1")).start(log.url).awaitTermination()
    assert all(parts == {0, 1} for parts in partitions_of_each_key(log).values()), "partitionBy did not route"
    keyed = writer.option("keyColumn", "key").option("topic", "keyed")
    keyed.option("checkpointLocation", str(tmp_path / "chk2")).start(log.url).awaitTermination()
    out = read_topic(log, "keyed")
    routes: dict[str, set[int]] = {}
    for key, part in zip(out.column("key").to_pylist(), out.column("_partition").to_pylist(), strict=True):
        routes.setdefault(key, set()).add(part)
    assert len(routes) == 7 and all(len(parts) == 1 for parts in routes.values()), routes


def test_write_partition_by_is_refused_by_spark_before_the_sink_and_nothing_is_written(
    sspark: Any, log: txn_core.Log
) -> None:
    """``df.write.partitionBy`` fails in Spark's own check (a Python data source's table has no partitioning)
    before txnlog is called, also on a new topic and beside ``keyColumn``: the README names ``keyColumn``."""
    df = sspark.createDataFrame([(1, "a"), (2, "b")], "id long, key string")
    for extra in ({}, {"keyColumn": "key"}):
        writer = df.write.format("txnlog").option("topic", "out").option("partitions", "2").mode("append")
        for k, v in extra.items():
            writer = writer.option(k, v)
        with pytest.raises(Exception, match="partitioning or clustering columns do not match the existing table's"):
            writer.partitionBy("key").save(log.url)
    assert "out" not in log.topics.list()


@pytest.mark.matrix(keep=1)
@pytest.mark.parametrize(
    ("pushdown", "static_sides"),
    [
        ("false", (None, None)),  # Spark's default: PySpark plans the static read once and reuses it
        ("true", ("B", "B")),  # Spark's pushdown step plans the Python read again in every micro-batch
    ],
)
def test_a_stream_static_joins_static_side_is_read_again_each_micro_batch_only_with_python_filter_pushdown(
    sspark: Any, log: txn_core.Log, tmp_path: Path, pushdown: str, static_sides: tuple[Any, Any]
) -> None:
    """Under Spark's default settings PySpark (4.3) keeps the batch read it planned for a Python source with
    the relation, which a streaming query analyses once: every micro-batch joins the rows the static side
    (``spark.read`` or a catalog table) saw first. With ``spark.sql.python.filterPushdown.enabled=true`` the
    pushdown step plans the read again for each micro-batch. A ``foreachBatch`` that reads the table again
    sees what is committed now under either setting (the README's workarounds)."""
    schema = pa.schema([("k", pa.string()), ("name", pa.string())])
    log.create_topic("dim", 1, schema)
    log.create_topic("events", 1, pa.schema([("k", pa.string())]))
    commit_rows(log, ("dim", pa.table({"k": ["a"], "name": ["A"]}, schema=schema)), ("events", pa.table({"k": ["a"]})))
    sspark.sql(f"CREATE TABLE dim_static USING txnlog OPTIONS (path '{log.url}', topic 'dim', includeMetadata 'false')")
    before = sspark.conf.get(PUSHDOWN_CONF)
    sspark.conf.set(PUSHDOWN_CONF, pushdown)
    try:
        read = sspark.read.format("txnlog").option("topic", "dim").option("includeMetadata", "false").load(log.url)
        table = sspark.table("dim_static").withColumnRenamed("name", "table_name")
        events = txnlog_stream(sspark, log.url, "events")
        seen: dict[str, tuple[Any, Any, Any]] = {}

        def rereading(batch: Any, batch_id: int) -> None:
            fresh = batch.sparkSession.table("dim_static").withColumnRenamed("name", "fresh_name")
            for row in batch.join(fresh, "k", "left").collect():
                seen[row.k] = (row.name, row.table_name, row.fresh_name)

        query = (
            events.join(read, "k", "left")
            .join(table, "k", "left")
            .writeStream.foreachBatch(rereading)
            .option("checkpointLocation", str(tmp_path / "chk"))
            .start()
        )
        try:
            query.processAllAvailable()
            commit_rows(
                log, ("dim", pa.table({"k": ["b"], "name": ["B"]}, schema=schema)), ("events", pa.table({"k": ["b"]}))
            )
            query.processAllAvailable()
        finally:
            query.stop()
    finally:
        sspark.conf.set(PUSHDOWN_CONF, before)
        sspark.sql("DROP TABLE dim_static")
    assert seen["a"] == ("A", "A", "A")
    assert seen["b"] == (*static_sides, "B"), "the static sides, then foreachBatch's re-read of the table"
