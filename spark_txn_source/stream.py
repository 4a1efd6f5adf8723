"""``spark.readStream.format("txnlog")``: micro-batches of committed records.

Offsets are per topic-partition record offsets (:mod:`spark_txn_source.offsets`). For each trigger,
:meth:`TxnLogStreamReader.latestOffset` asks ``txn_core`` for each partition's available end, the last
stable offset under read_committed, so a micro-batch ``[start, end)`` never reaches into a transaction that
is still open; :meth:`partitions` plans the ranges with the aborted transactions and skip ranges executors
drop (:mod:`txn_core.partition.ranges`). Because the bound only moves forward and decisions are durable, a batch
replayed after a restart, planned by a new driver, reads exactly the same records.

Admission control: ``maxOffsetsPerTrigger`` becomes the default ``ReadMaxRows`` limit, split fairly over
partitions (:func:`~spark_txn_source.planning.fair_split`); Spark's own ``ReadAllAvailable``,
``ReadMaxRows`` and ``ReadMinRows`` are honoured. ``Trigger.AvailableNow`` fixes each partition's target end
in :meth:`prepareForTriggerAvailableNow` and then runs rate-limited batches up to it.
:meth:`reportLatestOffset` reports the uncapped available end, so progress shows the backlog.

Partitions added to a topic while the query runs join from their beginning. A start offset removed by
retention fails the query unless ``failOnDataLoss=false``; so does a damaged entry nobody marked lost, once
every record before it was read (PROTOCOL.md "Damage").

Driver-side state (the :class:`LogView`) lives only in the long-lived driver process; executors get a
fresh reader with the options and schema only (see ``__getstate__``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from spark_txn_source import offsets
from spark_txn_source.options import SourceOptions
from spark_txn_source.planning import LogView, fair_split, pack_ranges
from spark_txn_source.reader import RangePartition, read_partition
from txn_core.errors import ConfigurationError
from txn_core.format.ids import TopicPartition
from txn_core.storage.parallel import parallel_map


class TxnLogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The streaming reader (see module doc)."""

    def __init__(self, opts: SourceOptions, schema: StructType) -> None:
        self.opts = opts
        self.schema = schema
        self._view: LogView | None = None
        self._initial: dict[str, Any] | None = None
        self._target: dict[TopicPartition, int] | None = None
        self._latest: dict[TopicPartition, int] | None = None
        self._start_recorded = False

    def __getstate__(self) -> dict[str, Any]:
        return {"opts": self.opts, "schema": self.schema}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["opts"], state["schema"])  # type: ignore[misc]

    def view(self) -> LogView:
        if self._view is None:
            self._view = LogView(self.opts)
        return self._view

    # --- offsets --------------------------------------------------------------------------------

    def initialOffset(self) -> dict[str, Any]:  # noqa: N802 - Spark API
        if self._initial is None:  # computed once: Spark may ask more than once
            view = self.view()
            self._initial = offsets.encode(view.url, view.starting_positions())
        return self._initial

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802 - Spark API
        n = self.opts.max_offsets_per_trigger
        return ReadMaxRows(n) if n is not None else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802 - Spark API
        view = self.view()
        tps = view.topic_partitions()
        self._target = dict(zip(tps, parallel_map(view.available_end, tps), strict=True))

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:  # noqa: N802 - Spark API
        view = self.view()
        begin = offsets.decode(start, view.url)
        starts, ends = view.bounds(begin)  # every partition's requests at once
        latest = {tp: max(s, ends[tp]) for tp, s in starts.items()}
        self._latest = latest
        cap = latest
        if self._target is not None:  # AvailableNow: nothing beyond the end fixed at start
            cap = {tp: max(s, min(latest[tp], self._target.get(tp, s))) for tp, s in starts.items()}
        available = {tp: cap[tp] - s for tp, s in starts.items()}
        if isinstance(limit, ReadAllAvailable):
            take = available
        elif isinstance(limit, ReadMaxRows):
            take = fair_split(available, limit.max_rows)
        elif isinstance(limit, ReadMinRows):
            if sum(available.values()) < limit.min_rows:
                return start
            take = available
        else:
            raise ConfigurationError(
                f"the txnlog source cannot honour Spark's read limit {limit!r}; it supports "
                "ReadAllAvailable, ReadMaxRows (maxOffsetsPerTrigger) and ReadMinRows"
            )
        end = offsets.encode(view.url, {tp: s + take[tp] for tp, s in starts.items()})
        if view.group_start is not None and not self._start_recorded and start == self._initial:
            self._start_recorded = True  # the query's first batch: record where the group was
            end[offsets.START] = offsets.encode(view.url, view.group_start)["topics"]
        elif end["topics"] == start.get("topics"):
            return start  # no new data: Spark's own start (it may carry the first batch's "start")
        return end

    def reportLatestOffset(self) -> dict[str, Any] | None:  # noqa: N802 - Spark API
        if self._latest is None:
            return None
        return offsets.encode(self.view().url, self._latest)

    # --- planning and reading -------------------------------------------------------------------

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        view = self.view()
        begin = offsets.decode(start, view.url)
        finish = offsets.decode(end, view.url)
        ranges = view.plan({tp: begin.get(tp) for tp in finish}, finish, min_partitions=self.opts.min_partitions)
        if view.log.storage.overlap_reads:
            # A store whose reads are round trips: a task per range, so that the ranges' reads overlap
            # across tasks (a packed task reads its ranges one after another, a round trip or more each).
            return [RangePartition(r) for r in ranges]
        return [RangePartition(*task) for task in pack_ranges(ranges, min_tasks=self.opts.min_partitions)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(self.opts, self.schema, partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to release: offsets are tracked by Spark's checkpoint, not by the log."""
