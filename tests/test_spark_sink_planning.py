"""The sink's planning checks without Spark, made the way the writer makes them (``frame_arrow_schema``,
``ignored_columns``, ``plan_topic``) on Spark schemas: what is refused before any task runs, and what is only
worth a warning.
"""

from __future__ import annotations

import logging
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import types as st

import txn_core
from spark_txn_sink.options import SOURCE_METADATA_COLUMNS, SinkOptions, parse_sink_options
from spark_txn_sink.stager import PartitionStager, TopicTarget
from spark_txn_sink.topic import frame_arrow_schema, ignored_columns, plan_topic
from spark_txn_source.reader import source_schema
from txn_core import ConfigurationError, SchemaMismatchError
from txn_core.clients.topics import METADATA_COLUMNS

ID = st.StructField("id", st.LongType())


def frame(*fields: tuple[str, st.DataType]) -> st.StructType:
    return st.StructType([ID, *(st.StructField(n, t) for n, t in fields)])


#: The metadata columns as a txnlog source types them.
SOURCE_METADATA = (
    ("_topic", st.StringType()),
    ("_partition", st.IntegerType()),
    ("_offset", st.LongType()),
    ("_timestamp", st.TimestampType()),
)


def test_the_sink_ignores_exactly_the_names_the_core_reserves() -> None:
    assert SOURCE_METADATA_COLUMNS == METADATA_COLUMNS


def test_a_frame_read_from_a_txnlog_source_has_its_metadata_columns_ignored(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/log"
    with txn_core.open_log(url) as log:
        log.create_topic("in", 1, pa.schema([("id", pa.int64())]))
    read = source_schema({"path": url, "topic": "in"})  # what spark.read.format("txnlog") gives the frame
    assert ignored_columns(read) == METADATA_COLUMNS
    assert frame_arrow_schema(read).names == ["id"]
    assert ignored_columns(frame(*SOURCE_METADATA)) == METADATA_COLUMNS  # e.g. INSERT INTO a view, by name
    assert ignored_columns(frame()) == ()
    # a read that retyped a metadata column with .schema(...) (documented: "_timestamp bigint") is a source's
    # frame all the same
    retyped = (*SOURCE_METADATA[:3], ("_timestamp", st.LongType()))
    assert ignored_columns(frame(*retyped)) == METADATA_COLUMNS


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        # the user's repro: their own event time, in a frame that never saw a txnlog source
        ((("_timestamp", st.TimestampType()),), "_topic is missing; _partition is missing; _offset is missing"),
        # a copy that dropped one of the source's columns: the others may be anything now
        (SOURCE_METADATA[:3], "_timestamp is missing"),
        # the source's set twice (a join of two reads): which one would be the user's?
        ((*SOURCE_METADATA, ("_topic", st.StringType())), "_topic appears 2 times"),
    ],
)
def test_a_column_named_like_a_metadata_column_is_refused_not_dropped(
    fields: tuple[tuple[str, st.DataType], ...], problem: str
) -> None:
    with pytest.raises(SchemaMismatchError) as info:
        frame_arrow_schema(frame(*fields))
    message = str(info.value)
    assert problem in message
    assert f"the frame has column(s) {list(dict.fromkeys(n for n, _ in fields))}" in message
    assert "Nothing was written" in message
    assert f"df.withColumnRenamed('{fields[0][0]}', 'event{fields[0][0]}')" in message
    assert "df.drop(" in message


