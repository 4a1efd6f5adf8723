"""Every Spark type the sink accepts round-trips exactly, at any nesting, under any session time zone.

One frame holds every type at every depth (top level, in a struct, in an array, as a map value and as a map
key, in a struct inside an array, in an array of arrays, in a map inside a struct, in a struct inside a map),
with nulls at every depth, containers present holding only nulls, NaN and infinities. For each session time
zone it is written to a fresh topic in batch, copied to a second topic by a streaming query (``availableNow``),
and both are read back with ``spark.read`` and compared with the input row by row. Spark labels nested
timestamps with the session time zone (``Etc/UTC``, ``Asia/Kolkata``, ...); a topic the sink created itself
must still accept them. Types a topic cannot hold as themselves are refused while Spark plans the write.
"""

from __future__ import annotations

import datetime
import math
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

import txn_core

pytestmark = pytest.mark.spark

TIME_ZONES = ["UTC", "Etc/UTC", "America/New_York", "Asia/Kolkata"]
METADATA = ("_topic", "_partition", "_offset", "_timestamp")

# (column name, Spark SQL type, two sample values); every row also gets nulls, see rows()
LEAVES: list[tuple[str, str, list[Any]]] = [
    ("b", "boolean", [True, False]),
    ("i8", "tinyint", [-128, 127]),
    ("i16", "smallint", [-32768, 32767]),
    ("i32", "int", [-(2**31), 2**31 - 1]),
    ("i64", "bigint", [-(2**63), 2**63 - 1]),
    ("f32", "float", [float("nan"), float("-inf")]),
    ("f64", "double", [float("inf"), -0.5]),
    ("dec", "decimal(12,3)", [Decimal("-123456789.123"), Decimal("0.001")]),
    ("s", "string", ["", "grüße \u2603"]),
    ("bin", "binary", [b"", b"\x00\xff"]),
    ("d", "date", [datetime.date(1969, 12, 31), datetime.date(2024, 2, 29)]),
    ("ts", "timestamp", [datetime.datetime(1969, 12, 31, 23, 59, 59, 999999), datetime.datetime(2024, 3, 10, 2, 30)]),
    ("ntz", "timestamp_ntz", [datetime.datetime(1900, 1, 1), datetime.datetime(2024, 3, 10, 2, 30)]),
    ("dti", "interval day to second", [datetime.timedelta(days=-1, microseconds=1), datetime.timedelta(days=10**6)]),
    ("dec38", "decimal(38,18)", [Decimal("-99999999999999999999.999999999999999999"), Decimal("1E-18")]),
    ("void", "void", [None, None]),
]
#: Leaves that also serve as map keys (Spark allows no null keys, NaN keys do not compare, bytes keys are not
#: hashable in Python, so floats, binary and void are left out).
KEYS = ["b", "i8", "i16", "i32", "i64", "dec", "s", "d", "ts", "ntz", "dti", "dec38"]


def ddl() -> str:
    cols = ["id bigint"]
    for name, sql, _ in LEAVES:
        cols += [
            f"{name} {sql}",
            f"st_{name} struct<v: {sql}, n: int>",
            f"arr_{name} array<{sql}>",
            f"map_{name} map<string, {sql}>",
            f"sia_{name} array<struct<v: {sql}>>",
            f"aa_{name} array<array<{sql}>>",
            f"ms_{name} struct<m: map<string, {sql}>>",
            f"sm_{name} map<string, struct<v: {sql}>>",
        ]
        if name in KEYS:
            cols.append(f"mk_{name} map<{sql}, int>")
    return ", ".join(cols)


