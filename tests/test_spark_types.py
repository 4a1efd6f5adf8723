"""Every Spark type the sink accepts round-trips exactly, at any nesting, under any session time zone.

One frame holds every type at every depth (top level, in a struct, in an array, as a map value, in a struct
inside an array), with nulls, NaN and infinities. For each session time zone it is written to a fresh topic
in batch and in streaming (from parquet files, ``availableNow``), read back with ``spark.read`` and compared
with the input row by row. Spark labels nested timestamps with the session time zone (``Etc/UTC``,
``Asia/Kolkata``, ...); a topic the sink created itself must still accept them.
"""

from __future__ import annotations

import datetime
import math
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.spark

TIME_ZONES = ["UTC", "Etc/UTC", "America/New_York", "Asia/Kolkata"]

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
]


def ddl() -> str:
    cols = ["id bigint"]
    for name, sql, _ in LEAVES:
        cols += [
            f"{name} {sql}",
            f"st_{name} struct<v: {sql}, n: int>",
            f"arr_{name} array<{sql}>",
            f"map_{name} map<string, {sql}>",
            f"sia_{name} array<struct<v: {sql}>>",
        ]
    return ", ".join(cols)


def rows() -> list[tuple[Any, ...]]:
    out = []
    for r in range(3):
        row: list[Any] = [r]
        for _, _, values in LEAVES:
            v = values[r] if r < 2 else None  # row 2: nulls at every depth
            row += [
                v,
                (v, r) if r < 2 else None,
                [v, None] if r < 2 else None,
                {"k": v, "null": None} if r < 2 else None,
                [(v,), None] if r < 2 else None,
            ]
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


@pytest.mark.parametrize("time_zone", TIME_ZONES, indirect=True)
def test_every_type_round_trips_at_every_depth_in_batch_and_stream(spark: Any, tmp_path: Path, time_zone: str) -> None:
    url = f"file://{tmp_path}/log"
    frame = spark.createDataFrame(rows(), ddl())
    expected = collected(frame)

    frame.write.format("txnlog").option("topic", "batch").option("partitions", "2").mode("append").save(url)

    frame.write.parquet(str(tmp_path / "in"))
    stream = spark.readStream.schema(frame.schema).parquet(str(tmp_path / "in"))
    query = (
        stream.writeStream.format("txnlog")
        .option("topic", "stream")
        .option("partitions", "2")
        .option("checkpointLocation", str(tmp_path / "chk"))
        .trigger(availableNow=True)
        .start(url)
    )
    query.awaitTermination()

    for topic in ("batch", "stream"):
        back = spark.read.format("txnlog").option("topic", topic).load(url)
        back = back.drop("_topic", "_partition", "_offset", "_timestamp")
        assert back.schema.simpleString() == frame.schema.simpleString(), topic
        assert collected(back) == expected, f"{topic} under session time zone {time_zone}"


@pytest.mark.parametrize("time_zone", ["Etc/UTC", "America/New_York"], indirect=True)
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
