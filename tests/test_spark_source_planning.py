"""The source's driver side without Spark: offsets, read limits, AvailableNow, new partitions, data loss,
starting positions and batch planning with pushed filters. The readers are driven the way Spark drives
them (``initialOffset`` -> ``latestOffset`` -> ``partitions`` -> ``read``), on an in-process log.
"""

from __future__ import annotations

import datetime
import logging
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql.datasource import EqualTo, GreaterThan, GreaterThanOrEqual, In, LessThan, Not
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, ReadMinRows
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType, TimestampType

import txn_core
from spark_txn_source.batch import TxnLogBatchReader, TxnLogFilteringBatchReader
from spark_txn_source.planning import (
    MAX_OFFSETS_PER_TASK,
    SourceCorruptDataError,
    SourceDataLossError,
    fair_split,
    pack_ranges,
)
from spark_txn_source.reader import make_batch_reader, make_stream_reader, source_schema
from spark_txn_source.schema import arrow_target, conform, metadata_fields
from spark_txn_source.stream import TxnLogStreamReader
from txn_core.format import envelope, paths
from txn_core.format.entry import EntryKind, crc32, encode_arrow
from txn_core.format.ids import TopicPartition
from txn_core.partition import partition as partition_module
from txn_core.partition.ranges import OffsetRange, read_range
from txn_core.partition.records import MetadataColumns

SCHEMA = pa.schema([("id", pa.int64())])


@pytest.fixture
def url() -> str:
    u = f"memory://{uuid.uuid4().hex}"
    log = txn_core.open_log(u)
    log.create_topic("t", 2, SCHEMA)
    return u


def write(url: str, partition: int, ids: list[int], *, commit: bool = True, tid: str | None = None) -> Any:
    log = txn_core.open_log(url)
    if tid is None:
        p = log.producer()
        p.send("t", pa.table({"id": ids}), partition=partition)
        p.flush()
        return p
    p = log.producer(tid)
    p.init_transactions()
    p.begin_transaction()
    p.send("t", pa.table({"id": ids}), partition=partition)
    p.flush()
    if commit:
        p.commit_transaction()
    return p


def stream(url: str, **options: str) -> TxnLogStreamReader:
    default = {} if "startingTimestamp" in options else {"startingOffsets": "earliest"}
    opts = {"path": url, "topic": "t", **default, **options}
    return make_stream_reader(opts, source_schema(opts))


def positions(offset: dict[str, Any] | None) -> dict[str, int]:
    assert offset is not None
    return {f"{t}-{p}": o for t, parts in offset["topics"].items() for p, o in parts.items()}


def read_ids(reader: Any, parts: Any) -> list[int]:
    out: list[int] = []
    target = arrow_target(reader.schema)
    for part in parts:
        for batch in reader.read(part):
            assert batch.schema.equals(target)  # exactly what Spark requires of a RecordBatch
            out.extend(batch.column("id").to_pylist())
    return out


def test_fair_split_shares_the_budget_and_gives_small_partitions_all_they_have() -> None:
    a, b, c = (TopicPartition("t", i) for i in range(3))
    assert fair_split({a: 100, b: 10, c: 0}, 60) == {a: 50, b: 10, c: 0}
    assert fair_split({a: 100, b: 100, c: 100}, 10) == {a: 3, b: 3, c: 4}
    assert fair_split({a: 5, b: 5}, 100) == {a: 5, b: 5}
    assert sum(fair_split({a: 7, b: 9, c: 11}, 2).values()) == 2


def test_offsets_have_the_shape_the_sink_reads(url: str) -> None:
    write(url, 0, [1, 2, 3])
    reader = stream(url)
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    assert end == {"log": txn_core.open_log(url).url, "topics": {"t": {"0": 3, "1": 0}}}
    assert read_ids(reader, reader.partitions(start, end)) == [1, 2, 3]
    assert reader.latestOffset(end, ReadAllAvailable()) == end  # no new data: the same dict, no batch


