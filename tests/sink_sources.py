"""A deterministic streaming source for sink tests: ``spark.readStream.format("sinktest_counter")``.

Rows ``id`` in ``[0, total)`` with ``key = "k<id % keys>"`` and ``value = "v<id>"``. The offset is
``{"n": next id}``; each micro-batch reads at most ``perBatch`` rows (its default read limit), so batch
``b`` holds ids ``[b * perBatch, (b + 1) * perBatch)`` on every run and every replay, which is what
exactly-once tests need: a replayed batch re-reads the same rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

SCHEMA = "id LONG, key STRING, value STRING"
ARROW_SCHEMA = pa.schema([("id", pa.int64()), ("key", pa.string()), ("value", pa.string())])


def rows(start: int, end: int, keys: int) -> pa.RecordBatch:
    ids = pa.array(range(start, end), pa.int64())
    return pa.RecordBatch.from_arrays(
        [ids, pa.array([f"k{i % keys}" for i in range(start, end)]), pa.array([f"v{i}" for i in range(start, end)])],
        schema=ARROW_SCHEMA,
    )


class CounterPartition(InputPartition):
    def __init__(self, start: int, end: int) -> None:
        super().__init__((start, end))
        self.start = start
        self.end = end


class CounterStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: dict[str, str]) -> None:
        self.total = int(options.get("total", "100"))
        self.per_batch = int(options.get("perbatch", "10"))
        self.partitions_n = int(options.get("partitions", "2"))
        self.keys = int(options.get("keys", "7"))
        self.target: int | None = None

    def initialOffset(self) -> dict[str, Any]:  # noqa: N802 - Spark API
        return {"n": 0}

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802 - Spark API
        return ReadMaxRows(self.per_batch)

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802 - Spark API
        self.target = self.total

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:  # noqa: N802
        end = self.total if self.target is None else self.target
        n = int(start["n"])
        if isinstance(limit, ReadAllAvailable):
            return {"n": end}
        if isinstance(limit, ReadMaxRows):
            return {"n": min(end, n + limit.max_rows)}
        return {"n": min(end, n + self.per_batch)}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        s, e = int(start["n"]), int(end["n"])
        if e <= s:
            return []
        step = max(1, -(-(e - s) // self.partitions_n))
        return [CounterPartition(a, min(e, a + step)) for a in range(s, e, step)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, CounterPartition)
        for a in range(partition.start, partition.end, 1000):
            yield rows(a, min(partition.end, a + 1000), self.keys)

    def commit(self, end: dict[str, Any]) -> None:
        pass


class CounterSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "sinktest_counter"

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema: Any) -> DataSourceStreamReader:  # noqa: N802 - Spark API
        return CounterStreamReader(dict(self.options))


def register(spark: Any) -> None:
    """Register the counter source (pickled by value: workers cannot import the tests directory)."""
    import sys

    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # type: ignore[no-untyped-call]
    spark.dataSource.register(CounterSource)
