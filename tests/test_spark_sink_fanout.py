"""Delta's idempotent fan-out, as its documentation writes it: a ``foreachBatch`` writing each micro-batch
to two destinations with the same ``txnAppId`` and ``txnVersion=batch_id``. Delta scopes (appId, version) to
each table; txnlog scopes it to each topic, so every row reaches both topics exactly once, replays included.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sink_helpers import ids, read_topic

import txn_core

pytestmark = pytest.mark.spark


def _topic_ids(url: str, topic: str) -> list[int]:
    with txn_core.open_log(url) as log:
        return ids(read_topic(log, topic)) if topic in log.list_topics() else []


def test_deltas_fan_out_example_writes_every_batch_once_to_each_topic(spark: Any, tmp_path: Path) -> None:
    url = f"file://{tmp_path}/log"
    source = tmp_path / "in"
    for n in range(2):  # two files, one micro-batch each: 400 rows
        spark.range(n * 200, (n + 1) * 200).selectExpr("id", "cast(id % 7 as string) AS k").write.mode(
            "append"
        ).parquet(str(source))
    app_id = "fanout-job"

    def write_to_both_idempotent(batch_df: Any, batch_id: int) -> None:  # Delta's example, as written
        batch_df.write.format("txnlog").mode("append").option("topic", "fan1").option("partitions", "2").option(
            "txnVersion", batch_id
        ).option("txnAppId", app_id).save(url)  # location 1
        batch_df.write.format("txnlog").mode("append").option("topic", "fan2").option("partitions", "2").option(
            "txnVersion", batch_id
        ).option("txnAppId", app_id).save(url)  # location 2

    query = (
        spark.readStream.schema("id long, k string")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(source))
        .writeStream.foreachBatch(write_to_both_idempotent)
        .option("checkpointLocation", str(tmp_path / "chk"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    assert query.lastProgress["batchId"] >= 1, "several micro-batches"
    assert _topic_ids(url, "fan1") == _topic_ids(url, "fan2") == list(range(400))

    # Spark replaying the last batch after a crash: nothing more in either topic
    last = int(query.lastProgress["batchId"])
    write_to_both_idempotent(spark.range(200, 400).selectExpr("id", "cast(id % 7 as string) AS k"), last)
    assert _topic_ids(url, "fan1") == _topic_ids(url, "fan2") == list(range(400))


def test_a_batch_write_of_one_app_version_reaches_each_topic_once(spark: Any, tmp_path: Path) -> None:
    """The plain batch form: app 'loader', version 7, to t1 and then t2 (t2 was skipped, never created);
    written again, neither topic gets a row more. A transactionalId given for both topics cannot tell the
    second topic's version from the first's: that write fails, naming the topic that holds the version."""
    url = f"file://{tmp_path}/log"
    df = spark.createDataFrame([(i, str(i)) for i in range(5)], "id long, k string")

    def load(topic: str, **extra: str) -> None:
        writer = df.write.format("txnlog").mode("append").option("topic", topic).option("partitions", "1")
        for key, value in {"txnAppId": "loader", "txnVersion": "7", **extra}.items():
            writer = writer.option(key, value)
        writer.save(url)

    for _ in range(2):
        load("t1")
        load("t2")
    assert _topic_ids(url, "t1") == _topic_ids(url, "t2") == list(range(5))

    load("t3", transactionalId="shared-tid")
    with pytest.raises(Exception, match=r"AppScopeError.*last commit is version 7 of this run to topic 't3'"):
        load("t4", transactionalId="shared-tid")
    assert _topic_ids(url, "t3") == list(range(5)) and _topic_ids(url, "t4") == []
