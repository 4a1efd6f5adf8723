"""Topics written by other producers (pandas, pyarrow, the core API) meet Spark's types.

pandas writes ``timestamp[ns, tz=UTC]``; pyarrow may write any unit (s, ms, us, ns) and any zone label
(``Etc/UTC``, ``Europe/Paris``, ``+00:00``: the same UTC instants), or no zone (Spark's ``timestamp_ntz``).
Spark appends to such topics under any session time zone, converting exactly; a value Spark cannot hold
(nanoseconds) fails the read naming topic, partition, offset and column, unless ``timestampPrecision`` is
``truncate``.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd  # type: ignore[import-untyped]  # pyspark requires pandas; no stubs installed
import pyarrow as pa
import pytest

import txn_core

pytestmark = pytest.mark.spark

#: 2026-01-01 00:00:00.123456 UTC in microseconds; NANOS has a part Spark cannot hold.
MICROS = 1_767_225_600_123_456
NANOS = MICROS * 1000 + 789

#: A topic as other producers write it: one column per unit and zone label.
FOREIGN = pa.schema(
    [
        ("id", pa.int64()),
        ("ns_utc", pa.timestamp("ns", "UTC")),  # pandas
        ("us_etc", pa.timestamp("us", "Etc/UTC")),
        ("ms_paris", pa.timestamp("ms", "Europe/Paris")),
        ("s_offset", pa.timestamp("s", "+00:00")),
        ("ns_naive", pa.timestamp("ns")),  # tz-naive: Spark's timestamp_ntz
        ("nested", pa.struct([("at", pa.timestamp("ns", "UTC")), ("days", pa.list_(pa.date64()))])),
    ]
)

#: What Spark appends (fixed instants, whatever the session zone), and the integers each column must then hold.
APPEND = (
    f"SELECT 2L AS id, timestamp_micros({MICROS}) AS ns_utc, timestamp_micros({MICROS}) AS us_etc, "
    f"timestamp_millis({MICROS // 1000}) AS ms_paris, timestamp_seconds({MICROS // 10**6}) AS s_offset, "
    "make_timestamp_ntz(2026, 1, 1, 0, 0, 0.123456) AS ns_naive, "
    f"named_struct('at', timestamp_micros({MICROS}), 'days', array(DATE'2026-01-02')) AS nested"
)
WANT_TRUNCATED = [(0, MICROS, MICROS), (1, MICROS, MICROS)]  # (id, at, inner.at) in microseconds
STORED = {
    "ns_utc": MICROS * 1000,
    "us_etc": MICROS,
    "ms_paris": MICROS // 1000,
    "s_offset": MICROS // 10**6,
    "ns_naive": MICROS * 1000,
}


@pytest.fixture
def session_zone(spark: Any) -> Iterator[Any]:
    """Sets the session time zone inside a test; restores the one before."""
    before = spark.conf.get("spark.sql.session.timeZone")

    def use(zone: str) -> None:
        spark.conf.set("spark.sql.session.timeZone", zone)

    yield use
    spark.conf.set("spark.sql.session.timeZone", before)


def stored(url: str, topic: str) -> pa.Table:
    """Every committed row of ``topic``, as the core reads it, by id."""
    with txn_core.open_log(url) as log:
        consumer = log.consumer()
        consumer.assign([(topic, 0)])
        rows = consumer.poll()
    return rows.sort_by("id")


@pytest.mark.matrix(keep=1)
@pytest.mark.parametrize("zone", ["Etc/UTC", "UTC", "Europe/Paris"])
def test_spark_appends_to_topics_of_any_unit_and_zone_label_under_any_session_zone(
    spark: Any, session_zone: Any, tmp_path: Path, zone: str
) -> None:
    url = f"file://{tmp_path}/log"
    with txn_core.open_log(url) as log:
        log.create_topic("foreign", 1, FOREIGN)
        first = pd.DataFrame({"id": [1], "ns_utc": pd.to_datetime([MICROS * 1000], utc=True)})
        table = pa.Table.from_pandas(first, preserve_index=False)  # pandas' own schema: timestamp[ns, tz=UTC]
        assert table.schema.field("ns_utc").type == pa.timestamp("ns", "UTC")
        for name in ("us_etc", "ms_paris", "s_offset", "ns_naive"):
            table = table.append_column(name, pa.array([STORED[name]], pa.int64()).cast(FOREIGN.field(name).type))
        table = table.append_column("nested", pa.nulls(1, FOREIGN.field("nested").type))
        with log.producer() as producer:
            producer.send("foreign", table, partition=0)

    session_zone(zone)
    spark.sql(APPEND).write.format("txnlog").option("topic", "foreign").mode("append").save(url)

    rows = stored(url, "foreign")
    assert rows.column("id").to_pylist() == [1, 2]
    for name, value in STORED.items():  # the exact instants, in the topic's own units
        assert rows.column(name).cast(pa.int64()).to_pylist() == [value] * 2, name
    nested = rows.column("nested").to_pylist()[1]
    assert nested["at"].value == MICROS * 1000  # a pandas Timestamp: nanoseconds
    assert nested["days"] == [pd.Timestamp("2026-01-02").date()]

    back = spark.read.format("txnlog").option("topic", "foreign").load(url).orderBy("id")
    assert back.schema["ns_naive"].dataType.simpleString() == "timestamp_ntz"
    assert back.schema["nested"].dataType.simpleString() == "struct<at:timestamp,days:array<date>>"
    got = back.selectExpr("unix_micros(ns_utc)", "unix_micros(us_etc)", "unix_micros(nested.at)").collect()
    assert [tuple(r) for r in got] == [(MICROS, MICROS, None), (MICROS, MICROS, MICROS)]


def test_an_instant_into_a_wall_clock_topic_is_what_spark_s_cast_gives_and_the_reverse_is_refused(
    spark: Any, session_zone: Any, tmp_path: Path
) -> None:
    url = f"file://{tmp_path}/log"
    session_zone("Europe/Paris")
    spark.sql("SELECT 1L AS id, timestamp_ntz'2024-01-01 00:00:00' AS t").write.format("txnlog").option(
        "topic", "ntz"
    ).option("partitions", "1").mode("append").save(url)
    # an instant, 2024-01-01 00:00 in Paris: df.write and INSERT INTO a view (Spark's own cast) store the same
    spark.sql("SELECT 2L AS id, timestamp'2024-01-01 00:00:00' AS t").write.format("txnlog").option(
        "topic", "ntz"
    ).mode("append").save(url)
    spark.sql(
        "CREATE OR REPLACE TEMPORARY VIEW ntz_view USING txnlog "
        f"OPTIONS (path '{url}', topic 'ntz', includeMetadata 'false')"
    )
    spark.sql("INSERT INTO ntz_view SELECT 3L, timestamp'2024-01-01 00:00:00'")
    assert stored(url, "ntz").column("t").to_pylist() == [datetime.datetime(2024, 1, 1)] * 3

    spark.sql("SELECT 1L AS id, timestamp'2024-01-01 00:00:00' AS t").write.format("txnlog").option(
        "topic", "instant"
    ).option("partitions", "1").mode("append").save(url)
    wall_clock = spark.sql("SELECT 2L AS id, timestamp_ntz'2024-01-01 00:00:00' AS t")
    with pytest.raises(Exception, match="column 't' is timestamp_ntz") as refused:
        wall_clock.write.format("txnlog").option("topic", "instant").mode("append").save(url)
    assert "cast('timestamp')" in str(refused.value)
    assert stored(url, "instant").num_rows == 1, "nothing was written"


def test_a_value_a_topic_unit_cannot_hold_is_refused_naming_column_and_value(spark: Any, tmp_path: Path) -> None:
    url = f"file://{tmp_path}/log"
    with txn_core.open_log(url) as log:
        log.create_topic("ms", 1, pa.schema([("id", pa.int64()), ("at", pa.timestamp("ms", "UTC"))]))
    frame = spark.sql(f"SELECT 1L AS id, timestamp_micros({MICROS}) AS at")
    with pytest.raises(Exception, match="part below milliseconds") as info:
        frame.write.format("txnlog").option("topic", "ms").mode("append").save(url)
    assert "column 'at' in row 0: the value 2026-01-01 00:00:00.123456Z" in str(info.value)
    assert "truncate such values to milliseconds" in str(info.value)
    assert stored(url, "ms").num_rows == 0, "nothing was written"


@pytest.fixture
def nanos_url(tmp_path: Path) -> str:
    """A topic pandas wrote: offset 0 whole microseconds, offset 1 real nanoseconds (also nested)."""
    url = f"file://{tmp_path}/log"
    frame = pd.DataFrame({"id": [0, 1], "at": pd.to_datetime([MICROS * 1000, NANOS], utc=True)})
    table = pa.Table.from_pandas(frame, preserve_index=False)
    table = table.append_column("inner", pa.StructArray.from_arrays([table.column("at").combine_chunks()], ["at"]))
    with txn_core.open_log(url) as log:
        log.create_topic("nanos", 1, table.schema)
        with log.producer() as producer:
            producer.send("nanos", table, partition=0)
    return url


def test_nanoseconds_fail_the_read_naming_topic_partition_offset_column_and_the_option(
    spark: Any, nanos_url: str
) -> None:
    read = spark.read.format("txnlog").option("topic", "nanos").load(nanos_url)
    with pytest.raises(Exception, match="timestampPrecision") as info:
        read.collect()
    assert "topic 'nanos' partition 0 offset 1, column 'at': the value 2026-01-01 00:00:00.123456789Z" in str(
        info.value
    )
    assert "ArrowInvalid" not in str(info.value).split("SourceValueError")[-1]


def test_truncate_reads_nanoseconds_as_microseconds(spark: Any, nanos_url: str) -> None:
    read = spark.read.format("txnlog").option("topic", "nanos").option("timestampPrecision", "truncate")
    rows = read.load(nanos_url).selectExpr("id", "unix_micros(at)", "unix_micros(inner.at)").orderBy("id")
    assert [tuple(r) for r in rows.collect()] == WANT_TRUNCATED


@pytest.mark.slow
def test_sql_views_and_streams_refuse_or_truncate_nanoseconds(spark: Any, nanos_url: str, tmp_path: Path) -> None:
    # without the metadata columns the offset is still known
    spark.sql(
        f"CREATE OR REPLACE TEMPORARY VIEW nanos_inner USING txnlog OPTIONS (path '{nanos_url}', topic 'nanos', "
        "includeMetadata 'false')"
    )
    with pytest.raises(Exception, match="timestampPrecision") as info:
        spark.sql("SELECT inner FROM nanos_inner").collect()
    assert "topic 'nanos' partition 0 offset 1, column 'at'" in str(info.value)

    spark.sql(
        f"CREATE OR REPLACE TEMPORARY VIEW nanos_cut USING txnlog OPTIONS (path '{nanos_url}', topic 'nanos', "
        "timestampPrecision 'truncate')"
    )
    got = spark.sql("SELECT id, unix_micros(at), unix_micros(inner.at) FROM nanos_cut ORDER BY id").collect()
    assert [tuple(r) for r in got] == WANT_TRUNCATED

    def stream(precision: str, name: str) -> Any:
        source = (
            spark.readStream.format("txnlog")
            .option("topic", "nanos")
            .option("startingOffsets", "earliest")
            .option("timestampPrecision", precision)
            .load(nanos_url)
        )
        return (
            source.selectExpr("id", "unix_micros(at) AS at", "unix_micros(inner.at) AS inner_at")
            .writeStream.format("memory")
            .queryName(name)
            .option("checkpointLocation", str(tmp_path / name))
            .trigger(availableNow=True)
            .start()
        )

    refused = stream("exact", "nanos_exact")
    with pytest.raises(Exception, match="offset 1, column 'at'"):
        refused.awaitTermination()
    query = stream("truncate", "nanos_truncated")
    query.awaitTermination()
    assert [tuple(r) for r in spark.sql("SELECT * FROM nanos_truncated ORDER BY id").collect()] == WANT_TRUNCATED


@pytest.mark.parametrize(
    ("values", "source", "target", "found"),
    [
        # (values, their type, Spark's type, (row, path, reason) of the first value the conversion changes)
        ([0, NANOS], pa.timestamp("ns", "UTC"), pa.timestamp("us", "UTC"), (1, "", "has a part below microseconds")),
        (
            [{"at": 0}, None, {"at": 5}],
            pa.struct([("at", pa.timestamp("ns"))]),
            pa.struct([("at", pa.timestamp("us"))]),
            (2, ".at", "has a part below microseconds"),
        ),
        (
            [[1000], None, [2000, 3]],
            pa.list_(pa.duration("ns")),
            pa.list_(pa.duration("us")),
            (2, "[]", "has a part below microseconds"),
        ),
        (
            [[("k", 1000)], [("j", 7)]],
            pa.map_(pa.string(), pa.timestamp("ns")),
            pa.map_(pa.string(), pa.timestamp("us")),
            (1, ".value", "has a part below microseconds"),
        ),
        ([86_400_000, 86_400_001], pa.date64(), pa.date32(), (1, "", "has a part below days")),
        ([1, 2**62], pa.timestamp("s"), pa.timestamp("us"), (1, "", "is out of the range timestamp[us] can hold")),
        ([0, MICROS * 1000], pa.timestamp("ns", "UTC"), pa.timestamp("us", "UTC"), None),
    ],
)
def test_the_first_value_a_conversion_changes_is_found_at_any_depth(
    values: list[Any], source: pa.DataType, target: pa.DataType, found: tuple[int, str, str] | None
) -> None:
    from txn_core.format.temporal import first_inexact

    got = first_inexact(pa.array(values, source), target)
    assert (got and (got.row, got.path, got.reason[: len(found[2])] if found else "")) == found
