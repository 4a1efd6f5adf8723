"""Filter pushdown for batch reads: filters on the metadata columns prune what is read.

Accepted (and then applied exactly, so Spark does not evaluate them again): ``=``, ``<``, ``<=``, ``>``,
``>=`` on ``_partition``, ``_offset`` and ``_timestamp``; ``IN`` on ``_partition`` and ``_topic``; ``=`` on
``_topic``; ``IS NOT NULL`` on any metadata column (never null). Filters combine with AND.

* ``_topic`` / ``_partition`` filters drop whole topic-partitions from the plan.
* ``_offset`` bounds narrow each partition's offset range (exact, records are sliced).
* ``_timestamp`` bounds narrow each range with :func:`txn_core.partition.timeindex.offset_for_timestamp` and drop whole
  entries by their append timestamp while reading (every record of an entry has the entry's timestamp,
  so this is exact).

Everything else (``IN`` on ``_offset``, ``NOT``, filters on topic columns) is left to Spark.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field

from pyspark.sql.datasource import (
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNotNull,
    LessThan,
    LessThanOrEqual,
)

from txn_core.format.ids import TopicPartition, is_int

METADATA_COLUMNS = ("_topic", "_partition", "_offset", "_timestamp")
_BOUNDS = (EqualTo, GreaterThan, GreaterThanOrEqual, LessThan, LessThanOrEqual)


@dataclass
class Pushed:
    """The AND of the accepted filters. Bounds are inclusive; None means unbounded."""

    topics: frozenset[str] | None = None
    partitions: frozenset[int] | None = None
    min_partition: int | None = None
    max_partition: int | None = None
    min_offset: int | None = None
    max_offset: int | None = None
    min_timestamp_ms: int | None = None
    max_timestamp_ms: int | None = None
    accepted: list[str] = field(default_factory=list)

    def accept(self, f: Filter) -> bool:
        """Record ``f`` if it can be applied exactly; False leaves it to Spark."""
        attr: tuple[str, ...] = tuple(getattr(f, "attribute", ()))
        if len(attr) != 1 or attr[0] not in METADATA_COLUMNS:
            return False
        column = attr[0]
        ok = isinstance(f, IsNotNull) or (
            self._topic(f)
            if column == "_topic"
            else self._partition(f)
            if column == "_partition"
            else self._offset(f)
            if column == "_offset"
            else self._timestamp(f)
        )
        if ok:
            self.accepted.append(repr(f))
        return ok

    def _topic(self, f: Filter) -> bool:
        if isinstance(f, EqualTo) and isinstance(f.value, str):
            values = {f.value}
        elif isinstance(f, In) and all(isinstance(v, str) for v in f.value):
            values = set(f.value)
        else:
            return False
        self.topics = frozenset(values if self.topics is None else self.topics & values)
        return True

    def _partition(self, f: Filter) -> bool:
        if isinstance(f, In) and all(is_int(v) for v in f.value):
            values = frozenset(int(v) for v in f.value)
            self.partitions = values if self.partitions is None else self.partitions & values
            return True
        if isinstance(f, _BOUNDS) and is_int(f.value):
            lo, hi = _int_bounds(f, int(f.value))
            self.min_partition = _max(self.min_partition, lo)
            self.max_partition = _min(self.max_partition, hi)
            return True
        return False

    def _offset(self, f: Filter) -> bool:
        if not isinstance(f, _BOUNDS) or not is_int(f.value):
            return False
        lo, hi = _int_bounds(f, int(f.value))
        self.min_offset = _max(self.min_offset, lo)
        self.max_offset = _min(self.max_offset, hi)
        return True

    def _timestamp(self, f: Filter) -> bool:
        value = getattr(f, "value", None)
        if not isinstance(f, _BOUNDS) or not isinstance(value, datetime.datetime) or value.tzinfo is None:
            return False
        delta = value - datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
        micros = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
        # An entry's timestamp t (ms) is t * 1000 us; turn the bound on microseconds into one on t.
        floor_ms, ceil_ms = micros // 1000, -(-micros // 1000)
        if isinstance(f, EqualTo):
            lo, hi = (ceil_ms, floor_ms)
        elif isinstance(f, GreaterThan):
            lo, hi = floor_ms + 1, None
        elif isinstance(f, GreaterThanOrEqual):
            lo, hi = ceil_ms, None
        elif isinstance(f, LessThan):
            lo, hi = None, ceil_ms - 1
        else:
            lo, hi = None, floor_ms
        self.min_timestamp_ms = _max(self.min_timestamp_ms, lo)
        self.max_timestamp_ms = _min(self.max_timestamp_ms, hi)
        return True

    def keeps(self, tp: TopicPartition) -> bool:
        """Whether the filters can match records of ``tp``."""
        if self.topics is not None and tp.topic not in self.topics:
            return False
        p = tp.partition
        return (
            (self.partitions is None or p in self.partitions)
            and (self.min_partition is None or p >= self.min_partition)
            and (self.max_partition is None or p <= self.max_partition)
        )


def _int_bounds(f: Filter, v: int) -> tuple[int | None, int | None]:
    if isinstance(f, EqualTo):
        return v, v
    if isinstance(f, GreaterThan):
        return v + 1, None
    if isinstance(f, GreaterThanOrEqual):
        return v, None
    if isinstance(f, LessThan):
        return None, v - 1
    return None, v


def _max(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


def _min(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)
