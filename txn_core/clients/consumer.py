"""The consumer: assign partitions, poll Arrow tables, commit group offsets (PROTOCOL.md "Consuming").

``poll`` returns a ``pyarrow.Table`` of the topic columns plus ``_topic``, ``_partition``, ``_offset`` and
``_timestamp`` (an empty table with that schema when nothing is available). Under ``read_committed``
(the default) it returns only records of committed transactions and non-transactional records, never
beyond a partition's last stable offset, never control records; under ``read_uncommitted``, every record
but control records. Memory is bounded by each partition reader's window and ``max_records``.

A damaged entry stops its partition: the records before it are returned, then every poll raises
:class:`~txn_core.errors.DamagedEntryError` naming it until an operator marks it lost (then its offsets are
passed over with a warning) or restores it. ``skip_damaged=True`` is the explicit choice to pass damage
nobody marked, with a warning (PROTOCOL.md "Damage").
"""

from __future__ import annotations

import contextlib
import functools
import operator
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, cast

import pyarrow as pa

from txn_core.clients.idle import DEFAULT_IDLE_BACKOFF_MAX_MS, IdleBackoff
from txn_core.errors import (
    ConfigurationError,
    DataLossError,
    InvalidOffsetError,
    OffsetOutOfRangeError,
    ProducerClosedError,
    TxnLogError,
)
from txn_core.format import paths
from txn_core.format.arrays import empty_table
from txn_core.format.ids import TopicPartition, is_int, validate_name
from txn_core.partition.ranges import available_end
from txn_core.partition.reader import ISOLATION_LEVELS, PartitionReader
from txn_core.partition.records import with_metadata_schema
from txn_core.partition.state import PartitionState
from txn_core.partition.timeindex import offset_for_timestamp
from txn_core.storage.parallel import parallel_map

if TYPE_CHECKING:
    from txn_core.clients.context import SupportsContext
    from txn_core.clients.topics import TopicMeta

OFFSET_RESETS = ("earliest", "latest")


def _tp(tp: tuple[str, int] | TopicPartition) -> TopicPartition:
    """``tp`` as a TopicPartition: a topic name and a partition number (an int, numpy's included; not a
    string, a float or a bool), else :class:`ConfigurationError` naming what was given."""
    try:
        topic, partition = (tp.topic, tp.partition) if isinstance(tp, TopicPartition) else tp
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"expected a (topic, partition) pair, got {tp!r}") from exc
    if not isinstance(topic, str):
        raise ConfigurationError(f"expected a (topic, partition) pair with the topic's name first, got {tp!r}")
    try:
        number = operator.index(partition)
    except TypeError:
        number = -1
    if isinstance(partition, bool) or number < 0:
        raise ConfigurationError(
            f"partition of {topic!r} must be a non-negative int, got {partition!r} ({type(partition).__name__})"
        )
    return tp if isinstance(tp, TopicPartition) and type(partition) is int else TopicPartition(topic, number)


