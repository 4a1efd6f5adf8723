"""What clients and operations are given: one log's dependencies, explicit and frozen.

:class:`LogContext` is built once per :class:`txn_core.Log` (the facade) and handed down: producers,
consumers, groups, subscriptions, application transactions and every operation take it, and reach nothing
else. Its fields are the whole list of what a client may use: the storage, the clock, the log's topic
store, its partition logs and their shared states, the transaction coordinator and the group store.
Nothing below the facade imports :class:`txn_core.Log`.

Functions a user calls with a ``Log`` (``AppCommitter(log)``, ``maintenance.apply_retention(log)``) take
anything that has a context (:class:`SupportsContext`): a ``Log`` or the context itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from txn_core.clients.groups import GroupStore
from txn_core.clients.topics import TopicStore
from txn_core.clock import Clock
from txn_core.coordinator.service import TransactionCoordinator
from txn_core.coordinator.txnlog import CoordinatorViews
from txn_core.format import paths
from txn_core.partition.partition import PartitionLog
from txn_core.partition.registry import PartitionLogs, PartitionStates
from txn_core.partition.state import PartitionState
from txn_core.storage import Storage


@dataclass(frozen=True, eq=False)
class LogContext:
    """The dependencies of everything below the facade, for one log URL (see module doc).

    Invariants: one per :class:`txn_core.Log`; ``partition_logs`` holds one :class:`PartitionLog` per path,
    shared by every client of this context; ``coordinator_partitions`` is the log's own (from its format
    object, :mod:`txn_core.format.logformat`, read when first needed), never the caller's wish."""

    storage: Storage
    clock: Clock
    partitions_of: Callable[[], int]
    topics: TopicStore
    partition_logs: PartitionLogs
    partition_states: PartitionStates
    coordinator: TransactionCoordinator
    groups: GroupStore

    @classmethod
    def build(cls, storage: Storage, *, partitions_of: Callable[[], int], clock: Clock) -> LogContext:
        """The context of the log at ``storage``; ``partitions_of`` answers its coordinator partition count
        from its format object when first asked."""
        logs = PartitionLogs(storage, clock=clock)
        views = CoordinatorViews(storage, clock)
        coordinator = TransactionCoordinator(storage, views, logs.get, partitions_of, clock)
        states = PartitionStates(logs, coordinator)
        return cls(
            storage=storage,
            clock=clock,
            partitions_of=partitions_of,
            topics=TopicStore(storage, clock=clock, created=lambda name: states.forget(paths.topic_root(name))),
            partition_logs=logs,
            partition_states=states,
            coordinator=coordinator,
            groups=GroupStore(storage, clock=clock, states=states, views=views),
        )

    @property
    def context(self) -> LogContext:
        return self

    @property
    def url(self) -> str:
        return self.storage.url

    @property
    def coordinator_partitions(self) -> int:
        """The log's coordinator partition count (from its format object)."""
        return self.partitions_of()

    @property
    def views(self) -> CoordinatorViews:
        """The transaction log of every coordinator partition, as this process knows it."""
        return self.coordinator.views

    def partition_log(self, path: str) -> PartitionLog:
        return self.partition_logs.get(path)

    def partition_state(self, path: str, *, shared: bool = True) -> PartitionState:
        """The transaction state of a log path: the shared one (admin queries, from one thread at a time), or
        with ``shared=False`` a fresh one of the caller's own."""
        return self.partition_states.get(path, shared=shared)

    def stable_offsets(self, topic: str, partition: int, state: PartitionState | None = None) -> tuple[int, int]:
        """A partition's (last stable offset, log end offset) as of now: what a ``read_committed`` and a
        ``read_uncommitted`` reader can reach. ``state``: the caller's own state of the partition, kept
        between calls by a caller on any thread (``Consumer.lag``); without it, the shared one."""
        state = state or self.partition_state(paths.partition_log_path(topic, partition))
        bound = state.scanned_bound()
        return bound, state.end_offset()

    def transaction_metadata(self, transactional_id: str) -> dict[str, Any] | None:
        """The metadata stored with the last committed transaction of ``transactional_id``."""
        state = self.coordinator.state(transactional_id)
        return state.last_committed if state else None


class SupportsContext(Protocol):
    """A :class:`txn_core.Log` or a :class:`LogContext`: what a public function below the facade accepts."""

    @property
    def context(self) -> LogContext: ...