def rows() -> list[tuple[Any, ...]]:
    """Rows 0 and 1: a value at every depth; row 2: null at every depth; row 3: every container present,
    holding only nulls (a struct with a null field, an array of a null, a map to null)."""
    out = []
    key: dict[Any, int | None] | None  # a map keyed by the leaf's value (rows 0, 1 and 3), or null
    for r in range(4):
        row: list[Any] = [r]
        for name, _, values in LEAVES:
            if r < 2:
                v = values[r]
                row += [v, (v, r), [v, None], {"k": v, "null": None}, [(v,), None], [[v], None, []], ({"k": v},)]
                row += [{"k": (v,), "null": None}]
                key = {v: r} if v is not None else None
            elif r == 2:
                row += [None] * 8
                key = None
            else:
                row += [None, (None, None), [None], {"k": None}, [(None,)], [[None]], ({"k": None},), {"k": (None,)}]
                key = {values[0]: None}
            if name in KEYS:
                row.append(key)
        out.append(tuple(row))
    return out


def normalise(value: Any) -> Any:
    """A comparable form: NaN equals NaN, rows and dicts become plain containers."""
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if hasattr(value, "asDict"):
        return {k: normalise(v) for k, v in value.asDict().items()}
    if isinstance(value, dict):
        return {k: normalise(v) for k, v in sorted(value.items())}
    if isinstance(value, list | tuple):
        return [normalise(v) for v in value]
    if isinstance(value, bytearray):
        return bytes(value)
    return value


def collected(df: Any) -> list[Any]:
    return [normalise(r) for r in df.orderBy("id").collect()]


@pytest.fixture
def time_zone(spark: Any, request: pytest.FixtureRequest) -> Any:
    before = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", request.param)
    yield request.param
    spark.conf.set("spark.sql.session.timeZone", before)


@pytest.fixture(scope="module")
def matrix(spark: Any) -> tuple[Any, list[Any]]:
    """The frame of every type at every depth, and its rows as Spark collects them (Python datetimes are
    local times whatever the session time zone, so one frame serves every zone)."""
    frame = spark.createDataFrame(rows(), ddl())
    return frame, collected(frame)


@pytest.mark.matrix(keep=1)
@pytest.mark.parametrize("time_zone", TIME_ZONES, indirect=True)
def test_every_type_round_trips_at_every_depth_in_batch_and_stream(
    spark: Any, matrix: tuple[Any, list[Any]], tmp_path: Path, time_zone: str
) -> None:
    url = f"file://{tmp_path}/log"
    frame, expected = matrix

    frame.write.format("txnlog").option("topic", "batch").option("partitions", "2").mode("append").save(url)

    # a streaming copy (parquet, the usual file source, holds neither intervals nor void columns)
    stream = spark.readStream.format("txnlog").option("topic", "batch").option("startingOffsets", "earliest").load(url)
    query = (
        stream.writeStream.format("txnlog")
        .option("topic", "stream")
        .option("partitions", "2")
        .option("checkpointLocation", str(tmp_path / "chk"))
        .trigger(availableNow=True)
        .start(url)
    )
    query.awaitTermination()

    back = spark.read.format("txnlog").option("topic", "batch,stream").load(url)  # both topics in one job
    assert back.drop(*METADATA).schema.simpleString() == frame.schema.simpleString()
    got: dict[str, list[Any]] = {"batch": [], "stream": []}
    for row in collected(back):
        got[row.pop("_topic")].append({k: v for k, v in row.items() if k not in METADATA})
    for topic, values in got.items():
        assert values == expected, f"{topic} under session time zone {time_zone}"


