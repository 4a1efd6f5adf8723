"""txnlog -> txnlog stream copies: source offsets committed to a group inside each batch's transaction.

The input holds committed and aborted transactions; the copy must output exactly the committed rows,
and the group's offsets must always describe exactly what has been output, so that a query restarted on
a *new* checkpoint from ``startingOffsets=group`` continues exactly-once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from sink_helpers import duplicates, garbage, ids, read_topic

import txn_core

pytestmark = pytest.mark.spark

SCHEMA = pa.schema([("id", pa.int64()), ("key", pa.string())])


def produce_input(log: txn_core.Log, txns: int = 12, rows: int = 100) -> list[int]:
    """``txns`` transactions of ``rows`` ids on 3 partitions, every third aborted; the committed ids."""
    log.create_topic("in", 3, SCHEMA)
    producer = log.producer("input-generator")
    producer.init_transactions()
    committed: list[int] = []
    for t in range(txns):
        producer.begin_transaction()
        batch = list(range(t * rows, (t + 1) * rows))
        producer.send(
            "in", pa.table({"id": batch, "key": [f"k{i % 11}" for i in batch]}, schema=SCHEMA), key_column="key"
        )
        producer.flush()  # the rows reach the log either way; an abort must hide them
        if t % 3 == 2:
            producer.abort_transaction()
        else:
            producer.commit_transaction()
            committed.extend(batch)
    producer.close()
    return committed


def copy(
    spark: Any,
    log: txn_core.Log,
    checkpoint: Path,
    *,
    starting: str,
    sink: dict[str, str],
    read: dict[str, str] | None = None,
    source_log: str | None = None,
) -> Any:
    reader = (
        spark.readStream.format("txnlog")
        .option("topic", "in")
        .option("startingOffsets", starting)
        .option("maxOffsetsPerTrigger", "250")
    )
    for k, v in (read or {}).items():
        reader = reader.option(k, v)
    writer = (
        reader.load(source_log or log.url)
        .writeStream.format("txnlog")
        .option("checkpointLocation", str(checkpoint))
        .option("topic", "out")
        .trigger(availableNow=True)
    )
    for k, v in sink.items():
        writer = writer.option(k, v)
    return writer.start(log.url)


def group_offsets(log: txn_core.Log, group: str) -> dict[int, int]:
    return {tp.partition: o.offset for tp, o in log.groups.committed(group).items() if tp.topic == "in"}


@pytest.mark.slow
def test_group_offsets_describe_the_output_and_a_new_checkpoint_resumes_from_them(
    spark: Any, log: txn_core.Log, tmp_path: Path
) -> None:
    committed = produce_input(log)
    sink = {"partitions": "2", "consumerGroup": "copier"}
    q = copy(spark, log, tmp_path / "chk1", starting="earliest", sink={**sink, "testing.fault": "before_commit@2"})
    with pytest.raises(Exception, match="injected fault 'before_commit' in batch 2"):
        q.awaitTermination()
    # Batches 0 and 1 are committed, 2 aborted: the group holds batch 1's end offsets, and the output is
    # exactly the committed input below them.
    group = group_offsets(log, "copier")
    input_rows = read_topic(log, "in")
    columns = (input_rows.column(c).to_pylist() for c in ("id", "_partition", "_offset"))
    below = [i for i, p, o in zip(*columns, strict=True) if o < group.get(p, 0)]
    out = read_topic(log, "out")
    assert 0 < len(below) < len(committed)
    assert ids(out) == sorted(below)
    # A new query (new checkpoint, new transactional id) from the group's offsets finishes the copy.
    q = copy(spark, log, tmp_path / "chk2", starting="group", read={"consumerGroup": "copier"}, sink=sink)
    q.awaitTermination()
    out = read_topic(log, "out")
    assert duplicates(ids(out)) == {}
    assert ids(out) == sorted(committed), "every committed input row once, no aborted row"
    ends = {p.partition: p.last_stable_offset for p in log.describe_topic("in").partitions}
    assert group_offsets(log, "copier") == ends, "after draining, the group is at the source's end"
    assert set(out.column_names) >= {"id", "key"} and log.topics.get("out").schema == SCHEMA
    assert garbage(log, "out") == []


def test_offsets_of_another_log_cannot_be_committed_with_the_output(
    spark: Any, log: txn_core.Log, tmp_path: Path
) -> None:
    other = txn_core.open_log(str(tmp_path / "other"))
    produce_input(other, txns=2)
    log.create_topic("out", 1, SCHEMA)
    q = copy(spark, log, tmp_path / "chk", starting="earliest", source_log=other.url, sink={"consumerGroup": "copier"})
    with pytest.raises(Exception, match="one transaction spans one log"):
        q.awaitTermination()
    assert read_topic(log, "out").num_rows == 0
    assert log.groups.committed("copier") == {}
    assert garbage(log, "out") == []


def test_small_micro_batches_run_as_one_task_and_still_spread_over_every_partition(
    spark: Any, log: txn_core.Log, tmp_path: Path
) -> None:
    """A micro-batch of a few rows over 3 input partitions is one Spark task (the source packs small ranges),
    and without a key, micro-batch ``n``'s task starts at output partition ``n``: four micro-batches fill
    four partitions, not one. Exactly-once as ever."""
    committed = produce_input(log, txns=6, rows=20)
    q = copy(
        spark,
        log,
        tmp_path / "chk",
        starting="earliest",
        sink={"partitions": "4", "consumerGroup": "small"},
        read={"maxOffsetsPerTrigger": "30"},
    )
    q.awaitTermination()
    batches = [p for p in q.recentProgress if p["numInputRows"]]
    assert len(batches) >= 4
    out = read_topic(log, "out")
    assert ids(out) == sorted(committed)
    assert len(set(out.column("_partition").to_pylist())) == min(4, len(batches))