def test_tasks_drop_only_the_columns_the_plan_ignored(tmp_path: Path) -> None:
    """The stager drops what the driver decided to ignore, nothing else: a reserved name the plan did not
    ignore reaches the core, which refuses it, rather than vanishing."""
    url = f"file://{tmp_path}/log"
    with txn_core.open_log(url) as log:
        log.create_topic("out", 1, pa.schema([("id", pa.int64())]))
        data = pa.RecordBatch.from_pydict({"id": [1], "_offset": pa.array([7], pa.int64())})
        plain = TopicTarget(url, (), "out", log.topics.get("out").schema, 1, None)
        with pytest.raises(SchemaMismatchError, match="'_offset' is not in the topic schema"):
            PartitionStager(plain, log.storage, "p", "t0a0", start=0).stage_all([data])
        ignoring = TopicTarget(url, (), "out", plain.schema, 1, None, ignored_columns=("_offset",))
        assert len(PartitionStager(ignoring, log.storage, "p", "t0a1", start=0).stage_all([data])) == 1


def sink_options(url: str, **extra: str) -> SinkOptions:
    return parse_sink_options({"path": url, "topic": "out", **extra}, streaming=False)


def plan(url: str, spark_schema: st.StructType, **extra: str) -> Any:
    opts = sink_options(url, **extra)
    with txn_core.open_log(url) as log:
        return plan_topic(log, opts, frame_arrow_schema(spark_schema))


NESTED = [
    ("s", st.StructType([st.StructField("a", st.IntegerType())]), "struct<a: int32>"),
    ("a", st.ArrayType(st.LongType()), "list<element: int64>"),
    ("m", st.MapType(st.StringType(), st.LongType()), "map<string, int64>"),
]


@pytest.mark.parametrize(("column", "kind", "arrow"), NESTED)
@pytest.mark.parametrize("existing", [False, True], ids=["created", "existing"])
def test_a_key_column_rows_cannot_be_routed_by_is_refused_while_planning(
    tmp_path: Path, column: str, kind: st.DataType, arrow: str, existing: bool
) -> None:
    url = f"file://{tmp_path}/log"
    schema = frame((column, kind))
    if existing:
        with txn_core.open_log(url) as log:
            log.create_topic("out", 2, frame_arrow_schema(schema))
    with pytest.raises(ConfigurationError) as info:
        plan(url, schema, partitions="2", keycolumn=column)
    message = str(info.value)
    assert f"keyColumn '{column}' has type {arrow}" in message
    assert f"F.to_json('{column}')" in message and "Nothing was written" in message


SCALARS = [
    st.NullType(),
    st.BooleanType(),
    st.ByteType(),
    st.IntegerType(),
    st.LongType(),
    st.FloatType(),
    st.DoubleType(),
    st.DecimalType(38, 2),
    st.StringType(),
    st.BinaryType(),
    st.DateType(),
    st.TimestampType(),
    st.TimestampNTZType(),
    st.DayTimeIntervalType(),
]


@pytest.mark.parametrize("kind", SCALARS, ids=lambda t: t.simpleString())
def test_scalar_key_columns_still_route(tmp_path: Path, kind: st.DataType) -> None:
    url = f"file://{tmp_path}/log"
    planned = plan(url, frame(("k", kind)), partitions="2", keycolumn="k")
    assert planned.create and planned.schema.names == ["id", "k"]


def test_a_partitions_option_an_existing_topic_does_not_take_is_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"file://{tmp_path}/log-{uuid.uuid4().hex[:8]}"
    with txn_core.open_log(url) as log:
        log.create_topic("out", 3, pa.schema([("id", pa.int64())]))
    caplog.set_level(logging.WARNING, logger="txnlog")
    assert plan(url, frame(), partitions="3").partitions == 3  # the topic's own count: nothing to say
    assert [r for r in caplog.records if r.name == "txnlog.spark.sink"] == []
    assert plan(url, frame(), partitions="7").partitions == 3
    assert plan(url, frame(), partitions="7").partitions == 3  # a stream plans every batch: said once
    (warning,) = [r for r in caplog.records if r.name == "txnlog.spark.sink"]
    assert warning.levelno == logging.WARNING
    assert warning.getMessage().startswith(
        "topic 'out' exists with 3 partition(s); option 'partitions' (7) is ignored: it only applies when the "
        "sink creates the topic"
    )
