"""A write that fails leaves nothing that changes what its corrected retry does; topics made from a frame
take the nullability Spark really writes (none is enforced)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from sink_helpers import read_topic, staged_objects

import txn_core
from txn_core.ops.maintenance import sweep_staging

pytestmark = pytest.mark.spark


def test_a_failed_batch_write_leaves_no_topic_and_the_corrected_retry_succeeds(spark: Any, tmp_path: Path) -> None:
    url = f"file://{tmp_path}/log"
    bad = spark.range(4).selectExpr("id", "if(id = 2, raise_error('bad row'), 'x') AS k")
    with pytest.raises(Exception, match="bad row"):
        bad.write.format("txnlog").option("topic", "out").option("partitions", "2").mode("append").save(url)
    with txn_core.open_log(url) as log:
        assert log.list_topics() == [], "the refused write created no topic"
        # A task that finished staging after Spark aborted the job may leave its object behind, under the
        # failed write's own prefix: nothing references it, the retry never sees it, the sweep removes it.
        # Spark reports the failure while the job's other task may still be staging, so such an object may
        # appear after this listing; the sweep's count is checked against a listing taken after the retry.
        early_leftovers = set(staged_objects(log))

    fixed = spark.range(4).selectExpr("id", "id * 10 AS k")  # a different schema: k is now a long
    fixed.write.format("txnlog").option("topic", "out").option("partitions", "2").mode("append").save(url)
    with txn_core.open_log(url) as log:
        assert log.topics.get("out").schema == pa.schema([("id", pa.int64()), ("k", pa.int64())])
        assert sorted(read_topic(log, "out").column("k").to_pylist()) == [0, 10, 20, 30]
        before_sweep = set(staged_objects(log))
        assert early_leftovers <= before_sweep, "the retry removed nothing of the failed write"
        swept = sweep_staging(log, older_than_ms=0, check_min_age=False)
        remaining = set(staged_objects(log))
        assert swept == len(before_sweep - remaining) and remaining <= before_sweep
        assert sorted(read_topic(log, "out").column("k").to_pylist()) == [0, 10, 20, 30]
        assert not remaining & early_leftovers, "only the committed write's data remains"
        assert remaining, "the committed write's staged data is kept"


def test_a_failed_stream_leaves_no_topic(spark: Any, tmp_path: Path) -> None:
    url = f"file://{tmp_path}/log"
    spark.range(3).write.parquet(str(tmp_path / "in"))
    stream = (
        spark.readStream.schema("id long")
        .parquet(str(tmp_path / "in"))
        .selectExpr("id", "if(id = 1, raise_error('bad row'), id) AS v")
    )
    query = (
        stream.writeStream.format("txnlog")
        .option("topic", "out")
        .option("partitions", "1")
        .option("checkpointLocation", str(tmp_path / "chk"))
        .trigger(availableNow=True)
        .start(url)
    )
    with pytest.raises(Exception, match="bad row"):
        query.awaitTermination()
    with txn_core.open_log(url) as log:
        assert log.list_topics() == []


def test_topics_from_a_frame_are_nullable_so_later_frames_with_nulls_fit(spark: Any, tmp_path: Path) -> None:
    """A frame's non-null declarations are not what Spark enforces on the rows a Python sink gets, nor what
    the next writer's frame says: ``spark.range`` makes ``id`` non-null, the next frame has nulls."""
    url = f"file://{tmp_path}/log"
    first = spark.range(2).selectExpr("id", "named_struct('x', id) AS st", "array(id) AS arr")
    assert not first.schema["id"].nullable and not first.schema["st"].dataType["x"].nullable
    first.write.format("txnlog").option("topic", "t").option("partitions", "1").mode("append").save(url)
    with txn_core.open_log(url) as log:
        schema = log.topics.get("t").schema
    assert all(f.nullable for f in schema)
    assert schema.field("st").type.field("x").nullable and schema.field("arr").type.value_field.nullable

    later = spark.createDataFrame([(None, None, [None])], "id long, st struct<x: long>, arr array<long>")
    later.write.format("txnlog").option("topic", "t").mode("append").save(url)
    with txn_core.open_log(url) as log:
        rows = read_topic(log, "t").select(["id", "st", "arr"]).to_pylist()
    assert sorted(rows, key=lambda r: (r["id"] is None, r["id"] or 0)) == [
        {"id": 0, "st": {"x": 0}, "arr": [0]},
        {"id": 1, "st": {"x": 1}, "arr": [1]},
        {"id": None, "st": None, "arr": [None]},
    ]
