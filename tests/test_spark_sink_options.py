"""Sink options, checkpoint reading and source/sink offset pairing: every bad input gets a clear error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spark_txn_sink.checkpoint import CheckpointError, SessionCheckpoint, locate, read_batch_offsets, read_query_id
from spark_txn_sink.faults import parse_faults
from spark_txn_sink.options import parse_sink_options
from spark_txn_sink.pairing import PairingError, group_offsets, normalize_log_url
from spark_txn_sink.topic import frame_arrow_schema, unstorable_columns
from txn_core import ConfigurationError, SchemaMismatchError

BASE = {"path": "/tmp/log", "topic": "out", "checkpointlocation": "/tmp/chk"}


def test_options_parse_storage_options_into_nested_values() -> None:
    opts = parse_sink_options(
        {
            **BASE,
            "storage.key": "AK",
            "storage.client_kwargs.endpoint_url": "http://h:1",
            "storage.anon": "false",
            "storage.config_kwargs": '{"retries": 3}',
            "partitions": "4",
            "keycolumn": "k",
            "transactionalid": "copier-1",
            "transactiontimeoutms": "30000",
        },
        streaming=True,
    )
    assert opts.storage_options == {
        "key": "AK",
        "client_kwargs": {"endpoint_url": "http://h:1"},
        "anon": False,
        "config_kwargs": {"retries": 3},
    }
    assert (opts.partitions, opts.key_column, opts.transactional_id, opts.transaction_timeout_ms) == (
        4,
        "k",
        "copier-1",
        30000,
    )


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"partition": "3"}, r"unknown txnlog sink option\(s\) \['partition'\]. Accepted: path"),
        ({"path": "memory://x"}, "memory:// log lives inside one process"),
        ({"path": ""}, "'path' is required"),
        ({"topic": "a/b"}, "invalid topic name 'a/b'"),
        ({"partitions": "0"}, r"'partitions' must be in \[1, 10000\], got 0"),
        ({"transactiontimeoutms": "1h"}, "'transactiontimeoutms' must be an integer"),
        ({"transactionalid": "__x"}, "reserved"),
        ({"consumergroup": "g h"}, "invalid group name"),
        ({"testing.fault": "after_lunch"}, "testing.fault item 'after_lunch'"),
        ({"storage.client_kwargs": '{"a": '}, "is not JSON"),
        ({"rollminagems": "0"}, r"'rollminagems' must be in \[120000, "),
    ],
)
def test_bad_options_are_refused_with_the_fix(extra: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        parse_sink_options({**BASE, **extra}, streaming=True)


def test_a_stream_without_a_checkpoint_option_is_under_the_sessions_root_and_batch_writes_ignore_a_group() -> None:
    """Spark calls a sink without ``checkpointLocation`` only when the session's
    ``spark.sql.streaming.checkpointLocation`` is set (it refuses a query with neither): accepted, the tasks
    learn where. A batch write has no source offsets to commit: ``consumerGroup`` there is the source's option
    of the view or table written to ("resume from the group"), ignored like the source's other options."""
    session = parse_sink_options({"path": "/l", "topic": "t", "queryname": "q"}, streaming=True)
    assert session.checkpoint_location is None and session.query_name == "q"
    batch = parse_sink_options({"path": "/l", "topic": "t", "consumergroup": "g"}, streaming=False)
    assert batch.consumer_group is None
    assert parse_sink_options({**BASE, "consumergroup": "g"}, streaming=True).consumer_group == "g"


def test_a_topic_list_and_a_missing_path_name_the_fix() -> None:
    with pytest.raises(ConfigurationError, match="names several topics, but a txnlog write goes to one topic"):
        parse_sink_options({"path": "/l", "topic": "a, b"}, streaming=False)
    with pytest.raises(ConfigurationError, match=r"writeStream.toTable\(name\) cannot write to a txnlog table"):
        parse_sink_options({"checkpointlocation": "/c", "topic": "t"}, streaming=True)
    with pytest.raises(ConfigurationError, match="txnlog tables are read-only to Spark") as info:
        parse_sink_options({}, streaming=False)
    assert "CREATE TEMPORARY VIEW v USING txnlog OPTIONS (path 'URL', topic 'T'), then INSERT INTO v" in str(info.value)


def test_types_a_topic_cannot_hold_are_named_with_what_to_write_instead() -> None:
    from pyspark.sql import types as st
    from pyspark.testing.objects import ExamplePointUDT

    schema = st.StructType(
        [
            st.StructField("id", st.LongType()),
            st.StructField("point", ExamplePointUDT()),
            st.StructField("spans", st.MapType(st.StringType(), st.CalendarIntervalType())),
            st.StructField("docs", st.ArrayType(st.StructType([st.StructField("doc", st.VariantType())]))),
        ]
    )
    assert [(column, kind) for column, kind, _ in unstorable_columns(schema)] == [
        ("point", "ExamplePointUDT"),
        ("spans.value", "interval"),
        ("docs[].doc", "variant"),
    ]
    with pytest.raises(SchemaMismatchError, match=r"point \(ExamplePointUDT\): write its SQL type"):
        frame_arrow_schema(schema)