def test_a_micro_batch_never_reaches_into_an_open_transaction(url: str) -> None:
    reader = stream(url)
    start = reader.initialOffset()
    write(url, 0, [1])
    open_txn = write(url, 0, [-1, -2], commit=False, tid="slow")
    write(url, 0, [2])  # committed, but after the open transaction
    end = reader.latestOffset(start, ReadAllAvailable())
    assert positions(end) == {"t-0": 1, "t-1": 0}
    assert read_ids(reader, reader.partitions(start, end)) == [1]
    open_txn.commit_transaction()
    end2 = reader.latestOffset(end, ReadAllAvailable())
    assert read_ids(reader, reader.partitions(end, end2)) == [-1, -2, 2]
    aborted = write(url, 1, [-3], commit=False, tid="undone")
    aborted.abort_transaction()
    write(url, 1, [4])
    end3 = reader.latestOffset(end2, ReadAllAvailable())
    assert read_ids(reader, reader.partitions(end2, end3)) == [4]


def test_max_offsets_per_trigger_is_the_default_limit_and_spark_limits_win(url: str) -> None:
    write(url, 0, list(range(100)))
    write(url, 1, list(range(100, 110)))
    reader = stream(url, maxOffsetsPerTrigger="40")
    assert reader.getDefaultReadLimit() == ReadMaxRows(40)
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadMaxRows(40))
    assert positions(end) == {"t-0": 30, "t-1": 10}
    assert positions(reader.latestOffset(start, ReadAllAvailable())) == {"t-0": 100, "t-1": 10}
    assert reader.latestOffset(start, ReadMinRows(111)) == start  # not enough yet: no batch
    assert positions(reader.latestOffset(start, ReadMinRows(110))) == {"t-0": 100, "t-1": 10}
    assert positions(reader.reportLatestOffset()) == {"t-0": 100, "t-1": 10}  # the true end, uncapped


def test_available_now_runs_limited_batches_up_to_the_end_fixed_at_start(url: str) -> None:
    write(url, 0, list(range(25)))
    reader = stream(url, maxOffsetsPerTrigger="10")
    reader.prepareForTriggerAvailableNow()
    write(url, 0, list(range(100, 105)))  # after the start: not part of this run
    start = reader.initialOffset()
    ends = []
    while (end := reader.latestOffset(start, reader.getDefaultReadLimit())) != start:
        ends.append(positions(end)["t-0"])
        start = end
    assert ends == [10, 20, 25]
    assert positions(reader.reportLatestOffset())["t-0"] == 30  # progress still shows the real backlog


def test_partitions_added_later_are_read_from_their_beginning(url: str) -> None:
    write(url, 0, [1])
    reader = stream(url)
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    txn_core.open_log(url).add_partitions("t", 3)
    write(url, 2, [7, 8])
    end2 = reader.latestOffset(end, ReadAllAvailable())
    assert positions(end2) == {"t-0": 1, "t-1": 0, "t-2": 2}
    assert read_ids(reader, reader.partitions(end, end2)) == [7, 8]


def retain_from(url: str, partition: int, slot: int, offset: int) -> None:
    """What retention does: a new log start, then the entries before it deleted."""
    log = txn_core.open_log(url)
    path = paths.partition_log_path("t", partition)
    envelope.create_json(
        log.storage,
        paths.log_start(path) + paths.slot_name(slot),
        envelope.ObjectKind.LOG_START,
        {"slot": slot, "offset": offset},
    )
    for s in range(slot):
        log.storage.delete(log.partition_log(path).entries.key(s))


