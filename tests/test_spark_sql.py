"""txnlog from Spark SQL and the catalog, and update-mode aggregations, the way Spark users write them.

PySpark's Python data source API (4.3) hands a catalog table's reader and writer no options at all; a
table made with ``CREATE TABLE ... USING txnlog`` keeps them in its stored schema
(:mod:`spark_txn_source.catalog`), so it reads and streams. What the API makes impossible fails with an
error that says so and names the alternative.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from sink_helpers import ids, read_topic

import txn_core
from spark_txn_sink import idempotent_batch_writer

pytestmark = pytest.mark.spark


@pytest.fixture
def orders(tmp_path: Path) -> str:
    """A log with topic ``orders`` (id, k) holding ids 0..4."""
    url = f"file://{tmp_path}/log"
    with txn_core.open_log(url) as log:
        log.create_topic("orders", 1, pa.schema([("id", pa.int64()), ("k", pa.string())]))
        with log.producer() as producer:
            producer.send("orders", pa.table({"id": list(range(5)), "k": [str(i) for i in range(5)]}))
    return url


def name() -> str:
    return f"t_{uuid.uuid4().hex[:8]}"


def topic_ids(url: str, topic: str = "orders") -> list[int]:
    with txn_core.open_log(url) as log:
        return ids(read_topic(log, topic))


def test_create_table_with_options_reads_and_a_view_takes_inserts_by_name(
    spark: Any, orders: str, tmp_path: Path
) -> None:
    table = name()
    spark.sql(f"CREATE TABLE {table} USING txnlog OPTIONS (path '{orders}', topic 'orders')")
    assert sorted(r.id for r in spark.sql(f"SELECT id FROM {table}").collect()) == [0, 1, 2, 3, 4]
    assert spark.table(table).columns == ["id", "k", "_topic", "_partition", "_offset", "_timestamp"]

    with pytest.raises(Exception, match="txnlog tables are read-only to Spark"):
        spark.sql(f"INSERT INTO {table} (id, k) VALUES (5, 'five')")
    view = name()  # a view hands the sink its options; it keeps the metadata columns
    spark.sql(f"CREATE TEMPORARY VIEW {view} USING txnlog OPTIONS (path '{orders}', topic 'orders')")
    assert spark.table(view).columns == ["id", "k", "_topic", "_partition", "_offset", "_timestamp"]
    spark.sql(f"INSERT INTO {view} (id, k) VALUES (5, 'five')")  # no metadata columns needed
    assert topic_ids(orders) == [0, 1, 2, 3, 4, 5]


def test_a_table_created_with_options_streams(spark: Any, orders: str) -> None:
    table = name()
    spark.sql(f"CREATE TABLE {table} USING txnlog OPTIONS (path '{orders}', topic 'orders')")
    stream = spark.readStream.option("startingOffsets", "earliest").table(table)
    query = stream.writeStream.format("memory").queryName(f"{table}_m").trigger(availableNow=True).start()
    query.awaitTermination()
    assert sorted(r.id for r in spark.table(f"{table}_m").collect()) == [0, 1, 2, 3, 4]


def test_a_table_changed_with_alter_table_fails_naming_alter_table_and_drop_and_create(spark: Any, orders: str) -> None:
    """ALTER TABLE changes only the schema Spark stores, which is what a txnlog table's reader gets: every later
    query failed naming a column the topic lacks. The error now says why and how to fix it; DROP TABLE and
    CREATE TABLE make the table read again, and the log is untouched."""
    added, retyped = name(), name()
    for table in (added, retyped):
        spark.sql(f"CREATE TABLE {table} USING txnlog OPTIONS (path '{orders}', topic 'orders')")
    spark.sql(f"ALTER TABLE {added} ADD COLUMNS (z int)")
    spark.sql(f"ALTER TABLE {retyped} ALTER COLUMN id TYPE string")
    for table, problem in (
        (added, r"names column\(s\) \['z'\] that the topics do not have"),
        (retyped, "requested as string"),
    ):
        with pytest.raises(Exception, match=problem) as info:
            spark.sql(f"SELECT count(*) FROM {table}").collect()
        message = str(info.value)
        assert "ALTER TABLE ... ADD COLUMNS, ALTER COLUMN and the like are not honoured by txnlog tables" in message
        assert "DROP TABLE it and CREATE TABLE it again with the same OPTIONS" in message
        spark.sql(f"DROP TABLE {table}")
        spark.sql(f"CREATE TABLE {table} USING txnlog OPTIONS (path '{orders}', topic 'orders')")
        assert sorted(r.id for r in spark.table(table).collect()) == [0, 1, 2, 3, 4]


def test_create_table_with_location_and_without_metadata_reads_and_streams(spark: Any, orders: str) -> None:
    table = name()
    path = orders.removeprefix("file://")
    spark.sql(f"CREATE TABLE {table} USING txnlog OPTIONS (topic 'orders', includeMetadata 'false') LOCATION '{path}'")
    assert spark.table(table).columns == ["id", "k"]
    assert sorted(r.id for r in spark.table(table).collect()) == [0, 1, 2, 3, 4]

    stream = spark.readStream.option("startingOffsets", "earliest").table(table)
    query = stream.writeStream.format("memory").queryName(f"{table}_m").trigger(availableNow=True).start()
    query.awaitTermination()
    assert spark.table(f"{table}_m").columns == ["id", "k"]
    assert sorted(r.id for r in spark.table(f"{table}_m").collect()) == [0, 1, 2, 3, 4]


def test_a_view_with_source_options_takes_inserts(spark: Any, orders: str) -> None:
    view = name()
    spark.sql(
        f"CREATE TEMPORARY VIEW {view} USING txnlog OPTIONS (path '{orders}', topic 'orders', "
        "includeMetadata 'false', startingOffsets 'earliest', failOnDataLoss 'true')"
    )
    spark.sql(f"INSERT INTO {view} SELECT 8 AS id, 'eight' AS k")  # source-only options are ignored by the sink
    assert topic_ids(orders) == [0, 1, 2, 3, 4, 8]


def test_writes_to_a_table_are_refused_as_the_rows_may_carry_another_tables_options(
    spark: Any, orders: str, tmp_path: Path
) -> None:
    """A sink writing to a catalog table gets no options, only the rows' schema; Spark passes a query's columns
    through unchanged when they match the table's, so rows read from table ``a`` carry ``a``'s options and
    ``INSERT INTO b SELECT * FROM a`` would append to ``a``. Every way of writing to a table is refused."""
    with txn_core.open_log(orders) as log:
        log.create_topic("returns", 1, pa.schema([("id", pa.int64()), ("k", pa.string())]))
    a, b = name(), name()
    for table, topic in ((a, "orders"), (b, "returns")):
        spark.sql(
            f"CREATE TABLE {table} USING txnlog OPTIONS (path '{orders}', topic '{topic}', includeMetadata 'false')"
        )
    df = spark.createDataFrame([(10, "ten")], "id long, k string")
    writes: dict[str, Callable[[], object]] = {
        "INSERT INTO b SELECT * FROM a": lambda: spark.sql(f"INSERT INTO {b} SELECT * FROM {a}"),
        "insertInto(b) of a's rows": lambda: spark.table(a).write.insertInto(b),
        "insertInto": lambda: df.write.insertInto(b),
        "writeTo().append()": lambda: df.writeTo(b).append(),
        "saveAsTable(b) in append mode": lambda: df.write.format("txnlog").mode("append").saveAsTable(b),
        "CREATE TABLE c AS SELECT * FROM a": lambda: spark.sql(
            f"CREATE TABLE {name()} USING txnlog AS SELECT * FROM {a}"
        ),
    }
    for what, write in writes.items():
        with pytest.raises(Exception, match=r"txnlog tables are read-only to Spark|no options at all") as refused:
            write()
            pytest.fail(what)
        if what.startswith("CREATE TABLE"):
            assert "CREATE TABLE ... AS SELECT" in str(refused.value), "the message names what was asked"

    copy = (
        spark.readStream.option("startingOffsets", "earliest")
        .table(a)
        .writeStream.option("checkpointLocation", str(tmp_path / "chk"))
        .trigger(availableNow=True)
        .toTable(b)
    )
    with pytest.raises(Exception, match="txnlog tables are read-only to Spark"):
        copy.awaitTermination(120)
    assert topic_ids(orders) == [0, 1, 2, 3, 4], "nothing was written to a"
    assert topic_ids(orders, "returns") == [], "nor to b"


def test_to_table_is_refused_with_the_alternative(spark: Any, orders: str, tmp_path: Path) -> None:
    table = name()
    spark.sql(f"CREATE TABLE {table} USING txnlog OPTIONS (path '{orders}', topic 'orders')")
    spark.createDataFrame([(13, "x")], "id long, k string").write.parquet(str(tmp_path / "in"))
    query = (
        spark.readStream.schema("id long, k string")
        .parquet(str(tmp_path / "in"))
        .writeStream.option("checkpointLocation", str(tmp_path / "chk"))
        .trigger(availableNow=True)
        .toTable(table)
    )
    with pytest.raises(Exception, match=r"writeStream.toTable\(name\) cannot write to a txnlog table") as info:
        query.awaitTermination(120)
    assert "writeStream.format('txnlog').option('topic', T).start(URL)" in str(info.value)
    assert topic_ids(orders) == [0, 1, 2, 3, 4], "nothing was written"


def test_a_view_reading_from_a_group_takes_inserts_by_name_and_keeps_its_metadata_columns(
    spark: Any, orders: str
) -> None:
    """``consumerGroup`` means "resume from the group" to the source and "commit the source offsets" to a
    streaming sink; a batch write has no source offsets and ignores it."""
    view = name()
    spark.sql(
        f"CREATE TEMPORARY VIEW {view} USING txnlog OPTIONS (path '{orders}', topic 'orders', consumerGroup 'readers')"
    )
    assert spark.table(view).columns == ["id", "k", "_topic", "_partition", "_offset", "_timestamp"]
    assert spark.table(view).count() == 5, "a group without offsets starts at the earliest offset"
    spark.sql(f"INSERT INTO {view} (id, k) VALUES (20, 'twenty')")
    assert topic_ids(orders) == [0, 1, 2, 3, 4, 20]


def test_a_view_of_several_topics_cannot_be_written(spark: Any, orders: str) -> None:
    with txn_core.open_log(orders) as log:
        log.create_topic("returns", 1, pa.schema([("id", pa.int64()), ("k", pa.string())]))
    view = name()
    spark.sql(
        f"CREATE TEMPORARY VIEW {view} USING txnlog "
        f"OPTIONS (path '{orders}', topic 'orders,returns', includeMetadata 'false')"
    )
    assert spark.table(view).count() == 5
    with pytest.raises(Exception, match="names several topics, but a txnlog write goes to one topic"):
        spark.sql(f"INSERT INTO {view} VALUES (30, 'thirty')")
    assert topic_ids(orders) == [0, 1, 2, 3, 4]
    assert topic_ids(orders, "returns") == []


def test_sink_options_are_accepted_and_ignored_by_the_source(spark: Any, orders: str) -> None:
    df = (
        spark.read.format("txnlog")
        .option("topic", "orders")
        .option("partitions", "3")
        .option("keyColumn", "k")
        .option("transactionTimeoutMs", "1000")
        .load(orders)
    )
    assert df.count() == 5


def test_save_as_table_is_refused_before_anything_is_written(spark: Any, orders: str) -> None:
    """A table the catalog creates from a query is stored without txnlog's options (Spark calls no
    ``schema()`` for it): saveAsTable, writeTo().create() and CREATE TABLE ... AS SELECT are refused before
    any row is staged, and Spark drops the table it began."""
    table = name()
    df = spark.createDataFrame([(9, "nine")], "id long, k string")
    with pytest.raises(Exception, match="a txnlog table cannot be created from a query") as info:
        df.write.format("txnlog").option("topic", "orders").option("path", orders).mode("append").saveAsTable(table)
    assert "CREATE TEMPORARY VIEW v USING txnlog OPTIONS (path 'URL', topic 'T'), then INSERT INTO v" in str(info.value)
    assert topic_ids(orders) == [0, 1, 2, 3, 4], "nothing was written"
    assert not spark.catalog.tableExists(table)

    with pytest.raises(Exception, match="a txnlog table cannot be created from a query"):
        df.writeTo(table).using("txnlog").option("topic", "orders").option("path", orders).create()
    with pytest.raises(Exception, match="no options at all"):  # SQL CTAS: Spark gives the writer no options
        spark.sql(f"CREATE TABLE {table} USING txnlog OPTIONS (path '{orders}', topic 'orders') AS SELECT 9L AS id")
    assert topic_ids(orders) == [0, 1, 2, 3, 4], "nothing was written"
    assert not spark.catalog.tableExists(table)


def test_the_default_save_mode_is_refused_by_spark_with_nothing_written(spark: Any, orders: str) -> None:
    df = spark.createDataFrame([(1, "a")], "id long, k string")
    with pytest.raises(Exception, match='cannot be written in the "ErrorIfExists" mode'):
        df.write.format("txnlog").option("topic", "orders").save(orders)
    assert topic_ids(orders) == [0, 1, 2, 3, 4]


def count_by_k(spark: Any, df: Any, tmp_path: Path, mode: str, url: str, topic: str) -> Any:
    """Start a streaming count of ``df``'s rows by ``k`` (from parquet) into ``topic`` in output ``mode``."""
    df.write.parquet(str(tmp_path / "in"))
    counts = spark.readStream.schema("id long, k string").parquet(str(tmp_path / "in")).groupBy("k").count()
    return (
        counts.writeStream.format("txnlog")
        .outputMode(mode)
        .option("topic", topic)
        .option("partitions", "1")
        .option("checkpointLocation", str(tmp_path / "chk"))
        .start(url)
    )