def test_fault_specs_parse_points_actions_and_batches() -> None:
    faults = parse_faults("write@3, after_prepare:kill@2,before_init")
    assert [(f.point, f.action, f.batch) for f in faults] == [
        ("write", "raise", 3),
        ("after_prepare", "kill", 2),
        ("before_init", "raise", None),
    ]


def write_checkpoint(
    root: Path, batch: int, sources: list[str], header: str = "v1", query_id: str = "0f0e-query"
) -> Path:
    (root / "offsets").mkdir(parents=True, exist_ok=True)
    (root / "metadata").write_text(json.dumps({"id": query_id}))
    body = "\n".join([header, json.dumps({"batchWatermarkMs": 0}), *sources])
    (root / "offsets" / str(batch)).write_text(body)
    return root


def test_checkpoint_offsets_and_query_id_are_read_back(tmp_path: Path) -> None:
    src = json.dumps({"log": "file:///l", "topics": {"in": {"0": 5}}})
    chk = write_checkpoint(tmp_path / "chk", 7, [src, "-", "{not json"])
    assert read_query_id(str(chk), "file:///l", None) == "0f0e-query"
    assert read_query_id(f"file://{chk}", "file:///l", None) == "0f0e-query"
    offsets = read_batch_offsets(str(chk), 7, "file:///l", None)
    assert offsets.sources == ({"log": "file:///l", "topics": {"in": {"0": 5}}}, None, "{not json")


def test_checkpoint_problems_name_the_file_and_the_fix(tmp_path: Path) -> None:
    chk = write_checkpoint(tmp_path / "chk", 0, ["-"], header="v9")
    with pytest.raises(CheckpointError, match="not 'v1'"):
        read_batch_offsets(str(chk), 0, "file:///l", None)
    with pytest.raises(CheckpointError, match=r"offsets/1 does not exist.*asynchronous progress tracking"):
        read_batch_offsets(str(chk), 1, "file:///l", None)
    with pytest.raises(CheckpointError, match="does not exist"):
        read_query_id(str(tmp_path / "nowhere"), "file:///l", None)
    with pytest.raises(CheckpointError, match="cannot open checkpoint location"):
        read_query_id("nosuchfs://bucket/chk", "file:///l", None)


def test_a_query_under_the_sessions_checkpoint_root_is_found_where_spark_puts_it(tmp_path: Path) -> None:
    """Spark's ResolveWriteToStream: ``<root>/<queryName>``, or ``<root>/<random UUID>`` for an unnamed query."""
    root = tmp_path / "root"
    write_checkpoint(root / "orders-copy", 0, ["-"], query_id="named-query")
    write_checkpoint(root / "6a1c5e0e-uuid", 0, ["-"], query_id="unnamed-query")
    write_checkpoint(root / "other-uuid", 0, ["-"], query_id="someone-else")
    (root / "stray-file").write_text("not a checkpoint")
    named = SessionCheckpoint(f"file://{root}/", "orders-copy", "named-query")
    assert locate(named, "file:///l", None) == f"file://{root}/orders-copy"
    assert locate(SessionCheckpoint(str(root), None, "unnamed-query"), "file:///l", None) == f"{root}/6a1c5e0e-uuid"
    with pytest.raises(CheckpointError, match=r"holds query named-query, but the query writing is q2.*own queryName"):
        locate(SessionCheckpoint(str(root), "orders-copy", "q2"), "file:///l", None)
    with pytest.raises(CheckpointError, match="no checkpoint of query lost under the session root"):
        locate(SessionCheckpoint(str(root), None, "lost"), "file:///l", None)


def test_log_urls_are_compared_in_canonical_form(tmp_path: Path) -> None:
    assert normalize_log_url(str(tmp_path / "log")) == f"file://{tmp_path}/log"
    assert normalize_log_url(f"file://{tmp_path}/log/") == normalize_log_url(f"{tmp_path}/log")
    assert normalize_log_url("s3a://user:secret@bucket/prefix/") == "s3://bucket/prefix"
    assert normalize_log_url("s3://bucket/a") != normalize_log_url("s3://bucket/b")


def source(log: str, **topics: dict[str, int]) -> dict[str, object]:
    return {"log": log, "topics": topics}


def test_group_offsets_come_from_every_txnlog_source_of_the_sink_log() -> None:
    sources = [source("file:///l", a={"0": 3, "1": 4}), None, {"n": 5}, "x", source("file:///l/", b={"0": 9})]
    expected = {("a", 0): 3, ("a", 1): 4, ("b", 0): 9}
    assert group_offsets(sources, "file:///l", batch_id=2, group="g") == expected


@pytest.mark.parametrize(
    ("sources", "message"),
    [
        ([source("file:///other", a={"0": 1})], "reads txnlog 'file:///other' but writes to 'file:///l'"),
        ([source("file:///l", a={"0": 1}), source("file:///l", a={"0": 2})], "batch 2 at different offsets"),
        ([{"n": 5}, None], "has no txnlog source offsets"),
        ([source("file:///l", a={"0": -1})], "negative source offset"),
        ([source("file:///l", a={"x": 1})], "malformed txnlog source offset"),
    ],
)
def test_unpairable_offsets_fail_the_batch_with_the_reason(sources: list[object], message: str) -> None:
    with pytest.raises(PairingError, match=message):
        group_offsets(sources, "file:///l", batch_id=2, group="g")
