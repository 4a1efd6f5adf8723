"""Driver-side planning: where reads start and end, and which offset ranges become Spark tasks.

:class:`LogView` is the driver's long-lived view of the topics a query reads. It keeps one
:class:`~txn_core.partition.state.PartitionState` per topic-partition (so each micro-batch scans only new entry
headers) and answers three questions, all through ``txn_core``:

* where a read starts (``startingOffsets`` / ``startingTimestamp`` / group offsets) and where data ends now
  (:func:`txn_core.partition.ranges.available_end`: the last stable offset under read_committed);
* what to do with a start below the log start (retention): fail with a clear message, or skip ahead
  (``failOnDataLoss``); partitions that appear later start at their beginning;
* what to do with a damaged entry nobody marked lost (PROTOCOL.md "Damage"): with ``failOnDataLoss=true`` the
  available end stops before it, and a read that needs more fails naming the object and the option (a
  stream once it has read everything before it, a batch read at once, since it would end short); with
  ``false`` planning and tasks skip it with a warning;
* the :class:`~txn_core.partition.ranges.OffsetRange` tasks of ``[start, end)``, with the filters executors apply.

Nothing here is pickled to executors; only the ``OffsetRange`` values are.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from spark_txn_source.offsets import Positions
from spark_txn_source.options import (
    EARLIEST,
    GROUP,
    JSON_EARLIEST,
    JSON_LATEST,
    LATEST,
    OffsetSpec,
    SourceOptions,
)
from txn_core.clients.topics import TopicMeta
from txn_core.errors import ConfigurationError, CorruptDataError, DataLossError
from txn_core.format import paths
from txn_core.format.ids import TopicPartition
from txn_core.log import Log
from txn_core.logs import get_logger
from txn_core.partition.partition import PartitionLog
from txn_core.partition.ranges import OffsetRange, available_end, plan_range, split_range
from txn_core.partition.state import PartitionState
from txn_core.partition.timeindex import offset_for_timestamp
from txn_core.storage import open_storage
from txn_core.storage.parallel import parallel_map, submit

logger = get_logger(__name__)

#: A task reads at most this many offsets; longer ranges are split (parallelism, bounded task time).
MAX_OFFSETS_PER_TASK = 1_000_000
#: Ranges shorter than this are packed with their neighbours into one task (:func:`pack_ranges`): a task's
#: launch, its two Python workers and its staged object cost the same for ten rows as for a million.
MIN_OFFSETS_PER_TASK = 1 << 17


class SourceDataLossError(DataLossError):
    """Offsets a query still had to read were removed by retention (``failOnDataLoss=true``)."""


class SourceCorruptDataError(CorruptDataError):
    """A damaged entry, not marked lost, that a query had to read (``failOnDataLoss=true``)."""


def damage_hint(exc: CorruptDataError) -> SourceCorruptDataError:
    """The error a query fails with at a damaged entry: what is damaged, how an operator marks it lost,
    and the option that makes this query skip such entries."""
    return SourceCorruptDataError(
        f"{exc} To have this query skip damaged entries nobody marked lost (with a warning in the log), set "
        "option failOnDataLoss=false.",
        exc.key,
        exc.check,
    )


def open_existing_log(url: str, storage_options: Mapping[str, object]) -> Log:
    """The log at ``url``; a URL with no txnlog is an error (a reader never creates a log)."""
    storage = open_storage(url, dict(storage_options) or None)
    # Reading writes nothing: read-only access is enough. On an object store the format object's read
    # overlaps what the log is opened for, and its error ("no txnlog at ...") comes at the first use.
    return Log(storage, create=False)


def data_loss_hint(message: str) -> str:
    return (
        f"{message}. The query lost data it had not read. To skip the lost offsets and go on, set "
        "option failOnDataLoss=false; otherwise restart from a new checkpoint or with other starting "
        "offsets."
    )


class LogView:
    """The driver's view of the topics of one read (see module doc). Not thread-safe."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self.log = open_existing_log(opts.path, opts.storage_options)
        self.url = self.log.url
        self.metas: dict[str, TopicMeta] = self.log.topic_metas(opts.topics)  # beside the format check
        self._states: dict[TopicPartition, PartitionState] = {}
        #: startingOffsets=group: the group's committed offset each partition started from (-1: none), as
        #: recorded in the first batch's end offset for the sink's offsets fence (offsets.py)
        self.group_start: dict[TopicPartition, int] | None = None

    # --- topology -------------------------------------------------------------------------------

    def topic_partitions(self, refresh: bool = True) -> list[TopicPartition]:
        """Every partition of the topics read; with ``refresh``, partitions added since are included."""
        if refresh:
            self.metas = {t: self.log.topics.get(t) for t in self.opts.topics}
        return [TopicPartition(t, p) for t, m in self.metas.items() for p in range(m.partitions)]

    def state(self, tp: TopicPartition) -> PartitionState:
        state = self._states.get(tp)
        if state is None:
            state = self.log.partition_state(paths.partition_log_path(tp.topic, tp.partition), shared=False)
            state.skip_damaged = not self.opts.fail_on_data_loss
            state.open_listings()  # log start, segments, snapshots and loose entries in one round
            self._states[tp] = state
        return state

    def plog(self, tp: TopicPartition) -> PartitionLog:
        return self.state(tp).log

    def log_start(self, tp: TopicPartition) -> int:
        return self.plog(tp).recent_log_start().offset

    def available_end(self, tp: TopicPartition) -> int:
        """The last stable offset (read_committed) or the log end (read_uncommitted) of ``tp`` now."""
        return available_end(self.state(tp), self.opts.isolation)

    def bounds(
        self, begin: Mapping[TopicPartition, int | None]
    ) -> tuple[dict[TopicPartition, int], dict[TopicPartition, int]]:
        """``(checked start, available end)`` of every partition read (``begin`` as for
        :meth:`checked_start`). The partitions' requests overlap (:mod:`txn_core.storage.parallel`), and the topic
        metadata refresh overlaps them; partitions it discovers are looked at right after."""
        known = self.topic_partitions(refresh=False)
        refreshed = submit(self.topic_partitions)

        def one(tp: TopicPartition) -> tuple[TopicPartition, int, int]:
            start = self.checked_start(tp, begin.get(tp))
            end = self.available_end(tp)
            if end <= start:
                self.check_damage(tp, start + 1)  # a stream that read everything before a damaged entry
            return tp, start, end

        rows = parallel_map(one, known)
        seen = set(known)
        rows += parallel_map(one, [tp for tp in refreshed.result() if tp not in seen])
        return {tp: s for tp, s, _ in rows}, {tp: e for tp, _, e in rows}

    def check_damage(self, tp: TopicPartition, needed: int | None) -> None:
        """With ``failOnDataLoss=true``, fail when a damaged entry nobody marked lost ends ``tp``'s
        offsets short of ``needed`` (None: the log end, what a batch read wants): the read would otherwise
        end there without a word."""
        state = self.state(tp)
        damage = state.damage
        if damage is not None and self.opts.fail_on_data_loss and (needed is None or needed > state.buffer.position):
            raise damage_hint(damage) from damage

    # --- where reads start ----------------------------------------------------------------------

    def starting_positions(self) -> Positions:
        """Start offsets per partition for the options' ``startingOffsets`` / ``startingTimestamp``."""
        tps = self.topic_partitions()
        opts = self.opts
        if opts.starting == EARLIEST:
            return {tp: self.log_start(tp) for tp in tps}
        if opts.starting == LATEST:
            return {tp: self.available_end(tp) for tp in tps}
        if opts.starting == GROUP:
            # Stable offsets only: an open transaction of the group's sink may be about to commit more.
            committed = self.log.groups.committed(opts.consumer_group or "", require_stable=True)
            self.group_start = {tp: committed[tp].offset if tp in committed else -1 for tp in tps}
            return {tp: committed[tp].offset if tp in committed else self.log_start(tp) for tp in tps}
        if opts.starting == "timestamp":
            ts = opts.starting_timestamp or 0
            return {tp: offset_for_timestamp(self.plog(tp), ts) for tp in tps}
        return self.resolve_spec(opts.starting_offsets, "startingOffsets", tps)

    def resolve_spec(self, spec: OffsetSpec, name: str, tps: list[TopicPartition]) -> Positions:
        """JSON offsets for exactly the partitions read; -2 is the log start, -1 the available end."""
        wanted = {tp for tp in tps if tp.topic in spec}
        given = {TopicPartition(t, p) for t, parts in spec.items() for p in parts}
        missing = sorted(str(tp) for tp in {tp for tp in tps if tp.topic in spec} - given)
        extra = sorted(str(tp) for tp in given - wanted)
        absent = [t for t in self.opts.topics if t not in spec]
        if missing or extra or absent:
            counts = ", ".join(f"{t}: {m.partitions}" for t, m in self.metas.items())
            raise ConfigurationError(
                f"option '{name}' must give an offset for every partition of every topic read (-2 earliest, "
                f"-1 latest). Missing: {missing + [f'{t} (whole topic)' for t in absent] or 'none'}; not "
                f"existing: {extra or 'none'}. Partitions per topic: {counts}"
            )
        out: Positions = {}
        for tp in sorted(wanted):
            off = spec[tp.topic][tp.partition]
            if off == JSON_EARLIEST:
                off = self.log_start(tp)
            elif off == JSON_LATEST:
                off = self.available_end(tp)
            out[tp] = off
        return out

    def checked_start(self, tp: TopicPartition, start: int | None) -> int:
        """``start`` (None: a partition new to the query, read from its beginning), moved to the log start
        if retention removed it and ``failOnDataLoss=false``; :class:`SourceDataLossError` otherwise."""
        if start is None:
            return self.log_start(tp)
        first = self.plog(tp).log_start_for(start).offset
        if start < first:
            message = (
                f"{tp}: offsets [{start}, {first}) were removed by retention before the query read "
                f"them; the partition now starts at offset {first}"
            )
            if self.opts.fail_on_data_loss:
                raise SourceDataLossError(data_loss_hint(message))
            logger.warning("%s; skipping them (failOnDataLoss=false)", message)
            return first
        return start

    # --- tasks ----------------------------------------------------------------------------------

    def plan(
        self,
        start: Mapping[TopicPartition, int | None],
        end: Mapping[TopicPartition, int],
        *,
        min_partitions: int | None = None,
        min_timestamp_ms: int | None = None,
        max_timestamp_ms: int | None = None,
    ) -> list[OffsetRange]:
        """The tasks reading ``[start[tp], end[tp])`` of every partition in ``end``."""

        def one(tp: TopicPartition) -> tuple[PartitionLog, OffsetRange] | None:
            lo = self.checked_start(tp, start.get(tp))
            hi = end[tp]
            if hi <= lo:
                return None
            state = self.state(tp)

            def plan(start: int) -> OffsetRange:
                return plan_range(
                    state,
                    tp.topic,
                    tp.partition,
                    start,
                    hi,
                    self.opts.isolation,
                    min_timestamp_ms=min_timestamp_ms,
                    max_timestamp_ms=max_timestamp_ms,
                )

            try:
                rng = plan(lo)
            except DataLossError as exc:  # retention ran between the check and the plan
                if self.opts.fail_on_data_loss:
                    raise SourceDataLossError(data_loss_hint(str(exc))) from exc
                lo = self.checked_start(tp, lo)
                if hi <= lo:
                    return None
                rng = plan(lo)
            return state.log, rng

        # one partition's requests never wait for another's (txn_core.storage.parallel); results in partition order
        ranges = [r for r in parallel_map(one, sorted(end)) if r is not None]
        total = sum(r.size for _, r in ranges)
        out: list[OffsetRange] = []
        for plog, rng in ranges:
            pieces = math.ceil(rng.size / MAX_OFFSETS_PER_TASK)
            if min_partitions and total:
                pieces = max(pieces, math.ceil(min_partitions * rng.size / total))
            out.extend(split_range(plog, rng, pieces, max_size=MAX_OFFSETS_PER_TASK))
        logger.info("planned %d offsets of %d partitions as %d tasks", total, len(ranges), len(out))
        return out