def test_overwrite_and_complete_are_refused_with_the_alternative(spark: Any, orders: str, tmp_path: Path) -> None:
    df = spark.createDataFrame([(1, "a")], "id long, k string")
    with pytest.raises(Exception, match="takes mode\\('append'\\) only") as info:
        df.write.format("txnlog").option("topic", "orders").mode("overwrite").save(orders)
    assert "Overwrite" in str(info.value)
    assert topic_ids(orders) == [0, 1, 2, 3, 4], "nothing was written"

    query = count_by_k(spark, df, tmp_path, "complete", orders, "c")
    with pytest.raises(Exception, match="idempotent_batch_writer"):
        query.awaitTermination(120)


def test_update_mode_is_refused_by_spark_before_the_sink_is_reached(spark: Any, orders: str, tmp_path: Path) -> None:
    """PySpark 4.3's write builder for Python sinks lacks ``SupportsStreamingUpdateAsAppend``: Spark fails the
    query when it starts, calling no Python code, so the message cannot name the alternative
    (``foreachBatch`` with ``idempotent_batch_writer``, the next test; the README says so). If this test
    fails, a newer PySpark lets Python sinks take update mode."""
    query = count_by_k(
        spark, spark.createDataFrame([(1, "a")], "id long, k string"), tmp_path, "update", orders, "counts"
    )
    with pytest.raises(Exception, match="txnlog does not support Update mode"):
        query.awaitTermination(120)
    with txn_core.open_log(orders) as log:
        assert "counts" not in log.list_topics()


