"""``spark.read.format("txnlog")``: the committed records between starting and ending offsets.

The plan is fixed when Spark plans the query: for each topic-partition, ``[starting, ending)`` where ending
defaults to the available end now (the last stable offset under read_committed; an ``endingOffsets`` beyond
it is cut back to it, since what lies past it is not decided yet). Pushed filters on the metadata columns
(:mod:`spark_txn_source.filters`) narrow the partitions and ranges before they are split into tasks by
offset ranges (:meth:`~spark_txn_source.planning.LogView.plan`).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, Filter, InputPartition
from pyspark.sql.types import StructType

from spark_txn_source.filters import Pushed
from spark_txn_source.options import SourceOptions
from spark_txn_source.planning import LogView
from spark_txn_source.reader import RangePartition, read_partition
from txn_core.errors import ConfigurationError
from txn_core.format.ids import TopicPartition
from txn_core.logs import get_logger
from txn_core.partition.timeindex import MAX_CLOCK_SKEW_MS, offset_for_timestamp

logger = get_logger(__name__)


class TxnLogBatchReader(DataSourceReader):
    """The batch reader (see module doc). Picklable: options, schema and pushed filters only.

    It does not define ``pushFilters``: PySpark refuses a reader that does when
    ``spark.sql.python.filterPushdown.enabled`` is false (the default). :class:`TxnLogFilteringBatchReader`
    adds it, and :func:`make` picks that one when Spark is running its pushdown step.
    """

    def __init__(self, opts: SourceOptions, schema: StructType) -> None:
        self.opts = opts
        self.schema = schema
        self.pushed = Pushed()

    def partitions(self) -> list[InputPartition]:
        view = LogView(self.opts)
        pushed = self.pushed
        tps = [tp for tp in view.topic_partitions() if pushed.keeps(tp)]
        starts = view.starting_positions()
        ends = self._ending(view, tps, starts)
        if self.opts.starting == "offsets":
            self._check_starts(view, tps, starts, ends)
        lo: dict[TopicPartition, int | None] = {}
        hi: dict[TopicPartition, int] = {}
        for tp in tps:
            s, e = view.checked_start(tp, starts[tp]), ends[tp]
            if pushed.min_offset is not None:
                s = max(s, pushed.min_offset)
            if pushed.max_offset is not None:
                e = min(e, pushed.max_offset + 1)
            if pushed.min_timestamp_ms is not None and s < e:
                s = max(s, offset_for_timestamp(view.plog(tp), pushed.min_timestamp_ms))
            if pushed.max_timestamp_ms is not None and s < e:
                # Entries from the first one stamped past max + skew on are all past max (timeindex doc).
                past = pushed.max_timestamp_ms + 1 + MAX_CLOCK_SKEW_MS
                e = min(e, offset_for_timestamp(view.plog(tp), past))
            lo[tp], hi[tp] = s, e
        ranges = view.plan(
            lo,
            hi,
            min_partitions=self.opts.min_partitions,
            min_timestamp_ms=pushed.min_timestamp_ms,
            max_timestamp_ms=pushed.max_timestamp_ms,
        )
        return [RangePartition(r) for r in ranges]

    def _ending(
        self, view: LogView, tps: list[TopicPartition], starts: dict[TopicPartition, int]
    ) -> dict[TopicPartition, int]:
        """Each partition's end: the available end, or ``endingOffsets`` cut back to it. An ending offset
        before its partition's start is refused, as Spark's Kafka source does (a typo, not an empty read)."""
        available = {tp: view.available_end(tp) for tp in tps}
        if self.opts.ending != "offsets":
            for tp in tps:
                view.check_damage(tp, None)
            return available
        every = view.topic_partitions(refresh=False)
        wanted = view.resolve_spec(self.opts.ending_offsets, "endingOffsets", every)
        inverted = [f"{tp}: {starts[tp]} > {wanted[tp]}" for tp in tps if starts[tp] > wanted[tp]]
        if inverted:
            raise ConfigurationError(
                "option 'endingOffsets' ends partitions before they start (startingOffsets > endingOffsets): "
                f"{', '.join(inverted)}. Give each partition an ending offset at or after its start"
            )
        out = {}
        for tp in tps:
            view.check_damage(tp, wanted[tp])
            out[tp] = min(wanted[tp], available[tp])
            if wanted[tp] > available[tp]:
                logger.warning(
                    "%s: endingOffsets %d is past the available end %d (an open transaction or "
                    "the log end); reading up to %d",
                    tp,
                    wanted[tp],
                    available[tp],
                    available[tp],
                )
        return out

    def _check_starts(
        self,
        view: LogView,
        tps: list[TopicPartition],
        starts: dict[TopicPartition, int],
        ends: dict[TopicPartition, int],
    ) -> None:
        """A ``startingOffsets`` offset past its partition's available end is refused, as Spark's Kafka source
        refuses a range that begins after it ends (a typo, not an empty read). The message tells an offset
        past the log end from one that an open transaction holds back (read_committed)."""
        past = []
        for tp in tps:
            if starts[tp] <= ends[tp]:
                continue
            log_end = view.plog(tp).readable_end()
            damage = view.state(tp).damage
            if damage is not None:
                held = f" (reads stop before the damaged entry at slot {damage.slot})"
            elif starts[tp] <= log_end:
                held = f" (the log end is {log_end}; an open transaction holds the rest back)"
            else:
                held = ""
            past.append(f"{tp}: {starts[tp]} > {ends[tp]}{held}")
        if past:
            raise ConfigurationError(
                "option 'startingOffsets' starts partitions past what can be read now (its offset > the available "
                f"end): {', '.join(past)}. Give each partition a start at or before its end"
            )

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(self.opts, self.schema, partition)

    def __getstate__(self) -> dict[str, Any]:
        return {"opts": self.opts, "schema": self.schema, "pushed": self.pushed}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)


class TxnLogFilteringBatchReader(TxnLogBatchReader):
    """The batch reader with filter pushdown on ``_partition``, ``_offset``, ``_timestamp`` and ``_topic``.

    Not used (see :data:`PUSHDOWN_NARROWS_PLANS`): its planning is tested on its own, ready for a Spark
    whose pushdown keeps the planned read with its scan."""

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:  # noqa: N802 - Spark API
        for f in filters:
            if not (self.opts.include_metadata and self.pushed.accept(f)):
                yield f


#: The PySpark worker module that plans a read with filter pushdown (it calls ``reader.pushFilters``).
_PUSHDOWN_WORKER = "data_source_pushdown_filters.py"


def pushdown_requested() -> bool:
    """Whether Spark is planning this read with filter pushdown enabled: it creates the reader from its
    pushdown worker module then, and from ``plan_data_source_read`` otherwise."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_filename.endswith(_PUSHDOWN_WORKER):
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


#: Whether pushed filters narrow the planned read. Not with PySpark 4.3: the read its pushdown step plans
#: (the reader with the filters, and its partitions) is kept on the data source object that every scan of a
#: DataFrame, view or table shares, and the scans after it reuse it. A filter on ``_partition = 0`` in one
#: scan then narrowed every other scan of the same relation, in the same query (``df.union(df.where(...))``)
#: and in later ones: rows missing, no error. Spark applies the filters itself instead (it is told none was
#: pushed), which is always right. Spark's development line keeps that read with its scan (PythonScanBuilder).
PUSHDOWN_NARROWS_PLANS = False


def make(opts: SourceOptions, schema: StructType) -> TxnLogBatchReader:
    narrow = PUSHDOWN_NARROWS_PLANS and pushdown_requested()
    cls = TxnLogFilteringBatchReader if narrow else TxnLogBatchReader
    return cls(opts, schema)
