"""The entry point: ``open_log(url)`` and the :class:`Log` facade (PROTOCOL.md "Layout").

A :class:`Log` is a client of one log URL. It creates nothing but the format object on first open; every
other object is created by the operation that needs it. Any number of :class:`Log` instances, in any
number of processes and machines, may use one URL at once.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from txn_core.clients.groups import GroupStore
from txn_core.clients.topics import TopicConfig, TopicMeta, TopicStore
from txn_core.clock import Clock, system_clock
from txn_core.coordinator.service import TransactionCoordinator
from txn_core.coordinator.txnlog import CoordinatorViews
from txn_core.errors import ConfigurationError, ObjectNotFoundError
from txn_core.format import envelope, paths
from txn_core.format.ids import TxnId
from txn_core.logs import get_logger
from txn_core.partition.lost import list_lost
from txn_core.partition.partition import PartitionLog
from txn_core.partition.skipping import skipped_lost
from txn_core.partition.state import PartitionState
from txn_core.storage import Storage, open_storage

if TYPE_CHECKING:
    from txn_core.clients.consumer import Consumer
    from txn_core.clients.producer import Producer
    from txn_core.clients.subscriptions import Subscription, SubscriptionConsumer
    from txn_core.ops.admin import HangingTransaction, TransactionDescription, TransactionListing
    from txn_core.ops.damage import DamagedEntry
    from txn_core.partition.lost import LostEntry

FORMAT_VERSION = 1
DEFAULT_COORDINATOR_PARTITIONS = 16


@dataclass(frozen=True, slots=True)
class OngoingTransaction:
    """An open transaction as a partition sees it."""

    txn: TxnId
    transactional_id: str | None
    first_offset: int
    last_offset: int
    producer_id: int
    producer_epoch: int
    state: str
    age_ms: int | None


@dataclass(frozen=True, slots=True)
class DamagedEntryDescription:
    """A damaged entry of a partition (PROTOCOL.md "Damage"): where it is, which check it fails, its offsets
    when known (``next_offset`` is None for a damaged last entry), and whether an operator marked it lost."""

    slot: int
    key: str
    check: str
    first_offset: int | None
    next_offset: int | None
    marked_lost: bool
    reason: str | None = None
    by: str | None = None
    marked_ms: int | None = None


@dataclass(frozen=True, slots=True)
class PartitionDescription:
    partition: int
    log_start_offset: int
    log_end_offset: int
    last_stable_offset: int
    ongoing_transactions: tuple[OngoingTransaction, ...] = ()
    aborted_transactions: int = 0
    committed_transactions: int = 0
    size_bytes: int = 0
    #: entries marked lost, and the damaged entry not marked lost that reading stops at, in slot order
    damaged_entries: tuple[DamagedEntryDescription, ...] = ()

    @property
    def lso_lag(self) -> int:
        """Records between the last stable offset and the log end (held back by open transactions)."""
        return self.log_end_offset - self.last_stable_offset


@dataclass(frozen=True, slots=True)
class TopicDescription:
    name: str
    schema: pa.Schema
    partitions: tuple[PartitionDescription, ...]
    version: int
    config: TopicConfig = field(default_factory=TopicConfig)


#: What the root of a log holds (PROTOCOL.md "Layout"); anything else there means it is someone else's.
LOG_TOP_LEVEL = frozenset({"_txnlog/", "topics/", "groups/", "subscriptions/", "staging/", "segments/"})


def open_log(
    url: str,
    storage_options: dict[str, Any] | None = None,
    *,
    coordinator_partitions: int = DEFAULT_COORDINATOR_PARTITIONS,
    clock: Clock | None = None,
    create: bool = True,
    allow_non_empty: bool = False,
) -> Log:
    """Open (creating if needed) the log at ``url``: a path, ``file://``, ``memory://``, ``s3://``, ...

    ``storage_options`` go to fsspec (credentials, endpoint); they are never logged or written.
    ``coordinator_partitions`` applies when the log is created; an existing log keeps its own.
    ``create=False`` opens an existing log only (a reader: a mistyped URL is an error and creates nothing).
    A new log is not created in a directory or prefix that holds other files unless ``allow_non_empty``.
    Opening an existing log writes nothing: it works with read-only access.
    """
    storage = open_storage(url, storage_options)
    return Log(
        storage,
        coordinator_partitions=coordinator_partitions,
        clock=clock,
        create=create,
        allow_non_empty=allow_non_empty,
    )


class Log:
    """A client of one log URL (see module doc). Thread-safe; cheap to create."""

    def __init__(
        self,
        storage: Storage,
        *,
        coordinator_partitions: int = DEFAULT_COORDINATOR_PARTITIONS,
        clock: Clock | None = None,
        create: bool = True,
        allow_non_empty: bool = False,
    ) -> None:
        self.storage = storage
        self.url = storage.url
        self.clock: Clock = clock or system_clock
        self.coordinator_partitions = self._ensure_format(coordinator_partitions, create, allow_non_empty)
        self.topics = TopicStore(storage, clock=self.clock)
        self._plogs: dict[str, PartitionLog] = {}
        self._states: dict[str, PartitionState] = {}
        self._lock = threading.Lock()
        self.views = CoordinatorViews(storage, self.coordinator_partitions, self.clock)
        self.coordinator = TransactionCoordinator(
            storage, self.views, self.partition_log, self.coordinator_partitions, self.clock
        )
        self.groups = GroupStore(self)

    def __repr__(self) -> str:
        return f"Log({self.url!r})"

    def _ensure_format(self, coordinator_partitions: int, create: bool, allow_non_empty: bool) -> int:
        if not 1 <= coordinator_partitions <= 4096:
            raise ConfigurationError(f"coordinator_partitions must be in [1, 4096], got {coordinator_partitions}")
        try:
            value = envelope.read_json(self.storage, paths.FORMAT_KEY, envelope.ObjectKind.FORMAT)
        except ObjectNotFoundError:
            if not create:
                raise ConfigurationError(
                    f"no txnlog at {self.storage.url} (it has no {paths.FORMAT_KEY}): check the URL and the storage "
                    "options; a reader never creates a log (producers and txn_core.open_log do)"
                ) from None
            if not allow_non_empty:
                foreign = [n for n in self.storage.list("") if n not in LOG_TOP_LEVEL]
                if foreign:
                    shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
                    raise ConfigurationError(
                        f"{self.storage.url} is not a txnlog log but holds other files ({shown}); refusing to "
                        "create a log beside them. Use an empty directory or prefix, or opt in with "
                        "open_log(..., allow_non_empty=True) (Spark sink: option allowNonEmptyPath=true)."
                    ) from None
            envelope.create_json(
                self.storage,
                paths.FORMAT_KEY,
                envelope.ObjectKind.FORMAT,
                {
                    "format": "txnlog",
                    "version": FORMAT_VERSION,
                    "coordinator_partitions": coordinator_partitions,
                    "created_ms": self.clock(),
                },
            )
            value = envelope.read_json(self.storage, paths.FORMAT_KEY, envelope.ObjectKind.FORMAT)
        if value.get("format") != "txnlog" or int(value.get("version", 0)) > FORMAT_VERSION:
            raise ConfigurationError(
                f"{self.storage.describe()} holds a txnlog of format version {value.get('version')}; this "
                f"txnlog reads version {FORMAT_VERSION}. Upgrade txnlog."
            )
        return int(value["coordinator_partitions"])

    # --- internals shared by producers, consumers and admin ------------------------------------

    def partition_log(self, path: str) -> PartitionLog:
        with self._lock:
            plog = self._plogs.get(path)
            if plog is None:
                plog = PartitionLog(self.storage, path, clock=self.clock)
                self._plogs[path] = plog
            return plog

    def partition_state(self, path: str, *, shared: bool = True) -> PartitionState:
        """The transaction buffer tracker of a log path (``shared``: one per Log, for admin queries)."""
        if not shared:
            return PartitionState(self.partition_log(path), self.coordinator.resolve)
        with self._lock:
            state = self._states.get(path)
        if state is None:
            state = PartitionState(self.partition_log(path), self.coordinator.resolve)
            with self._lock:
                state = self._states.setdefault(path, state)
        return state

    # --- topics ---------------------------------------------------------------------------------

    def create_topic(
        self,
        name: str,
        partitions: int,
        schema: pa.Schema,
        *,
        retention_ms: int | None = None,
        retention_bytes: int | None = None,
    ) -> TopicMeta:
        """Create a topic; :class:`TopicExistsError` if it exists (exactly one of racing creators wins)."""
        return self.topics.create(name, partitions, schema, TopicConfig(retention_ms, retention_bytes).check())

    def list_topics(self) -> list[str]:
        return self.topics.list()

    def add_partitions(self, name: str, total: int) -> TopicMeta:
        """Grow ``name`` to ``total`` partitions (readers pick the new ones up from their beginning)."""
        return self.topics.update(name, partitions=total)

    def set_retention(
        self, name: str, *, retention_ms: int | None = None, retention_bytes: int | None = None
    ) -> TopicMeta:
        return self.topics.update(name, config=TopicConfig(retention_ms, retention_bytes).check())

    def describe_topic(self, name: str) -> TopicDescription:
        """Per partition: log start and end, last stable offset, open transactions, aborted count, size."""
        meta = self.topics.get(name)
        parts = tuple(self.describe_partition(name, p, meta=meta) for p in range(meta.partitions))
        return TopicDescription(name, meta.schema, parts, meta.version, meta.config)

    def describe_partition(self, topic: str, partition: int, *, meta: TopicMeta | None = None) -> PartitionDescription:
        meta = meta or self.topics.get(topic)
        if not 0 <= partition < meta.partitions:
            raise ConfigurationError(f"topic {topic!r} has no partition {partition} (0..{meta.partitions - 1})")
        return self.describe_path(paths.partition_log_path(topic, partition), partition)

    def _scanned_state(self, path: str, state: PartitionState | None = None) -> tuple[PartitionState, int]:
        """``state`` (default: the shared state of ``path``, for admin queries, used under no lock: not
        thread-safe) scanned to a fresh log end, and its read bound (last stable offset)."""
        state = state or self.partition_state(path)
        state.log.readable_tail(refresh=True)  # a fresh tail: the scan then tells a hole from the log end
        for _ in range(3):
            state.scan_to_end()
            before = state.buffer.position
            state.read_bound()  # may abort a transaction past its timeout, writing markers
            state.scan_to_end()
            if state.buffer.position == before:
                break
        return state, state.read_bound()

    def stable_offsets(self, topic: str, partition: int, state: PartitionState | None = None) -> tuple[int, int]:
        """A partition's (last stable offset, log end offset) as of now: what a ``read_committed`` and a
        ``read_uncommitted`` reader can reach. ``state``: the caller's own state of the partition
        (``Log.partition_state(path, shared=False)``), kept between calls by a caller on any thread
        (``Consumer.lag``); without it, the shared one, which admin queries use from one thread."""
        state, bound = self._scanned_state(paths.partition_log_path(topic, partition), state)
        return bound, state.buffer.position if state.damage is None else state.log.readable_end()

    def describe_path(self, path: str, partition: int = 0) -> PartitionDescription:
        state, bound = self._scanned_state(path)
        buffer = state.buffer
        now = self.clock()
        ongoing = []
        for o in buffer.ongoing.values():
            status = self.coordinator.views.get(o.txn.coordinator).status(o.txn)
            if status is not None and status.state is not None:
                label = status.state.value
            else:
                label = "Finished (no marker here)"
            started = state.start_ms(o.txn, status)
            age = now - started if started else None
            ongoing.append(
                OngoingTransaction(
                    o.txn,
                    status.tid if status else None,
                    o.first_offset,
                    o.last_offset,
                    o.producer_id,
                    o.producer_epoch,
                    label,
                    age,
                )
            )
        start = state.log.log_start(refresh=True)
        damaged = _damaged_entries(state, start.slot)
        return PartitionDescription(
            partition,
            start.offset,
            buffer.position if state.damage is None else state.log.readable_end(),
            bound,
            tuple(ongoing),
            len(buffer.aborted),
            buffer.committed_count,
            max(0, buffer.size_bytes - start.bytes_before),
            damaged,
        )

    # --- clients --------------------------------------------------------------------------------

    def producer(
        self,
        transactional_id: str | None = None,
        *,
        transaction_timeout_ms: int = 60000,
        batch_bytes: int | None = None,
    ) -> Producer:
        """An idempotent producer, or a transactional one when ``transactional_id`` is given; ``batch_bytes``
        (default :data:`txn_core.clients.producer.DEFAULT_BATCH_BYTES`, 4 MiB) is what a partition buffers
        before a write."""
        from txn_core.clients.producer import DEFAULT_BATCH_BYTES, Producer

        return Producer(
            self,
            transactional_id,
            transaction_timeout_ms=transaction_timeout_ms,
            batch_bytes=DEFAULT_BATCH_BYTES if batch_bytes is None else batch_bytes,
        )

    def consumer(
        self,
        group_id: str | None = None,
        *,
        isolation_level: str = "read_committed",
        auto_offset_reset: str = "earliest",
        skip_damaged: bool = False,
    ) -> Consumer:
        """A consumer (see :class:`Consumer`); ``skip_damaged`` passes damaged entries nobody marked lost,
        with a warning, instead of stopping at them (PROTOCOL.md "Damage")."""
        from txn_core.clients.consumer import Consumer

        return Consumer(
            self,
            group_id,
            isolation_level=isolation_level,
            auto_offset_reset=auto_offset_reset,
            skip_damaged=skip_damaged,
        )

    # --- subscriptions (txn_core.clients.subscriptions; PROTOCOL.md "Subscriptions") ------------------------

    def subscribe(
        self,
        topic: str,
        partition: int,
        subscription: str,
        *,
        consumer_name: str | None = None,
        ack_timeout_ms: int = 30_000,
        nack_delay_ms: int = 1_000,
        create: bool = True,
        initial_position: str = "earliest",
        range_size: int | None = None,
        max_unacked: int = 1000,
        trim_min_age_ms: int = 10 * 60 * 1000,
    ) -> SubscriptionConsumer:
        """A consumer of the named subscription on one topic partition (created unless ``create=False``),
        shared with every other consumer of it; acknowledgements may be transactional. See
        :class:`txn_core.clients.subscriptions.SubscriptionConsumer`."""
        from txn_core.clients.subscriptions import SubscriptionConsumer

        return SubscriptionConsumer(
            self,
            topic,
            partition,
            subscription,
            consumer_name=consumer_name,
            ack_timeout_ms=ack_timeout_ms,
            nack_delay_ms=nack_delay_ms,
            create=create,
            initial_position=initial_position,
            range_size=range_size,
            max_unacked=max_unacked,
            trim_min_age_ms=trim_min_age_ms,
        )

    def subscription(self, topic: str, partition: int, subscription: str) -> Subscription:
        """An existing subscription, for its state, description and trimming."""
        from txn_core.clients.subscriptions import Subscription

        return Subscription(self, topic, partition, subscription)

    # --- transactions admin ---------------------------------------------------------------------

    def list_transactions(self, *, include_complete: bool = False) -> list[TransactionListing]:
        from txn_core.ops import admin

        return admin.list_transactions(self, include_complete=include_complete)

    def describe_transaction(self, transactional_id: str) -> TransactionDescription:
        from txn_core.ops import admin

        return admin.describe_transaction(self, transactional_id)

    def abort_transaction(self, transactional_id: str) -> TransactionDescription:
        """An operator's abort of a (hanging) transaction; its producer is fenced."""
        from txn_core.ops import admin

        return admin.abort_transaction(self, transactional_id)

    def find_hanging_transactions(
        self, topic: str | None = None, *, max_age_ms: int | None = None
    ) -> list[HangingTransaction]:
        from txn_core.ops import admin

        return admin.find_hanging_transactions(self, topic, max_age_ms=max_age_ms)

    def abort_hanging_transaction(self, topic: str, partition: int, txn: TxnId) -> int:
        """Write the missing ABORT marker of a hanging transaction into one partition (KIP-664); returns
        the marker's offset. See :func:`txn_core.ops.admin.abort_hanging`."""
        from txn_core.ops import admin

        return admin.abort_hanging(self, topic, partition, txn)

    # --- damage (PROTOCOL.md "Damage") ----------------------------------------------------------

    def damaged_entries(self, topic: str, partition: int, *, payloads: bool = False) -> list[DamagedEntry]:
        """The damaged entries of one partition, marked lost or not (see :func:`txn_core.ops.damage.find_damaged`)."""
        from txn_core.ops import damage

        return damage.find_damaged(self, topic, partition, payloads=payloads)

    def mark_lost(self, topic: str, partition: int, slot: int, *, reason: str, records: int | None = None) -> LostEntry:
        """An operator's act: record that the damaged entry at ``slot`` is lost, so readers skip its offsets
        (see :func:`txn_core.ops.damage.mark_lost`)."""
        from txn_core.ops import damage

        return damage.mark_lost(self, topic, partition, slot, reason=reason, records=records)

    def transaction_metadata(self, transactional_id: str) -> dict[str, Any] | None:
        """The metadata stored with the last committed transaction of ``transactional_id``."""
        state = self.coordinator.state(transactional_id)
        return state.last_committed if state else None

    def expire_transactions(self) -> int:
        """Abort every transaction past its timeout, in every coordinator partition; returns how many.

        A transaction begun ahead has no start in the transaction log: its timeout runs from its first
        write (PROTOCOL.md "Timeouts"), which this finds in the logs it guessed as participants once it has
        been reserved for longer than its timeout (:meth:`_first_write_ms`)."""
        n = 0
        scanned: dict[str, PartitionState | None] = {}  # each participant's buffer brought up to date once
        for c in range(self.coordinator_partitions):
            view = self.views.get(c)
            view.refresh()
            n += len(
                self.coordinator.expire(view, first_write=lambda txn, where: self._first_write_ms(txn, where, scanned))
            )
        return n

    def _first_write_ms(
        self, txn: TxnId, participants: tuple[str, ...], scanned: dict[str, PartitionState | None]
    ) -> int | None:
        """The earliest first entry of ``txn`` among ``participants`` that are partition logs (topic
        partitions, group offsets), as their readers see it (the entry header's timestamp); None if none of
        them holds it ongoing. ``scanned``: the states this expiry run has brought to the log end (None: could
        not be read), so a path is scanned once per run. A participant that cannot be read now is skipped
        (logged): the next run tries again."""
        found: list[int] = []
        for path in participants:
            if paths.topic_partition_of(path) is None and not (
                path.startswith(paths.GROUPS) and path.endswith("/offsets")
            ):
                continue  # an acknowledgement log: its readers time the transaction out
            if path not in scanned:
                try:
                    fresh = self.partition_state(path)
                    fresh.scan_to_end()
                    scanned[path] = fresh
                except Exception as exc:  # one unreadable log must not stop the expiry of everything else
                    get_logger("txnlog.expiry").warning(
                        "%s: not read for expiry (%s); the next run tries again", path, exc
                    )
                    scanned[path] = None
            known = scanned[path]
            first = None
            if known is not None:
                try:
                    first = known.first_write_ms(txn)
                except Exception as exc:
                    get_logger("txnlog.expiry").warning("%s: first write of %s not known (%s)", path, txn, exc)
            if first is not None:
                found.append(first)
        return min(found, default=None)

    # --- groups ---------------------------------------------------------------------------------

    def list_groups(self) -> list[str]:
        return self.groups.list()

    def describe_group(self, group: str) -> list[dict[str, Any]]:
        return self.groups.describe(group)

    def close(self) -> None:
        self.storage.close()

    def __enter__(self) -> Log:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _damaged_entries(state: PartitionState, start_slot: int) -> tuple[DamagedEntryDescription, ...]:
    """The entries of a partition marked lost (one LIST) and the damaged one its scan stopped at."""
    out = [
        DamagedEntryDescription(
            lost.slot,
            lost.key,
            lost.check,
            lost.first_offset,
            lost.next_offset,
            True,
            lost.reason,
            lost.by,
            lost.marked_ms,
        )
        for lost in list_lost(state.log.storage, state.log.path)
        if lost.slot >= start_slot
    ]
    damage = state.damage
    if damage is not None:
        extent = skipped_lost(state.log, damage)
        out.append(
            DamagedEntryDescription(
                damage.slot,
                damage.key or state.log.entries.key(damage.slot),
                damage.check or str(damage),
                damage.first_offset,
                extent.next_offset if extent is not None else None,
                False,
            )
        )
    return tuple(sorted(out, key=lambda d: d.slot))