class Consumer:
    """Reads assigned partitions in offset order; see module doc. Thread-safe (one poller at a time)."""

    def __init__(
        self,
        log: SupportsContext,
        group_id: str | None = None,
        *,
        isolation_level: str = "read_committed",
        auto_offset_reset: str = "earliest",
        window_bytes: int = 64 << 20,
        skip_damaged: bool = False,
        idle_backoff_max_ms: int = DEFAULT_IDLE_BACKOFF_MAX_MS,
        ready: Callable[[], None] | None = None,
    ) -> None:
        """``ready``: the log's format check (:class:`txn_core.format.logformat.LogFormat`), which the first
        :meth:`assign` overlaps with its own requests and waits for before it reports anything."""
        ctx = log.context
        if isolation_level not in ISOLATION_LEVELS:
            raise ConfigurationError(f"isolation_level must be one of {ISOLATION_LEVELS}, got {isolation_level!r}")
        if auto_offset_reset not in OFFSET_RESETS:
            raise ConfigurationError(f"auto_offset_reset must be one of {OFFSET_RESETS}, got {auto_offset_reset!r}")
        if group_id is not None:
            validate_name("group", group_id)
        if not isinstance(idle_backoff_max_ms, int) or idle_backoff_max_ms < 0:
            raise ConfigurationError(
                f"idle_backoff_max_ms must be a non-negative int (0: read quiet partitions at every poll), got "
                f"{idle_backoff_max_ms!r}"
            )
        self.ctx = ctx
        self.group_id = group_id
        self.isolation_level = isolation_level
        self.auto_offset_reset = auto_offset_reset
        self.window_bytes = window_bytes
        self.skip_damaged = skip_damaged
        self._readers: dict[TopicPartition, PartitionReader] = {}
        self._lag_states: dict[TopicPartition, PartitionState] = {}  # lag()'s own scans of the partitions
        self._order: list[TopicPartition] = []
        self._next = 0
        self._schema: pa.Schema | None = None
        self._closed = False
        self._deferred: TxnLogError | None = None  # an error to raise at the next poll (see poll)
        self._lock = threading.RLock()
        #: when quiet partitions are read again (txn_core.clients.idle)
        self._idle = IdleBackoff(idle_backoff_max_ms)
        self._ready = ready

    def _check_open(self) -> None:
        if self._closed:
            raise ProducerClosedError("consumer is closed")

    def assign(self, partitions: Iterable[tuple[str, int] | TopicPartition]) -> None:
        """Read exactly these partitions, starting at the group's committed offset if any, else at
        ``auto_offset_reset``. Replaces any previous assignment."""
        with self._lock:
            self._check_open()
            if isinstance(partitions, (str, TopicPartition)) or not isinstance(partitions, Iterable):
                raise ConfigurationError(
                    f"assign() takes a list of (topic, partition) pairs, e.g. [('orders', 0)], got {partitions!r}"
                )
            tps = [_tp(t) for t in partitions]
            self._deferred = None
            committed = self.ctx.groups.committed(self.group_id, require_stable=True) if self.group_id else {}

            def open_reader(tp: TopicPartition) -> PartitionReader:
                state = self.ctx.partition_state(paths.partition_log_path(tp.topic, tp.partition), shared=False)
                state.skip_damaged = self.skip_damaged
                state.open_listings()  # one round: log start, segments, snapshots, loose entries
                reader = PartitionReader(state, tp.topic, tp.partition, self.isolation_level, self.window_bytes)
                c = committed.get(tp)
                if c is not None:
                    try:
                        reader.seek(c.offset)
                    except OffsetOutOfRangeError as exc:
                        raise OffsetOutOfRangeError(self._unusable_offset(tp, c.offset, exc)) from exc
                    except DataLossError as exc:
                        raise DataLossError(self._unusable_offset(tp, c.offset, exc)) from exc
                elif self.auto_offset_reset == "earliest":
                    start = reader.log.recent_log_start()  # listed a moment ago
                    reader.log.segments.open_ahead(start.slot)  # beside the buffer snapshot's read
                    reader.read_ahead_from(start.slot)  # the first entries too
                    reader.seek(start.offset)
                else:
                    reader.seek(available_end(state, self.isolation_level))
                return reader

            # The topics' metadata and each partition's opening (listings, snapshot) are independent:
            # overlap them all, and with the log's format check at the first assign. A partition the
            # metadata does not have is refused before anything is kept (its opening only read); the format
            # check's error comes first (results are taken in order).
            ready, self._ready = self._ready, None
            jobs: list[Callable[[], object]] = [
                ready or (lambda: None),
                lambda: self._topic_metas(tps),
                *(functools.partial(open_reader, tp) for tp in tps),
            ]
            try:
                opened = parallel_map(lambda job: job(), jobs)
            except BaseException:
                self._ready = ready  # the next assign checks again
                raise
            metas = cast("dict[str, TopicMeta]", opened[1])
            readers = cast("list[PartitionReader]", opened[2:])
            schemas = [metas[tp.topic].schema for tp in tps]
            try:
                unified = pa.unify_schemas(schemas) if schemas else None
                if unified is not None and len({id(x) for x in schemas}) > 1:
                    # A column some assigned topics lack is null in their rows.
                    unified = pa.schema(
                        [f if all(f.name in x.names for x in schemas) else f.with_nullable(True) for f in unified]
                    )
            except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
                raise ConfigurationError(
                    f"the assigned topics have incompatible schemas ({exc}); use one consumer per schema"
                ) from exc
            self._readers = dict(zip(tps, readers, strict=True))
            self._idle.reset()
            self._order = tps
            self._next = 0
            self._schema = with_metadata_schema(unified) if unified is not None else None

    def _unusable_offset(self, tp: TopicPartition, offset: int, exc: TxnLogError) -> str:
        return (
            f"group {self.group_id!r} committed offset {offset} for {tp}, which this consumer cannot start from: "
            f"{exc}. Commit an offset the partition has for the group (a consumer of the group may "
            "commit({tp: offset}) without assign()), or read with another group"
        )

    def assignment(self) -> list[TopicPartition]:
        return list(self._order)

    def seek(self, tp: tuple[str, int] | TopicPartition, offset: int) -> None:
        with self._lock:
            self._check_open()
            if not is_int(offset) or offset < 0:
                raise InvalidOffsetError(f"offset must be a non-negative int, got {offset!r}")
            self._reader(_tp(tp)).seek(offset)
            self._moved(_tp(tp))

    def seek_to_beginning(self, tp: tuple[str, int] | TopicPartition) -> None:
        r = self._reader(_tp(tp))
        r.seek(r.log.log_start(refresh=True).offset)
        self._moved(_tp(tp))

    def seek_to_end(self, tp: tuple[str, int] | TopicPartition) -> None:
        """Move to the end of what this consumer may read: under read_committed the last stable offset, as
        Kafka's ``seekToEnd`` does (the records of a transaction still open there are read once it commits),
        else the log end."""
        r = self._reader(_tp(tp))
        r.seek(available_end(r.state, self.isolation_level))
        self._moved(_tp(tp))

    def offsets_for_times(
        self, timestamps: Mapping[tuple[str, int] | TopicPartition, int]
    ) -> dict[TopicPartition, int]:
        """Per partition: the offset to read from to see every record stamped at or after its timestamp (ms
        since the epoch; Kafka's ``offsetsForTimes``): the first entry stamped within
        :data:`~txn_core.partition.timeindex.MAX_CLOCK_SKEW_MS` of it, since writers' clocks disagree and entries are
        not in timestamp order; the log end if none is. The partitions need not be assigned."""
        self._check_open()
        asked = {_tp(tp): ts for tp, ts in timestamps.items()}
        for tp, ts in asked.items():
            if not is_int(ts) or ts < 0:
                raise ConfigurationError(
                    f"timestamp for {tp.topic}-{tp.partition} must be ms since the epoch, got {ts!r}"
                )
        self._topic_metas(list(asked))
        found = parallel_map(
            lambda item: offset_for_timestamp(
                self.ctx.partition_log(paths.partition_log_path(item[0].topic, item[0].partition)), item[1]
            ),
            list(asked.items()),
        )
        return dict(zip(asked, found, strict=True))

    def seek_to_timestamp(
        self, timestamp_ms: int, partitions: Iterable[tuple[str, int] | TopicPartition] | None = None
    ) -> None:
        """Move each of ``partitions`` (default: every assigned one) to :meth:`offsets_for_times`' offset for
        ``timestamp_ms``: the records polled next include every one stamped at or after it (and possibly some
        stamped up to the clock-skew bound before it; filter on ``_timestamp`` for an exact cut)."""
        tps = [_tp(tp) for tp in partitions] if partitions is not None else self.assignment()
        for tp in tps:
            self._reader(tp)  # assigned, or the error that says so
        for tp, offset in self.offsets_for_times({tp: timestamp_ms for tp in tps}).items():
            self.seek(tp, offset)

    def _moved(self, tp: TopicPartition) -> None:
        """A seek of ``tp``: no error left from before it, and no back-off (it is read at the next poll)."""
        self._deferred = None
        self._idle.found(tp)

    def _reader(self, tp: TopicPartition) -> PartitionReader:
        try:
            return self._readers[tp]
        except KeyError:
            raise ConfigurationError(f"{tp} is not assigned to this consumer; call assign() first") from None

    def position(self, tp: tuple[str, int] | TopicPartition) -> int:
        """The offset of the next record this consumer would return for ``tp``."""
        return self._reader(_tp(tp)).position

    def poll(self, max_records: int | None = None) -> pa.Table:
        """The next available records (round-robin over partitions), at most ``max_records``. A partition
        found caught up at several polls in a row is read again only after a back-off, up to
        ``idle_backoff_max_ms`` when set (:mod:`txn_core.clients.idle`): a quiet partition costs at most one request
        per poll, and fewer as it stays quiet."""
        with self._lock:
            self._check_open()
            if self._schema is None:
                raise ConfigurationError("no partitions assigned; call assign() first")
            if max_records is not None and not is_int(max_records):
                raise ConfigurationError(f"max_records must be an int or None, got {max_records!r}")
            if max_records is not None and max_records <= 0:
                raise ConfigurationError(f"max_records must be positive, got {max_records}")
            if self._deferred is not None:  # met by the previous poll, after records it returned
                error, self._deferred = self._deferred, None
                raise error
            batches: list[pa.RecordBatch] = []
            remaining = max_records
            n = len(self._order)
            self._read_ahead()
            for i in range(n):
                tp = self._order[(self._next + i) % n]
                reader = self._readers[tp]
                if reader.wants_data() and not self._idle.due(tp):
                    continue  # quiet, and asked a moment ago
                try:
                    got = reader.poll(remaining)
                except TxnLogError as exc:
                    if not batches:
                        raise
                    # Other partitions' records are already taken from their readers: return them, and
                    # raise this partition's error (its reader did not move) at the next poll.
                    self._deferred = exc
                    break
                batches.extend(got)
                if got:
                    self._idle.found(tp)
                elif reader.wants_data():
                    self._idle.empty(tp)
                if remaining is not None:
                    remaining -= sum(b.num_rows for b in got)
                    if remaining <= 0:
                        self._next = (self._next + i + 1) % n
                        break
            else:
                self._next = (self._next + 1) % n if n else 0
            return self._to_table(batches)

    def _read_ahead(self) -> None:
        """Fill every assigned partition's window at once, so that partitions catching up read together
        rather than one after another. An error is left for that partition's own poll to meet (its
        reader did not move past it), which keeps the order of delivery and errors of :meth:`poll`."""
        idle = [r for tp, r in self._readers.items() if r.wants_data() and self._idle.due(tp)]
        if len(idle) > 1:

            def fill(reader: PartitionReader) -> None:
                with contextlib.suppress(TxnLogError):
                    reader.fill()

            parallel_map(fill, idle)

    def _to_table(self, batches: list[pa.RecordBatch]) -> pa.Table:
        schema = self._schema
        if schema is None:  # pragma: no cover
            raise ConfigurationError("no partitions assigned")
        if not batches:
            return empty_table(schema)
        if all(b.schema == schema for b in batches):
            return pa.Table.from_batches(batches, schema=schema)
        aligned = []
        for b in batches:
            cols = [
                b.column(f.name).cast(f.type) if f.name in b.schema.names else pa.nulls(b.num_rows, f.type)
                for f in schema
            ]
            aligned.append(pa.RecordBatch.from_arrays(cols, schema=schema))
        return pa.Table.from_batches(aligned, schema=schema)

    def committed(self, tp: tuple[str, int] | TopicPartition) -> int | None:
        """The group's committed offset for ``tp`` (None if none), as read_committed readers see it."""
        if self.group_id is None:
            raise ConfigurationError("committed() needs a consumer with a group_id")
        c = self.ctx.groups.committed(self.group_id).get(_tp(tp))
        return c.offset if c else None

    def commit(
        self, offsets: Mapping[tuple[str, int] | TopicPartition, int] | None = None, metadata: str | None = None
    ) -> None:
        """Commit offsets for the group outside any transaction (default: current positions). Offsets given
        must name existing topic partitions; they are not checked against the log end (Kafka does not either).
        """
        with self._lock:
            self._check_open()
            if self.group_id is None:
                raise ConfigurationError("commit() needs a consumer with a group_id")
            if offsets is None:
                offsets = {tp: r.position for tp, r in self._readers.items()}
            else:
                self._topic_metas([_tp(t) for t in offsets])  # every partition named exists
            self.ctx.groups.commit(self.group_id, offsets, metadata)

    def _topic_metas(self, tps: list[TopicPartition]) -> dict[str, TopicMeta]:
        """The metadata of the topics of ``tps`` (one refresh per topic, not per partition), once every
        partition is found to exist: :class:`ConfigurationError` names one that does not (an unknown topic
        raises its own error)."""
        metas: dict[str, TopicMeta] = {}
        for tp in tps:
            meta = metas.get(tp.topic) or metas.setdefault(tp.topic, self.ctx.topics.get(tp.topic))
            if not 0 <= tp.partition < meta.partitions:
                raise ConfigurationError(
                    f"partition {tp.partition} does not exist in topic {tp.topic!r} "
                    f"(partitions 0..{meta.partitions - 1})"
                )
        return metas

    def lag(self) -> dict[TopicPartition, int]:
        """Per assigned partition: records between the position and what this consumer can reach now, the
        last stable offset (``read_committed``) or the log end (``read_uncommitted``), both looked up fresh
        (as ``Log.describe_topic`` does; this consumer's own reads are not moved). Aborted records and
        markers below that count, as in Kafka's lag."""
        with self._lock:
            self._check_open()
            readers = dict(self._readers)
            states = {
                tp: self._lag_states.get(tp)
                or self.ctx.partition_state(paths.partition_log_path(tp.topic, tp.partition), shared=False)
                for tp in readers
            }
            self._lag_states = states  # this consumer's own: never the log's shared state, which is not thread-safe
            reach = parallel_map(lambda tp: self.ctx.stable_offsets(tp.topic, tp.partition, states[tp]), list(readers))
            committed = self.isolation_level == "read_committed"
            return {
                tp: max(0, (bound if committed else end) - r.position)
                for (tp, r), (bound, end) in zip(readers.items(), reach, strict=True)
            }

    def close(self) -> None:
        """Close; waits for the buffer snapshots its readers are writing behind their records, so that a
        closed consumer leaves nothing being written (PROTOCOL.md "Snapshots")."""
        with self._lock:
            self._closed = True
            readers, self._readers = self._readers, {}
        for reader in readers.values():
            reader.state.snapshots.settle()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