def test_narrow_intervals_char_varchar_time_and_wide_decimals_round_trip(spark: Any, tmp_path: Path) -> None:
    """Types a frame may carry that the matrix does not: a day-time interval of fewer fields comes back as
    ``interval day to second`` with the same value (Arrow's duration keeps no field range); CHAR and VARCHAR
    casts are strings in a frame; TIME (behind ``spark.sql.timeType.enabled`` in 4.3) round-trips."""
    url = f"file://{tmp_path}/log"
    spark.conf.set("spark.sql.timeType.enabled", "true")
    try:
        frame = spark.sql(
            "SELECT 1 AS id, INTERVAL '5' HOUR AS hours, INTERVAL '-90.5' SECOND AS seconds, "
            "map(1, INTERVAL '3' DAY) AS days_by_int, CAST('ab' AS CHAR(5)) AS c, CAST('ab' AS VARCHAR(5)) AS vc, "
            "CAST('12:34:56.123456' AS TIME) AS t, array(CAST('01:02:03' AS TIME)) AS ts, "
            "CAST('12345678901234567890123456789012345678' AS DECIMAL(38,0)) AS big"
        )
        frame.write.format("txnlog").option("topic", "odd").option("partitions", "1").mode("append").save(url)
        back = spark.read.format("txnlog").option("topic", "odd").option("includeMetadata", "false").load(url)
        assert back.schema.simpleString() == (
            "struct<id:int,hours:interval day to second,seconds:interval day to second,"
            "days_by_int:map<int,interval day to second>,c:string,vc:string,t:time(6),ts:array<time(6)>,"
            "big:decimal(38,0)>"
        )
        assert collected(back) == collected(frame)
    finally:
        spark.conf.unset("spark.sql.timeType.enabled")


def test_types_a_topic_cannot_hold_are_refused_while_spark_plans(spark: Any, tmp_path: Path) -> None:
    url = f"file://{tmp_path}/log"
    frame = spark.sql(
        "SELECT 1 AS id, parse_json('{\"a\": 1}') AS doc, "
        "named_struct('shape', st_geomfromwkb(X'0101000000000000000000F03F0000000000000040')) AS place, "
        "array(INTERVAL '1-2' YEAR TO MONTH) AS terms"
    )
    with pytest.raises(Exception, match="cannot store as they are") as info:
        frame.write.format("txnlog").option("topic", "odd").option("partitions", "1").mode("append").save(url)
    message = str(info.value)
    assert "doc (variant): write to_json(col)" in message
    assert "place.shape (geometry(0)): write st_asbinary(col)" in message
    assert "terms[] (interval year to month): write the number of months" in message
    with txn_core.open_log(url) as log:
        assert "odd" not in log.list_topics(), "nothing was written"


@pytest.mark.matrix(keep=1)
@pytest.mark.parametrize("time_zone", TIME_ZONES, indirect=True)
def test_windowed_aggregation_with_watermark_writes_with_default_settings(
    spark: Any, tmp_path: Path, time_zone: str
) -> None:
    from pyspark.sql import functions as sf

    url = f"file://{tmp_path}/log"
    base = datetime.datetime(2024, 1, 1, 12, 0)
    events = [(base + datetime.timedelta(seconds=20 * i), f"k{i % 2}") for i in range(12)]
    events.append((base + datetime.timedelta(minutes=30), "k0"))  # moves the watermark past every window
    spark.createDataFrame(events, "ts timestamp, k string").write.parquet(str(tmp_path / "in"))

    counts = (
        spark.readStream.schema("ts timestamp, k string")
        .parquet(str(tmp_path / "in"))
        .withWatermark("ts", "1 minute")
        .groupBy(sf.window("ts", "1 minute"), "k")
        .count()
    )
    query = (
        counts.writeStream.format("txnlog")
        .option("topic", "counts")
        .option("partitions", "1")
        .option("checkpointLocation", str(tmp_path / "chk"))
        .trigger(availableNow=True)
        .start(url)
    )
    query.awaitTermination()
    # availableNow ends after the data; a second run emits the windows the first one's watermark closed
    query = (
        counts.writeStream.format("txnlog")
        .option("topic", "counts")
        .option("checkpointLocation", str(tmp_path / "chk"))
        .trigger(availableNow=True)
        .start(url)
    )
    query.awaitTermination()

    back = spark.read.format("txnlog").option("topic", "counts").load(url)
    got = sorted((r["window"]["start"], r["k"], r["count"]) for r in back.collect())
    closed = Counter((ts.replace(second=0), k) for ts, k in events[:-1])  # the last event's window stays open
    want = sorted((start, k, n) for (start, k), n in closed.items())
    assert got == want
    assert back.schema["window"].dataType.simpleString() == "struct<start:timestamp,end:timestamp>"
