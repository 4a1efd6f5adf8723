"""Segments with Spark (PROTOCOL.md "Segments"; spark_txn_sink/PROTOCOL.md "Rolling history into segments").

* The sink's commit worker rolls the partitions it writes by itself; the output, read by Spark's source
  and by the core consumer, is exactly the input, and the staged objects of rolled batches are gone.
* A Spark batch read of a topic (planning on the driver, ranges read by executors) returns the same rows
  before and after the topic was rolled.
* Rolling under kills is part of the copier's chaos test (``tests/test_spark_sink_chaos.py``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import sink_sources
from sink_helpers import garbage, ids, read_topic, staged_objects
from test_spark_sink_chaos import segment_count

import txn_core
from txn_core.format import paths
from txn_core.ops import maintenance
from txn_core.ops.rolling import RollPolicy

pytestmark = pytest.mark.spark


def _loose(log: txn_core.Log, topic: str) -> int:
    return sum(
        len(log.storage.list(paths.entries(paths.partition_log_path(topic, p))))
        for p in range(log.topics.get(topic).partitions)
    )


def _spark_rows(spark: Any, url: str, topic: str, isolation: str = "read_committed") -> list[tuple[Any, ...]]:
    df = spark.read.format("txnlog").option("topic", topic).option("isolationLevel", isolation).load(url)
    return sorted(tuple(r) for r in df.select("_partition", "_offset", "id").collect())


@pytest.mark.slow
def test_the_sink_rolls_what_it_writes_and_readers_read_it_exactly(
    spark: Any, log: txn_core.Log, tmp_path: Path
) -> None:
    sink_sources.register(spark)
    df = spark.readStream.format("sinktest_counter").option("total", 400).option("perBatch", 10).load()
    query = (
        df.writeStream.format("txnlog")
        .option("checkpointLocation", str(tmp_path / "chk"))
        .option("topic", "out")
        .option("partitions", "2")
        .option("keyColumn", "key")
        .option("rollEntries", "10")
        .option("testing.rollMinAgeMs", "0")
        .trigger(availableNow=True)
        .start(log.url)
    )
    query.awaitTermination()
    # The roller runs after each commit, off the commit's path: wait until it has rolled most entries.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (segment_count(log, "out") >= 4 and _loose(log, "out") < 40):
        time.sleep(0.5)
    assert segment_count(log, "out") >= 4, "the sink's commit worker rolled its output"
    assert _loose(log, "out") < 40, "and deleted the loose entries its segments hold (80 batches x 2 partitions)"
    assert ids(read_topic(log, "out")) == list(range(400))
    assert sorted(r[2] for r in _spark_rows(spark, log.url, "out")) == list(range(400))
    assert len(staged_objects(log)) < 40, "staged objects of rolled batches are deleted with their references"
    assert garbage(log, "out") == []


def _history(log: txn_core.Log) -> None:
    log.create_topic("h", 2, pa.schema([("id", pa.int64())]))
    p = log.producer("history")
    p.init_transactions()
    for i in range(120):
        p.begin_transaction()
        p.send("h", pa.table({"id": [i, i + 1000]}), partition=i % 2)
        p.flush()
        if i % 7 == 3:
            p.abort_transaction()
        else:
            p.commit_transaction()
    p.close()


def test_a_batch_read_of_a_rolled_topic_plans_and_reads_the_same_rows(spark: Any, log: txn_core.Log) -> None:
    _history(log)
    before = {iso: _spark_rows(spark, log.url, "h", iso) for iso in ("read_committed", "read_uncommitted")}
    assert len(before["read_committed"]) < len(before["read_uncommitted"])
    results = maintenance.roll_segments(
        log, "h", policy=RollPolicy(entries=10, max_entries=40), min_age_ms=0, check_min_age=False
    )
    assert all(r.segments >= 3 and r.deleted_entries == r.entries for r in results)
    after = {iso: _spark_rows(spark, log.url, "h", iso) for iso in ("read_committed", "read_uncommitted")}
    assert after == before
