"""Source options: every bad option or value fails with an error naming the option and what is accepted.

Parsing runs when Spark asks the source for its schema and reader, i.e. when the query starts; these tests
drive the parser directly. ``test_spark_source.py`` shows the same errors surfacing through Spark.
"""

from __future__ import annotations

import pytest

from spark_txn_source.options import SourceOptionError, parse_options

BASE = {"path": "file:///tmp/log", "topic": "t"}


def parse(streaming: bool = True, **extra: str) -> object:
    return parse_options({**BASE, **extra}, streaming=streaming)


# (options, streaming, pattern the error must match) - one row per way to get an option wrong
BAD = [
    ({"fooBar": "1"}, True, r"unknown option 'fooBar'.*Accepted options.*startingOffsets"),
    (
        {"startingOffset": "earliest"},
        True,
        r"unknown option 'startingOffset'.*Did you mean 'startingOffsets'",
    ),
    ({"path": ""}, True, r"option 'path' is missing.*load\(URL\)"),
    ({"topic": ""}, True, r"option 'topic' is missing"),
    ({"topic": "a,b/c"}, True, r"option 'topic' = 'a,b/c'.*invalid topic name 'b/c'"),
    (
        {"startingOffsets": "newest"},
        True,
        r"option 'startingOffsets' = 'newest' is not valid; accepted values: "
        r"earliest, latest, group, or JSON",
    ),
    (
        {"startingOffsets": '{"t": {"0": -3}}'},
        True,
        r"'startingOffsets': topic 't' partition '0' offset -3.*-2 or -1",
    ),
    ({"startingOffsets": '{"t": {"x": 1}}'}, True, r"partition 'x'"),
    ({"startingOffsets": '{"t": 5}'}, True, r"topic 't' must map partition numbers to offsets"),
    (
        {"startingOffsets": '{"other": {"0": 1}}'},
        True,
        r"names topic\(s\) \['other'\] that option 'topic' does not",
    ),
    ({"startingOffsets": "latest"}, False, r"'latest' is not valid for a batch read"),
    ({"startingOffsets": '{"t": {"0": -1}}'}, False, r"-1 \(latest\) is not valid for a batch read"),
    ({"startingOffsets": "group"}, True, r"needs option 'consumerGroup'"),
    (
        {"startingOffsets": "earliest", "consumerGroup": "g"},
        True,
        r"'consumerGroup' applies to startingOffsets=group",
    ),
    ({"consumerGroup": "bad name"}, True, r"option 'consumerGroup'.*invalid consumer group name"),
    (
        {"startingTimestamp": "yesterday"},
        True,
        r"'startingTimestamp' = 'yesterday'.*milliseconds since the epoch",
    ),
    ({"startingTimestamp": "-5"}, True, r"'startingTimestamp' = '-5'"),
    ({"startingTimestamp": "5", "startingOffsets": "earliest"}, True, r"exclude each other"),
    ({"endingOffsets": "latest"}, True, r"'endingOffsets' applies to batch reads.*AvailableNow"),
    (
        {"endingOffsets": "earliest"},
        False,
        r"'endingOffsets' = 'earliest' is not valid; accepted values: latest",
    ),
    ({"endingOffsets": '{"t": {"0": -2}}'}, False, r"offset -2 is not valid.*or -1"),
    ({"maxOffsetsPerTrigger": "0"}, True, r"'maxOffsetsPerTrigger' = '0'.*a positive integer"),
    ({"maxOffsetsPerTrigger": "lots"}, True, r"'maxOffsetsPerTrigger' = 'lots'.*a positive integer"),
    ({"maxOffsetsPerTrigger": "10"}, False, r"'maxOffsetsPerTrigger' applies to streaming reads"),
    (
        {"isolationLevel": "serializable"},
        True,
        r"'isolationLevel' = 'serializable'.*read_committed, read_uncommitted",
    ),
    ({"includeMetadata": "yes"}, True, r"'includeMetadata' = 'yes'.*true, false"),
    ({"failOnDataLoss": "maybe"}, True, r"'failOnDataLoss' = 'maybe'.*true, false"),
    ({"minPartitions": "-1"}, True, r"'minPartitions' = '-1'.*a positive integer"),
]


@pytest.mark.parametrize(("extra", "streaming", "pattern"), BAD, ids=[str(b[0]) for b in BAD])
def test_a_bad_option_names_the_option_and_the_accepted_values(
    extra: dict[str, str], streaming: bool, pattern: str
) -> None:
    with pytest.raises(SourceOptionError, match=pattern):
        parse(streaming, **extra)


def test_defaults_follow_kafka_and_delta_habits() -> None:
    stream = parse_options(BASE, streaming=True)
    assert (stream.starting, stream.isolation, stream.include_metadata, stream.fail_on_data_loss) == (
        "latest",
        "read_committed",
        True,
        True,
    )
    batch = parse_options(BASE, streaming=False)
    assert (batch.starting, batch.ending) == ("earliest", "latest")
    assert parse_options({**BASE, "consumerGroup": "g"}, streaming=True).starting == "group"


def test_option_names_are_case_insensitive_and_values_parsed() -> None:
    opts = parse_options(
        {
            "PATH": "s3://b/log",
            "Topic": " a , b ,a",
            "STARTINGOFFSETS": '{"a": {"0": 3, "1": -2}}',
            "maxoffsetspertrigger": "100",
            "isolationlevel": "READ_UNCOMMITTED",
            "storage.client_kwargs": '{"endpoint_url": "http://x"}',
            "storage.anon": "false",
            "storage.key": "k",
        },
        streaming=True,
    )
    assert opts.topics == ("a", "b")
    assert opts.starting == "offsets" and opts.starting_offsets == {"a": {0: 3, 1: -2}}
    assert opts.max_offsets_per_trigger == 100 and opts.isolation == "read_uncommitted"
    assert opts.storage_options == {"client_kwargs": {"endpoint_url": "http://x"}, "anon": False, "key": "k"}


def test_schema_time_parsing_accepts_both_kinds_of_read() -> None:
    # DataSource.schema() cannot tell a batch from a streaming read: it checks only what both share.
    assert parse_options({**BASE, "endingOffsets": "latest", "maxOffsetsPerTrigger": "5"}, streaming=None)


def test_dotted_storage_options_nest_like_the_sinks() -> None:
    # One set of storage.* options must work for a source and a sink: a dotted key was passed to fsspec
    # verbatim ("client_kwargs.endpoint_url"), which s3fs silently ignores (it then talks to AWS).
    opts = parse_options(
        {
            **BASE,
            "storage.key": "k",
            "storage.client_kwargs.endpoint_url": "http://h:1",
            "storage.client_kwargs.region_name": "us-east-1",
            "storage.config_kwargs": '{"retries": {"max_attempts": 3}}',
            "storage.config_kwargs.connect_timeout": "5",
        },
        streaming=True,
    )
    assert opts.storage_options == {
        "key": "k",
        "client_kwargs": {"endpoint_url": "http://h:1", "region_name": "us-east-1"},
        "config_kwargs": {"retries": {"max_attempts": 3}, "connect_timeout": "5"},
    }
    with pytest.raises(SourceOptionError, match=r"storage\.key\.x"):
        parse_options({**BASE, "storage.key": "k", "storage.key.x": "1"}, streaming=True)
    with pytest.raises(SourceOptionError, match="bad storage option name"):
        parse_options({**BASE, "storage.a..b": "1"}, streaming=True)
