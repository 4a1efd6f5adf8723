"""The entry point: ``open_log(url)`` and the :class:`Log` facade (PROTOCOL.md "Layout").

A :class:`Log` is a client of one log URL. It creates nothing but the format object on first open; every
other object is created by the operation that needs it. Any number of :class:`Log` instances, in any
number of processes and machines, may use one URL at once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, cast

import pyarrow as pa

from txn_core.clients.context import LogContext
from txn_core.clients.idle import DEFAULT_IDLE_BACKOFF_MAX_MS
from txn_core.clients.topics import TopicConfig, TopicMeta
from txn_core.clock import Clock, system_clock
from txn_core.format.ids import TxnId
from txn_core.format.logformat import DEFAULT_COORDINATOR_PARTITIONS, LogFormat
from txn_core.ops import describe
from txn_core.ops.describe import (
    DamagedEntryDescription,
    OngoingTransaction,
    PartitionDescription,
    TopicDescription,
)
from txn_core.partition.partition import PartitionLog
from txn_core.partition.state import PartitionState
from txn_core.storage import Storage, open_storage
from txn_core.storage.parallel import parallel_map

if TYPE_CHECKING:
    from txn_core.clients.consumer import Consumer
    from txn_core.clients.groups import GroupStore
    from txn_core.clients.producer import Producer
    from txn_core.clients.subscriptions import (
        DeadLetterPolicy,
        RedeliveryBackoff,
        Subscription,
        SubscriptionConsumer,
    )
    from txn_core.clients.topics import TopicStore
    from txn_core.coordinator.service import TransactionCoordinator
    from txn_core.coordinator.txnlog import CoordinatorViews
    from txn_core.ops.admin import HangingTransaction, TransactionDescription, TransactionListing
    from txn_core.ops.damage import DamagedEntry
    from txn_core.partition.lost import LostEntry

__all__ = [
    "DamagedEntryDescription",
    "Log",
    "OngoingTransaction",
    "PartitionDescription",
    "TopicDescription",
    "open_log",
]


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
        #: the format object: on an object store its read overlaps a reader's first requests (logformat)
        self._format = LogFormat(
            storage,
            self.clock,
            create=create,
            allow_non_empty=allow_non_empty,
            coordinator_partitions=coordinator_partitions,
        )
        self._context = LogContext.build(
            storage, partitions_of=lambda: self._format.coordinator_partitions, clock=self.clock
        )

    @property
    def context(self) -> LogContext:
        """What every client and operation of this log is given (nothing below the facade sees the Log);
        the format object is settled first (:meth:`LogFormat.check`)."""
        self._format.check()
        return self._context

    @property
    def coordinator_partitions(self) -> int:
        """The log's own coordinator partition count (from its format object)."""
        return self._format.coordinator_partitions

    @property
    def topics(self) -> TopicStore:
        return self.context.topics

    @property
    def coordinator(self) -> TransactionCoordinator:
        return self.context.coordinator

    @property
    def views(self) -> CoordinatorViews:
        return self.context.views

    @property
    def groups(self) -> GroupStore:
        return self.context.groups

    def __repr__(self) -> str:
        return f"Log({self.url!r})"

    # --- internals shared by producers, consumers and admin ------------------------------------

    def partition_log(self, path: str) -> PartitionLog:
        return self.context.partition_log(path)

    def partition_state(self, path: str, *, shared: bool = True) -> PartitionState:
        """The transaction state of a log path (``shared``: one per Log, for admin queries)."""
        return self.context.partition_state(path, shared=shared)

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

    def topic_metas(self, names: Sequence[str]) -> dict[str, TopicMeta]:
        """The metadata of the topics ``names``, read at once and beside the log's format check (whose
        error comes first): a reader's first round, as a consumer's first ``assign`` makes it."""
        jobs: list[Callable[[], object]] = [self._format.check, *(partial(self._context.topics.get, n) for n in names)]
        got = parallel_map(lambda job: job(), jobs)
        return {n: cast("TopicMeta", m) for n, m in zip(names, got[1:], strict=True)}

    def add_partitions(self, name: str, total: int) -> TopicMeta:
        """Grow ``name`` to ``total`` partitions (readers pick the new ones up from their beginning)."""
        return self.topics.update(name, partitions=total)

    def set_retention(
        self, name: str, *, retention_ms: int | None = None, retention_bytes: int | None = None
    ) -> TopicMeta:
        return self.topics.update(name, config=TopicConfig(retention_ms, retention_bytes).check())

    def describe_topic(self, name: str) -> TopicDescription:
        """Per partition: log start and end, last stable offset, open transactions, aborted count, size."""
        return describe.describe_topic(self.context, name)

    def describe_partition(self, topic: str, partition: int, *, meta: TopicMeta | None = None) -> PartitionDescription:
        return describe.describe_partition(self.context, topic, partition, meta=meta)

    def describe_path(self, path: str, partition: int = 0) -> PartitionDescription:
        return describe.describe_path(self.context, path, partition)

    def stable_offsets(self, topic: str, partition: int, state: PartitionState | None = None) -> tuple[int, int]:
        """A partition's (last stable offset, log end offset) as of now (:meth:`LogContext.stable_offsets`)."""
        return self.context.stable_offsets(topic, partition, state)

    # --- clients --------------------------------------------------------------------------------

    def producer(
        self,
        transactional_id: str | None = None,
        *,
        transaction_timeout_ms: int = 60000,
        batch_bytes: int | None = None,
        marker_linger_ms: int | None = None,
    ) -> Producer:
        """An idempotent producer, or a transactional one when ``transactional_id`` is given; ``batch_bytes``
        (default :data:`txn_core.clients.producer.DEFAULT_BATCH_BYTES`, 4 MiB) is what a partition buffers
        before a write; ``marker_linger_ms`` (default 200) how long a decided transaction's markers wait to
        travel in the producer's next entries before they are written alone (0: at once; PROTOCOL.md
        "Carried markers")."""
        from txn_core.clients.producer import DEFAULT_BATCH_BYTES, Producer

        return Producer(
            self.context,
            transactional_id,
            transaction_timeout_ms=transaction_timeout_ms,
            batch_bytes=DEFAULT_BATCH_BYTES if batch_bytes is None else batch_bytes,
            marker_linger_ms=marker_linger_ms,
        )

    def consumer(
        self,
        group_id: str | None = None,
        *,
        isolation_level: str = "read_committed",
        auto_offset_reset: str = "earliest",
        skip_damaged: bool = False,
        idle_backoff_max_ms: int = DEFAULT_IDLE_BACKOFF_MAX_MS,
    ) -> Consumer:
        """A consumer (see :class:`Consumer`); ``skip_damaged`` passes damaged entries nobody marked lost,
        with a warning, instead of stopping at them (PROTOCOL.md "Damage"); ``idle_backoff_max_ms``: the
        longest a caught-up partition waits between reads (:mod:`txn_core.clients.idle`; 0: every poll)."""
        from txn_core.clients.consumer import Consumer

        return Consumer(
            self._context,  # its first round overlaps the format object's read, and waits for it
            group_id,
            ready=self._format.check,
            isolation_level=isolation_level,
            auto_offset_reset=auto_offset_reset,
            skip_damaged=skip_damaged,
            idle_backoff_max_ms=idle_backoff_max_ms,
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
        subscription_type: str = "shared",
        session_timeout_ms: int = 30_000,
        nack_backoff: RedeliveryBackoff | None = None,
        dead_letter_policy: DeadLetterPolicy | None = None,
        key_column: str | None = None,
        key_ranges: Sequence[tuple[int, int]] | None = None,
    ) -> SubscriptionConsumer:
        """A consumer of the named subscription on one topic partition (created unless ``create=False``):
        ``subscription_type`` "shared" (with every other consumer of it), "exclusive" (one consumer at a
        time; a second gets ``ConsumerBusyError`` until the first closes or goes ``session_timeout_ms``
        without a ``receive``), "failover" (one active consumer, chosen by name and partition; the next
        takes over when it closes or its session lapses) or "key_shared" (the records of one value of
        ``key_column`` go to one consumer at a time, in order; the keys are split evenly over the consumers, or
        each names its ``key_ranges``, inclusive pairs of hashes in 0..65535 on multiples of 1024).
        Acknowledgements may be transactional.
        ``nack_backoff`` (a ``RedeliveryBackoff``) grows the delay of repeated negative acknowledgements;
        ``dead_letter_policy`` (a ``DeadLetterPolicy``) moves a record delivered too often to a dead-letter
        topic, in the transaction that acknowledges it. See
        :class:`txn_core.clients.subscriptions.SubscriptionConsumer`."""
        from txn_core.clients.subscriptions import SubscriptionConsumer

        return SubscriptionConsumer(
            self.context,
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
            subscription_type=subscription_type,
            session_timeout_ms=session_timeout_ms,
            nack_backoff=nack_backoff,
            dead_letter_policy=dead_letter_policy,
            key_column=key_column,
            key_ranges=key_ranges,
        )

    def subscription(self, topic: str, partition: int, subscription: str) -> Subscription:
        """An existing subscription, for its state, description and trimming."""
        from txn_core.clients.subscriptions import Subscription

        return Subscription(self.context, topic, partition, subscription)

    # --- transactions admin ---------------------------------------------------------------------

    def list_transactions(self, *, include_complete: bool = False) -> list[TransactionListing]:
        from txn_core.ops import admin

        return admin.list_transactions(self.context, include_complete=include_complete)

    def describe_transaction(self, transactional_id: str) -> TransactionDescription:
        from txn_core.ops import admin

        return admin.describe_transaction(self.context, transactional_id)

    def abort_transaction(self, transactional_id: str) -> TransactionDescription:
        """An operator's abort of a (hanging) transaction; its producer is fenced."""
        from txn_core.ops import admin

        return admin.abort_transaction(self.context, transactional_id)

    def find_hanging_transactions(
        self, topic: str | None = None, *, max_age_ms: int | None = None
    ) -> list[HangingTransaction]:
        from txn_core.ops import admin

        return admin.find_hanging_transactions(self.context, topic, max_age_ms=max_age_ms)

    def abort_hanging_transaction(self, topic: str, partition: int, txn: TxnId) -> int:
        """Write the missing ABORT marker of a hanging transaction into one partition (KIP-664); returns
        the marker's offset. See :func:`txn_core.ops.admin.abort_hanging`."""
        from txn_core.ops import admin

        return admin.abort_hanging(self.context, topic, partition, txn)

    # --- damage (PROTOCOL.md "Damage") ----------------------------------------------------------

    def damaged_entries(self, topic: str, partition: int, *, payloads: bool = False) -> list[DamagedEntry]:
        """The damaged entries of one partition, marked lost or not (see :func:`txn_core.ops.damage.find_damaged`)."""
        from txn_core.ops import damage

        return damage.find_damaged(self.context, topic, partition, payloads=payloads)

    def mark_lost(self, topic: str, partition: int, slot: int, *, reason: str, records: int | None = None) -> LostEntry:
        """An operator's act: record that the damaged entry at ``slot`` is lost, so readers skip its offsets
        (see :func:`txn_core.ops.damage.mark_lost`)."""
        from txn_core.ops import damage

        return damage.mark_lost(self.context, topic, partition, slot, reason=reason, records=records)

    def transaction_metadata(self, transactional_id: str) -> dict[str, Any] | None:
        """The metadata stored with the last committed transaction of ``transactional_id``."""
        return self.context.transaction_metadata(transactional_id)

    def expire_transactions(self) -> int:
        """Abort every transaction past its timeout, in every coordinator partition; returns how many
        (:func:`txn_core.ops.admin.expire_transactions`)."""
        from txn_core.ops import admin

        return admin.expire_transactions(self.context)

    # --- groups ---------------------------------------------------------------------------------

    def list_groups(self) -> list[str]:
        return self.groups.list()

    def describe_group(self, group: str) -> list[dict[str, Any]]:
        return describe.describe_group(self.context, group)

    def close(self) -> None:
        self.storage.close()

    def __enter__(self) -> Log:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