def test_offsets_removed_by_retention_fail_the_query_unless_accepted(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for i in range(3):
        write(url, 0, [i * 2, i * 2 + 1])
    monkeypatch.setattr(partition_module, "LOG_START_RECHECK_S", 3600.0)
    reader = stream(url)
    start = reader.initialOffset()
    retain_from(url, 0, 2, 4)
    # Within LOG_START_RECHECK_S of its last look the driver may not know yet (it sees no new data, never a
    # lost or wrong row). Here its listing, made when it opened a moment ago, shows an entry past the removed
    # ones: it looks at once, plans up to the end, and planning the batch's reads fails the query.
    early = reader.latestOffset(start, ReadAllAvailable())
    assert positions(early)["t-0"] == 6
    with pytest.raises(SourceDataLossError, match=r"t-0: offsets \[0, 4\) were removed.*failOnDataLoss=false"):
        reader.partitions(start, early)
    monkeypatch.setattr(partition_module, "LOG_START_RECHECK_S", 0.0)
    with pytest.raises(SourceDataLossError, match=r"t-0: offsets \[0, 4\) were removed.*failOnDataLoss=false"):
        reader.latestOffset(start, ReadAllAvailable())
    lenient = stream(url, failOnDataLoss="false")
    end = lenient.latestOffset(start, ReadAllAvailable())
    assert read_ids(lenient, lenient.partitions(start, end)) == [4, 5]


def damage_header(url: str, partition: int, slot: int) -> str:
    """Flip a bit in the header of one entry (PROTOCOL.md "Damage"); returns its key."""
    storage = txn_core.open_log(url).storage
    key = paths.entries(paths.partition_log_path("t", partition)) + paths.slot_name(slot)
    data = bytearray(storage.read(key))
    data[20] ^= 0x01
    storage.delete(key)
    storage.create(key, [bytes(data)])
    return key


def test_a_stream_fails_at_a_damaged_entry_once_it_read_everything_before_it_unless_it_accepts_loss(
    url: str, caplog: pytest.LogCaptureFixture
) -> None:
    for i in range(3):
        write(url, 0, [i * 2, i * 2 + 1])
    write(url, 1, [100])
    key = damage_header(url, 0, 1)
    reader = stream(url)
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    assert positions(end) == {"t-0": 2, "t-1": 1}, "planned up to the damaged entry"
    assert sorted(read_ids(reader, reader.partitions(start, end))) == [0, 1, 100]
    with pytest.raises(SourceCorruptDataError, match=f"{key} is damaged.*failOnDataLoss=false"):
        reader.latestOffset(end, ReadAllAvailable())  # nothing before it is left: never a silent stall

    caplog.set_level(logging.WARNING, logger="txnlog")
    lenient = stream(url, failOnDataLoss="false")
    end = lenient.latestOffset(start, ReadAllAvailable())
    assert positions(end) == {"t-0": 6, "t-1": 1}
    assert sorted(read_ids(lenient, lenient.partitions(start, end))) == [0, 1, 4, 5, 100]
    warned = [r.getMessage() for r in caplog.records if key in r.getMessage()]
    assert warned and all("skipping them" in m for m in warned), "planning and the task both say so"


def test_a_batch_read_fails_at_a_damaged_entry_unless_it_accepts_loss(url: str) -> None:
    for i in range(3):
        write(url, 0, [i * 2, i * 2 + 1])
    planned, _ = batch(url)
    parts = planned.partitions()  # planned before the damage: the task meets it
    key = damage_header(url, 0, 1)
    with pytest.raises(SourceCorruptDataError, match=f"{key} is damaged.*failOnDataLoss=false"):
        read_ids(planned, parts)
    strict, _ = batch(url)
    with pytest.raises(SourceCorruptDataError, match=f"{key} is damaged.*failOnDataLoss=false"):
        strict.partitions()  # a batch read would end short at it: it fails at once
    lenient, _ = batch(url, failOnDataLoss="false")
    assert read_ids(lenient, lenient.partitions()) == [0, 1, 4, 5]
    below, _ = batch(url, endingOffsets='{"t": {"0": 2, "1": -1}}')
    assert read_ids(below, below.partitions()) == [0, 1], "a read that ends before the damage needs nothing of it"


def test_a_checkpoint_of_another_log_is_refused(url: str) -> None:
    reader = stream(url)
    with pytest.raises(txn_core.ConfigurationError, match="belong to log 'memory://elsewhere'"):
        reader.latestOffset({"log": "memory://elsewhere", "topics": {"t": {"0": 0}}}, ReadAllAvailable())


def test_starting_positions(url: str) -> None:
    write(url, 0, [1, 2])
    write(url, 1, [3])
    assert positions(stream(url, startingOffsets="latest").initialOffset()) == {"t-0": 2, "t-1": 1}
    spec = '{"t": {"0": 1, "1": -2}}'
    assert positions(stream(url, startingOffsets=spec).initialOffset()) == {"t-0": 1, "t-1": 0}
    with pytest.raises(txn_core.ConfigurationError, match=r"every partition.*Missing: \['t-1'\]"):
        stream(url, startingOffsets='{"t": {"0": 1}}').initialOffset()
    txn_core.open_log(url).groups.commit("g", {("t", 0): 1})
    opts = {"startingOffsets": "group", "consumerGroup": "g"}
    assert positions(stream(url, **opts).initialOffset()) == {"t-0": 1, "t-1": 0}
    with pytest.raises(txn_core.TopicNotFoundError, match="unknown topic 'nope'; existing topics: t"):
        source_schema({"path": url, "topic": "nope"})
    with pytest.raises(txn_core.ConfigurationError, match="no txnlog at"):
        source_schema({"path": f"memory://{uuid.uuid4().hex}", "topic": "t"})


def test_starting_timestamp_starts_at_the_first_entry_stamped_at_or_after_it(url: str) -> None:
    log = txn_core.open_log(url)
    plog = log.partition_log(paths.partition_log_path("t", 0))
    for i, ts in enumerate([1_000, 2_000, 3_000]):
        raw = encode_arrow([pa.record_batch({"id": [i]})], SCHEMA)
        plog.append(EntryKind.DATA, [memoryview(raw)], len(raw), crc32(raw), 1, timestamp_ms=ts)
    assert positions(stream(url, startingTimestamp="1500").initialOffset()) == {"t-0": 1, "t-1": 0}
    assert positions(stream(url, startingTimestamp="9999").initialOffset()) == {"t-0": 3, "t-1": 0}


# --- batch ---------------------------------------------------------------------------------------


def batch(url: str, filters: tuple[Any, ...] = (), **options: str) -> tuple[TxnLogBatchReader, list[Any]]:
    """A batch reader after Spark's filter pushdown, and the filters it left to Spark."""
    opts = {"path": url, "topic": "t", **options}
    plain = make_batch_reader(opts, source_schema(opts))
    assert type(plain) is TxnLogBatchReader  # outside Spark's pushdown step: no pushFilters
    reader = TxnLogFilteringBatchReader(plain.opts, plain.schema)
    return reader, list(reader.pushFilters(list(filters)))


def ranges_of(parts: Any) -> list[Any]:
    return [p.range for p in parts]


def test_batch_reads_committed_data_between_starting_and_ending_offsets(url: str) -> None:
    write(url, 0, list(range(10)))
    write(url, 1, list(range(10, 20)))
    write(url, 1, [-1], commit=False, tid="open")  # past the last stable offset: never read
    reader, _ = batch(url)
    assert sorted(read_ids(reader, reader.partitions())) == list(range(20))
    ranged, _ = batch(url, startingOffsets='{"t": {"0": 2, "1": -2}}', endingOffsets='{"t": {"0": 5, "1": 99}}')
    assert sorted(read_ids(ranged, ranged.partitions())) == [2, 3, 4, *range(10, 20)]


def test_pushed_filters_prune_partitions_offsets_and_timestamps(url: str) -> None:
    log = txn_core.open_log(url)
    for p in (0, 1):
        plog = log.partition_log(paths.partition_log_path("t", p))
        for i in range(4):  # entries of 10 records stamped 1s apart
            raw = encode_arrow([pa.record_batch({"id": list(range(i * 10, i * 10 + 10))})], SCHEMA)
            plog.append(
                EntryKind.DATA,
                [memoryview(raw)],
                len(raw),
                crc32(raw),
                10,
                timestamp_ms=1_700_000_000_000 + i * 1000,
            )
    pushed = (
        EqualTo(("_partition",), 1),
        GreaterThanOrEqual(("_offset",), 15),
        LessThan(("_offset",), 35),
        Not(EqualTo(("_offset",), 20)),
        In(("_offset",), (1, 2)),
    )
    reader, left = batch(url, pushed)
    assert [type(f).__name__ for f in left] == ["Not", "In"]  # the rest is applied exactly by the source
    parts = reader.partitions()
    assert [(r.partition, r.start, r.end) for r in ranges_of(parts)] == [(1, 15, 35)]
    assert read_ids(reader, parts) == list(range(15, 35))
    ts = datetime.datetime.fromtimestamp(1_700_000_001.5, tz=datetime.UTC)
    by_time, left = batch(url, (GreaterThan(("_timestamp",), ts), In(("_topic",), ("t",))))
    assert left == []
    parts = by_time.partitions()
    assert {(r.start, r.end) for r in ranges_of(parts)} == {(20, 40)}  # entries stamped before are not read
    assert sorted(read_ids(by_time, parts)) == sorted(list(range(20, 40)) * 2)
    nothing, _ = batch(url, (EqualTo(("_topic",), "other"),))
    assert nothing.partitions() == []


def test_several_topics_read_as_one_schema_with_nulls_where_a_topic_lacks_a_column(url: str) -> None:
    log = txn_core.open_log(url)
    log.create_topic("wide", 1, pa.schema([("id", pa.int64()), ("note", pa.large_string())]))
    p = log.producer()
    p.send("wide", pa.table({"id": [7], "note": pa.array(["hi"], pa.large_string())}), partition=0)
    p.flush()
    write(url, 0, [1])
    opts = {"path": url, "topic": "t,wide", "startingOffsets": "earliest"}
    schema = source_schema(opts)
    assert schema.fieldNames() == ["id", "note", "_topic", "_partition", "_offset", "_timestamp"]
    reader = make_stream_reader(opts, schema)
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    rows: list[tuple[str, int, str | None]] = []
    for part in reader.partitions(start, end):
        for b in reader.read(part):
            assert b.schema.equals(arrow_target(schema))  # large_string cast to string, as Spark requires
            rows.extend(
                zip(
                    b.column("_topic").to_pylist(),
                    b.column("id").to_pylist(),
                    b.column("note").to_pylist(),
                    strict=True,
                )
            )
    assert sorted(rows) == [("t", 1, None), ("wide", 7, "hi")]
    log.create_topic("clash", 1, pa.schema([("id", pa.string())]))
    with pytest.raises(txn_core.ConfigurationError, match=r"incompatible schemas.*separate queries"):
        source_schema({"path": url, "topic": "t,clash"})


def test_batches_come_out_in_sparks_types_and_are_handed_over_without_a_rebuild(url: str) -> None:
    """The metadata columns are built nullable and in microseconds, as Spark's Arrow schema has them, so a
    batch of a topic whose columns Spark represents as they are is the target schema already (no cast, no
    copy); the values are those the core consumer delivers."""
    write(url, 0, [1, 2, 3])
    reader = stream(url)
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    target = arrow_target(reader.schema)
    rng = next(p.range for p in reader.partitions(start, end) if p.range.partition == 0)  # type: ignore[attr-defined]
    log = txn_core.open_log(url)
    batches = list(read_range(log.partition_log(rng.path), rng, metadata_fields=metadata_fields(target)))
    assert [b.schema.equals(target) for b in batches] == [True]
    assert conform(batches[0], target) is batches[0]
    consumer = log.consumer()
    consumer.assign([("t", 0)])
    expected = consumer.poll()
    got = batches[0]
    assert got.column("_offset").to_pylist() == expected.column("_offset").to_pylist() == [0, 1, 2]
    assert got.column("_timestamp").to_pylist() == expected.column("_timestamp").to_pylist()  # same instants
    assert got.column("_topic").to_pylist() == ["t"] * 3 and got.column("_partition").to_pylist() == [0] * 3


def test_a_user_schema_that_retypes_a_metadata_column_gets_it_cast(url: str) -> None:
    write(url, 0, [1])
    opts = {"path": url, "topic": "t", "startingOffsets": "earliest"}
    schema = StructType([StructField("id", LongType()), StructField("_timestamp", LongType())])
    assert [f.type for f in metadata_fields(arrow_target(schema))] == [f.type for f in txn_core.METADATA_FIELDS]
    reader = make_stream_reader(opts, schema)
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    (batch,) = [b for p in reader.partitions(start, end) for b in reader.read(p)]
    assert batch.schema.equals(arrow_target(schema))
    consumer = txn_core.open_log(url).consumer()
    consumer.assign([("t", 0)])
    appended_ms = consumer.poll().column("_timestamp").cast(pa.int64()).to_pylist()
    assert batch.column("_timestamp").to_pylist() == appended_ms  # txnlog's milliseconds, cast as before
    with pytest.raises(txn_core.ConfigurationError, match="metadata fields"):
        MetadataColumns("t", 0, [*txn_core.METADATA_FIELDS[:3], pa.field("_timestamp", pa.timestamp("s", tz="UTC"))])


def test_a_batch_read_whose_ending_offsets_come_before_its_start_is_refused(url: str) -> None:
    """As Spark's Kafka source: an inverted range is a mistyped option, not an empty read."""
    write(url, 0, list(range(10)))
    write(url, 1, list(range(10)))
    opts = {
        "path": url,
        "topic": "t",
        "startingOffsets": '{"t": {"0": 8, "1": 2}}',
        "endingOffsets": '{"t": {"0": 3, "1": 5}}',
    }
    with pytest.raises(txn_core.ConfigurationError, match=r"t-0: 8 > 3\. Give each partition an ending offset"):
        make_batch_reader(opts, source_schema(opts)).partitions()
    equal = {**opts, "startingOffsets": '{"t": {"0": 3, "1": 2}}'}  # an empty range is fine
    reader = make_batch_reader(equal, source_schema(equal))
    assert read_ids(reader, reader.partitions()) == [2, 3, 4]


def test_a_batch_read_whose_starting_offsets_lie_past_the_end_is_refused(url: str) -> None:
    """As Spark's Kafka source (a range beginning after its end fails the task): a start past what can be
    read is a mistyped option, not an empty read; one inside an open transaction is named as such."""
    write(url, 0, list(range(10)))
    write(url, 1, list(range(10)))
    open_txn = write(url, 1, [100, 101], commit=False, tid="holder")
    opts = {"path": url, "topic": "t", "startingOffsets": '{"t": {"0": 12, "1": 11}}'}
    with pytest.raises(txn_core.ConfigurationError, match="startingOffsets") as raised:
        make_batch_reader(opts, source_schema(opts)).partitions()
    assert "t-0: 12 > 10," in str(raised.value)
    assert "t-1: 11 > 10 (the log end is 12; an open transaction" in str(raised.value)
    at_end = {**opts, "startingOffsets": '{"t": {"0": 10, "1": 10}}'}  # at the end: an empty read, fine
    reader = make_batch_reader(at_end, source_schema(at_end))
    assert read_ids(reader, reader.partitions()) == []
    open_txn.abort_transaction()


def test_a_user_schema_giving_a_topic_column_another_type_is_refused_while_planning(url: str) -> None:
    """A bigint read as a timestamp gave wrong instants, as a string gave text, and a failing cast a raw
    ArrowInvalid inside a task naming no column: the reader now refuses it when Spark creates it, before any
    task, naming the column, both types and the fix."""
    write(url, 0, [1])
    opts = {"path": url, "topic": "t", "startingOffsets": "earliest"}
    for wanted in (TimestampType(), StringType(), IntegerType()):
        schema = StructType([StructField("id", wanted)])
        for make in (make_batch_reader, make_stream_reader):
            with pytest.raises(txn_core.ConfigurationError) as info:
                make(opts, schema)
            assert f"column 'id' is requested as {wanted.simpleString()}, the topics store bigint" in str(info.value)
            assert "Drop .schema(...)" in str(info.value)
            assert f"F.col('id').cast('{wanted.simpleString()}')" in str(info.value)
            assert "DROP TABLE" not in str(info.value)
    stored = StructType([StructField("id", StringType())])  # a table's schema, changed with ALTER COLUMN
    with pytest.raises(txn_core.ConfigurationError, match=r"requested as string.*DROP TABLE it and CREATE TABLE"):
        make_batch_reader(opts, stored, table=True)


def test_a_requested_schema_that_only_differs_in_nullability_collation_or_metadata_types_reads(url: str) -> None:
    """What worked for a reason keeps working: a catalog table's stored schema, or a user's, may declare
    columns non-null (at any depth), carry field metadata, give strings a collation, or retype the metadata
    columns (txnlog builds those, and casts them)."""
    log = txn_core.open_log(url)
    nested = pa.schema([("id", pa.int64()), ("s", pa.struct([("a", pa.int32())])), ("n", pa.large_string())])
    log.create_topic("n", 1, nested)
    p = log.producer()
    p.send("n", pa.table({"id": [1], "s": [{"a": 2}], "n": pa.array(["x"], pa.large_string())}, schema=nested))
    p.flush()
    schema = StructType(
        [
            StructField("id", LongType(), nullable=False, metadata={"comment": "the id"}),
            StructField("s", StructType([StructField("a", IntegerType(), nullable=False)]), nullable=False),
            StructField("n", StringType("UTF8_LCASE")),
            StructField("_partition", LongType()),
        ]
    )
    opts = {"path": url, "topic": "n", "startingOffsets": "earliest"}
    reader = make_batch_reader(opts, schema)
    (batch,) = [b for part in reader.partitions() for b in reader.read(part)]
    assert batch.to_pylist() == [{"id": 1, "s": {"a": 2}, "n": "x", "_partition": 0}]


def test_a_table_schema_naming_a_column_the_topics_lack_names_alter_table_and_the_fix(url: str) -> None:
    schema = StructType([StructField("id", LongType()), StructField("z", IntegerType())])
    opts = {"path": url, "topic": "t"}
    with pytest.raises(txn_core.ConfigurationError) as info:
        make_batch_reader(opts, schema, table=True)
    message = str(info.value)
    assert "names column(s) ['z'] that the topics do not have" in message
    assert "ALTER TABLE ... ADD COLUMNS" in message
    assert "DROP TABLE it and CREATE TABLE it again" in message and "leaves the log" in message
    with pytest.raises(txn_core.ConfigurationError, match=r"\['z'\].*Drop .schema\(...\).*ALTER TABLE.*DROP TABLE"):
        make_batch_reader(opts, schema)  # spark.read.schema(...): both causes named


def test_small_ranges_are_packed_into_one_task_and_large_ones_are_not() -> None:
    def rng(p: int, size: int) -> OffsetRange:
        return OffsetRange(f"p{p}", "t", p, 0, size, 0)

    small = [rng(p, 2_000) for p in range(4)]
    assert pack_ranges(small) == [tuple(small)], "a small micro-batch is one task"
    assert pack_ranges(small, min_tasks=4) == [(r,) for r in small], "minPartitions wins"
    assert pack_ranges(small, min_tasks=2) == [(r,) for r in small], "never fewer tasks than minPartitions"
    big = [rng(p, 500_000) for p in range(4)]
    assert pack_ranges(big) == [(r,) for r in big]
    mixed = [rng(0, 100), rng(1, MAX_OFFSETS_PER_TASK), rng(2, 100), rng(3, 100)]
    tasks = pack_ranges(mixed)
    assert [r for t in tasks for r in t] == mixed, "every range once, in order"
    assert all(sum(r.size for r in t) <= MAX_OFFSETS_PER_TASK + 100 for t in tasks)
    assert len(tasks) == 3


def test_a_small_micro_batch_over_several_partitions_is_one_task_reading_every_range(tmp_path: Path) -> None:
    local = str(tmp_path / "log")
    txn_core.open_log(local).create_topic("t", 2, SCHEMA)
    for p in range(2):
        write(local, p, [10 * p, 10 * p + 1])
    reader = stream(local)
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    parts = list(reader.partitions(start, end))
    assert len(parts) == 1 and len(parts[0].ranges) == 2  # type: ignore[attr-defined]
    assert sorted(read_ids(reader, parts)) == [0, 1, 10, 11]


def test_on_a_store_whose_reads_are_round_trips_each_range_is_a_task_of_its_own(url: str) -> None:
    """A packed task reads its ranges one after another; separate tasks overlap their round trips."""
    for p in range(2):
        write(url, p, [10 * p, 10 * p + 1])
    reader = stream(url)
    start = reader.initialOffset()
    parts = list(reader.partitions(start, reader.latestOffset(start, ReadAllAvailable())))
    assert [len(p.ranges) for p in parts] == [1, 1]  # type: ignore[attr-defined]
    assert sorted(read_ids(reader, parts)) == [0, 1, 10, 11]