def pack_ranges(
    ranges: list[OffsetRange], min_offsets: int = MIN_OFFSETS_PER_TASK, min_tasks: int | None = None
) -> list[tuple[OffsetRange, ...]]:
    """The tasks of ``ranges``: consecutive ranges packed together until a task holds ``min_offsets``.

    Invariants: every range is in exactly one task, in the given order; a range is never split (each is
    read on its own, as planned); a task never holds more than ``max(MAX_OFFSETS_PER_TASK, its largest
    range)`` offsets; with ``min_tasks`` (``minPartitions``) no packing brings the count below it. A small
    micro-batch over many partitions thus runs as one task, as Spark's file sources pack small files.
    Used on local disk only: a packed task reads its ranges one after another, which on an object store
    costs the round trips that separate tasks overlap.
    """
    if min_tasks is not None and len(ranges) <= min_tasks:
        return [(r,) for r in ranges]
    tasks: list[list[OffsetRange]] = []
    size = 0
    for rng in ranges:
        if tasks and size < min_offsets and size + rng.size <= MAX_OFFSETS_PER_TASK:
            tasks[-1].append(rng)
            size += rng.size
        else:
            tasks.append([rng])
            size = rng.size
    if min_tasks is not None and len(tasks) < min_tasks:
        return [(r,) for r in ranges]
    return [tuple(t) for t in tasks]


def fair_split(available: Mapping[TopicPartition, int], budget: int) -> dict[TopicPartition, int]:
    """Offsets to take per partition: ``min(budget, total)`` in all, split fairly (water-filling).

    Partitions with little available take all of it; what they leave is shared evenly by the others.
    Deterministic: ties are broken by topic-partition order.
    """
    order = sorted(available, key=lambda tp: (available[tp], tp))
    remaining = budget
    take: dict[TopicPartition, int] = {}
    for i, tp in enumerate(order):
        share = remaining // (len(order) - i)
        take[tp] = min(max(available[tp], 0), share)
        remaining -= take[tp]
    return take
