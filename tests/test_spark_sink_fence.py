"""Two writers on one consumer group (txn_core PROTOCOL.md "Offsets fence"): a second copy of a job, or an
old checkpoint resumed while a newer query consumes the group, can never commit the group's input twice.
The losing query fails at that batch with an error naming the group; its batch commits nothing."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from sink_helpers import duplicates, ids, read_topic

import txn_core

pytestmark = pytest.mark.spark

SCHEMA = pa.schema([("id", pa.int64()), ("key", pa.string())])


def produce(log: txn_core.Log, first: int, txns: int, rows: int = 100) -> list[int]:
    """``txns`` committed transactions of ``rows`` ids from ``first`` on topic ``in``; the ids."""
    if "in" not in log.topics.list():
        log.create_topic("in", 2, SCHEMA)
    producer = log.producer("input-generator")
    producer.init_transactions()
    out: list[int] = []
    for t in range(txns):
        batch = list(range(first + t * rows, first + (t + 1) * rows))
        producer.begin_transaction()
        producer.send(
            "in", pa.table({"id": batch, "key": [f"k{i % 7}" for i in batch]}, schema=SCHEMA), key_column="key"
        )
        producer.commit_transaction()
        out.extend(batch)
    producer.close()
    return out


def from_group(spark: Any, log: txn_core.Log, checkpoint: Path, *, per_trigger: int = 150) -> Any:
    """readStream(startingOffsets=group, consumerGroup=cg) -> writeStream(consumerGroup=cg), availableNow."""
    return (
        spark.readStream.format("txnlog")
        .option("topic", "in")
        .option("startingOffsets", "group")
        .option("consumerGroup", "cg")
        .option("maxOffsetsPerTrigger", str(per_trigger))
        .load(log.url)
        .writeStream.format("txnlog")
        .option("checkpointLocation", str(checkpoint))
        .option("topic", "out")
        .option("partitions", "2")
        .option("consumerGroup", "cg")
        .trigger(availableNow=True)
        .start(log.url)
    )


def error_of(query: Any) -> str | None:
    try:
        query.awaitTermination()
    except Exception as exc:  # Spark wraps the Python error; its text is what we check
        return str(exc)
    return None


@pytest.mark.slow
def test_an_old_checkpoint_resumed_after_a_new_query_consumed_the_group_is_fenced(
    spark: Any, log: txn_core.Log, tmp_path: Path
) -> None:
    first = produce(log, 0, 4)
    assert error_of(from_group(spark, log, tmp_path / "old")) is None
    second = produce(log, 10_000, 4)
    # A new query on a new checkpoint continues from the group and copies the second part.
    assert error_of(from_group(spark, log, tmp_path / "new")) is None
    assert ids(read_topic(log, "out")) == sorted(first + second)
    third = produce(log, 20_000, 2)
    # The old query (a zombie driver, or its checkpoint resumed by mistake) would start at the end of
    # the first part: that input is already committed to the group by the new query.
    err = error_of(from_group(spark, log, tmp_path / "old"))
    assert err is not None and "consumer group 'cg'" in err and "already committed" in err, err
    assert ids(read_topic(log, "out")) == sorted(first + second), "the fenced batch committed nothing"
    # The new query finishes the copy: every input row once.
    assert error_of(from_group(spark, log, tmp_path / "new")) is None
    out = ids(read_topic(log, "out"))
    assert duplicates(out) == {}
    assert out == sorted(first + second + third)


def test_two_concurrent_queries_on_one_group_copy_every_row_once(spark: Any, log: txn_core.Log, tmp_path: Path) -> None:
    expected = produce(log, 0, 12)
    queries = [from_group(spark, log, tmp_path / f"copy-{i}", per_trigger=120) for i in range(2)]
    errors = [error_of(q) for q in queries]
    for q in queries:
        with contextlib.suppress(Exception):
            q.stop()
    for err in errors:  # a loser fails naming the group (fenced claim, or its shared id taken over)
        assert err is None or "consumer group 'cg'" in err, err
    assert any(errors), "both copies ran to the end: the race was not exercised"
    out = ids(read_topic(log, "out"))
    assert duplicates(out) == {}, "a row was committed by both queries"
    # Whatever the race left, a query from the group finishes the copy exactly once.
    assert error_of(from_group(spark, log, tmp_path / "drain")) is None
    out = ids(read_topic(log, "out"))
    assert duplicates(out) == {}
    assert out == sorted(expected)