@pytest.mark.slow
def test_update_mode_aggregation_appends_each_batch_exactly_once(spark: Any, orders: str, tmp_path: Path) -> None:
    """``outputMode("update")`` through ``foreachBatch``: each batch's updated rows, one transaction each;
    a batch Spark replays commits nothing."""
    source = tmp_path / "in"
    frame = spark.createDataFrame([(i, f"k{i % 3}") for i in range(9)], "id long, k string")
    frame.write.parquet(str(source))
    counts = (
        spark.readStream.schema("id long, k string")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(source))
        .groupBy("k")
        .count()
    )
    write = idempotent_batch_writer(orders, "counts", "counts-job", partitions="1")
    query = (
        counts.writeStream.outputMode("update")
        .foreachBatch(write)
        .option("checkpointLocation", str(tmp_path / "chk"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    with txn_core.open_log(orders) as log:
        first = read_topic(log, "counts")
    final: dict[str, int] = {}
    for k, n in zip(first.column("k").to_pylist(), first.column("count").to_pylist(), strict=True):
        final[k] = max(final.get(k, 0), n)
    assert final == {"k0": 3, "k1": 3, "k2": 3}
    with txn_core.open_log(orders) as log:
        transactions = log.describe_topic("counts").partitions[0].committed_transactions
    assert transactions == query.lastProgress["batchId"] + 1 > 1, "one transaction per micro-batch"

    write(spark.createDataFrame([("k0", 99)], "k string, count long"), 0)  # Spark replaying batch 0
    with txn_core.open_log(orders) as log:
        again = read_topic(log, "counts")
        progress = log.transaction_metadata("spark-app-counts-job.counts")  # the app id, scoped per topic
    assert again.num_rows == first.num_rows, "a replayed version commits nothing"
    assert progress is not None and progress["query_id"] == "counts-job"


def test_idempotent_batch_write_options_are_checked(spark: Any, orders: str) -> None:
    df = spark.createDataFrame([(1, "a")], "id long, k string")
    with pytest.raises(Exception, match="txnAppId and txnVersion go together"):
        df.write.format("txnlog").option("topic", "orders").option("txnAppId", "a").mode("append").save(orders)
    assert topic_ids(orders) == [0, 1, 2, 3, 4]


@pytest.mark.slow
def test_progress_has_offsets_counts_and_observed_metrics_but_no_description_of_txnlog(
    spark: Any, orders: str, tmp_path: Path
) -> None:
    """What a streaming query's progress shows for a txnlog source and sink. PySpark 4.3 gives Python sources
    and sinks no description or custom metrics hook: when the last assertions fail, a newer PySpark does,
    and txnlog should fill them."""
    from pyspark.sql import functions as sf

    query_name = name()
    copied = (
        spark.readStream.format("txnlog")
        .option("topic", "orders")
        .option("startingOffsets", "earliest")
        .load(orders)
        .observe("seen", sf.count(sf.lit(1)).alias("rows"))
    )
    query = (
        copied.writeStream.format("txnlog")
        .option("topic", "copy")
        .option("partitions", "1")
        .option("checkpointLocation", str(tmp_path / "chk"))
        .queryName(query_name)
        .trigger(availableNow=True)
        .start(orders)
    )
    query.awaitTermination()
    progress = query.lastProgress
    source, sink = progress["sources"][0], progress["sink"]
    assert progress["name"] == query_name
    assert json.loads(source["latestOffset"])["topics"] == {"orders": {"0": 5}}  # reportLatestOffset
    assert source["numInputRows"] == 5 and sink["numOutputRows"] == 5
    assert progress["observedMetrics"]["seen"]["rows"] == 5
    python = "org.apache.spark.sql.execution.datasources.v2.python."
    assert source["description"].startswith(python + "PythonMicroBatchStream")
    assert sink["description"].startswith(python + "PythonTable@")
    assert source["metrics"] == {} and sink["metrics"] == {}


def test_starting_offsets_past_the_end_fail_the_read_and_the_query_naming_the_partition(
    spark: Any, orders: str
) -> None:
    """A mistyped ``startingOffsets`` JSON is refused from ``spark.read`` and from SQL alike (as Spark's Kafka
    source fails a range that begins after it ends), not read as an empty result; one within the log reads."""
    past = '{"orders": {"0": 9}}'
    with pytest.raises(Exception, match=r"startingOffsets.*orders-0: 9 > 5"):
        spark.read.format("txnlog").option("path", orders).option("topic", "orders").option(
            "startingOffsets", past
        ).load().collect()
    view = name()
    spark.sql(
        f"CREATE TEMPORARY VIEW {view} USING txnlog OPTIONS (path '{orders}', topic 'orders', startingOffsets '{past}')"
    )
    with pytest.raises(Exception, match=r"startingOffsets.*orders-0: 9 > 5"):
        spark.sql(f"SELECT count(*) FROM {view}").collect()
    inside = name()
    spark.sql(
        f"CREATE TEMPORARY VIEW {inside} USING txnlog OPTIONS (path '{orders}', topic 'orders', "
        """startingOffsets '{"orders": {"0": 3}}')"""
    )
    assert sorted(r.id for r in spark.sql(f"SELECT id FROM {inside}").collect()) == [3, 4]
