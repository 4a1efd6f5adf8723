"""Administration of a subscription: its state, a description, trimming (PROTOCOL.md "Subscriptions")."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

from txn_core.clients.subscriptions import trim as trimming
from txn_core.clients.subscriptions.acklog import AckLog
from txn_core.clients.subscriptions.hold import HOLD_RANGE, HoldStore
from txn_core.clients.subscriptions.keys import KeyLeaseStore, ranges_of_slices
from txn_core.clients.subscriptions.leases import Lease, LeaseStore, ListedLeaseStore
from txn_core.clients.subscriptions.members import list_members
from txn_core.clients.subscriptions.redelivery import DeadLetterPolicy
from txn_core.clients.subscriptions.state import AckStatus, SubscriptionState
from txn_core.clients.subscriptions.store import (
    SubscriptionMeta,
    SubscriptionType,
    list_subscriptions,
    read_meta,
    validate_ref,
)
from txn_core.errors import CorruptDataError, ObjectNotFoundError
from txn_core.format import paths
from txn_core.format.ids import TxnId
from txn_core.partition.ages import SAFE_ENTRY_AGE_MS, check_min_age_of
from txn_core.partition.reader import READ_COMMITTED, PartitionReader
from txn_core.storage.parallel import parallel_map

if TYPE_CHECKING:
    from txn_core.clients.context import SupportsContext


@dataclass(frozen=True, slots=True)
class SubscriptionDescription:
    topic: str
    partition: int
    name: str
    mark_delete: int
    acked_above_mark_delete: int
    pending: dict[TxnId, tuple[int, ...]]  # open transaction -> offsets it holds individually
    pending_cumulative: dict[TxnId, int]  # open transaction -> its pending cumulative bound
    backlog: int  # offsets between the mark-delete and the last stable offset
    ack_log_start_slot: int
    ack_log_end_slot: int
    accepted: int
    void: int
    type: SubscriptionType
    active_consumer: str | None  # Exclusive, Failover: the consumer holding the subscription now (None: nobody)
    active_until_ms: int | None  # when its hold lapses unless renewed
    consumers: tuple[str, ...]  # Failover, Key_Shared: the members that count now, sorted
    dead_letter_topic: str  # where its consumers' dead letters go (by default; see DeadLetterPolicy)
    dead_lettered: int | None  # committed records in that topic's partition of this one (None: no such topic)
    key_column: str | None = None  # Key_Shared: the column whose value is the key
    key_mode: str | None = None  # Key_Shared: "auto_split" or "sticky"
    #: Key_Shared: the hash ranges (inclusive) each consumer holds a valid slice lease of now
    key_holders: dict[str, tuple[tuple[int, int], ...]] = field(default_factory=dict)


class Subscription:
    """An existing subscription (:class:`SubscriptionNotFoundError` otherwise)."""

    def __init__(self, log: SupportsContext, topic: str, partition: int, name: str) -> None:
        self.ctx = ctx = log.context
        self.meta: SubscriptionMeta = read_meta(ctx.storage, validate_ref(topic, partition, name))
        self.ref = self.meta.ref
        self.acklog = AckLog(ctx, self.meta)
        self.leases: LeaseStore = (
            KeyLeaseStore(ctx.storage, self.ref)
            if self.meta.type is SubscriptionType.KEY_SHARED
            else LeaseStore(ctx.storage, self.ref, self.meta.range_size)
        )
        self.holds = HoldStore(ctx.storage, self.ref)

    def state(self) -> SubscriptionState:
        """The state, caught up; open transactions past their timeout are aborted on the way."""
        return self.acklog.refresh(resolve=True)

    def status(self, offset: int) -> AckStatus:
        return self.state().status(offset)

    def describe(self, *, dead_letter_topic: str | None = None) -> SubscriptionDescription:
        """The state, type, active consumer and members, and the dead letters in ``dead_letter_topic``
        (default ``<topic>-<subscription>-DLQ``; pass the one a :class:`DeadLetterPolicy` names)."""
        st = self.state()
        topic_path = paths.partition_log_path(self.ref.topic, self.ref.partition)
        pstate = self.ctx.partition_state(topic_path)
        pstate.scan_to_end()
        lso = pstate.read_bound()
        start = self.acklog.plog.log_start(refresh=True)
        end_slot, _ = self.acklog.plog.tail(refresh=True)
        now = self.ctx.clock()
        hold = self.holds.latest(HOLD_RANGE) if self.meta.type.held else None
        if hold is not None and not hold.valid(now):
            hold = None
        key_shared = self.meta.type is SubscriptionType.KEY_SHARED
        with_members = self.meta.type is SubscriptionType.FAILOVER or key_shared
        members = tuple(list_members(self.ctx.storage, self.ref, now)) if with_members else ()
        return SubscriptionDescription(
            self.ref.topic,
            self.ref.partition,
            self.ref.name,
            st.mark_delete,
            st.acked_above_mark_delete(),
            {t: tuple(st.pending_offsets(t)) for t in st.txns},
            {t.txn: t.cumulative for t in st.txns.values() if t.cumulative},
            max(0, lso - st.mark_delete),
            start.slot,
            end_slot,
            st.accepted_count,
            st.void_count,
            self.meta.type,
            hold.owner if hold is not None else None,
            hold.expires_ms if hold is not None else None,
            members,
            *self._dead_letters(dead_letter_topic),
            self.meta.key_column,
            self.meta.key_mode,
            self._key_holders(now) if key_shared else {},
        )

    def _key_holders(self, now: int) -> dict[str, tuple[tuple[int, int], ...]]:
        """Who holds which key slices now (one LIST, then the newest generation of each slice, read together)."""
        store = cast(ListedLeaseStore, self.leases)  # a Key_Shared subscription's: its slices
        newest = sorted((k, gens[-1]) for k, gens in store.generations().items())

        def read(slice_gen: tuple[int, int]) -> Lease | None:
            try:
                return store.read(*slice_gen)
            except (ObjectNotFoundError, CorruptDataError):
                return None  # renewed or trimmed meanwhile, or damaged: a description, not a decision

        slices: dict[str, list[int]] = {}
        for (k, _gen), lease in zip(newest, parallel_map(read, newest, leaf=True), strict=True):
            if lease is not None and lease.valid(now):
                slices.setdefault(lease.owner, []).append(k)
        return {owner: ranges_of_slices(ks) for owner, ks in sorted(slices.items())}

    def _dead_letters(self, topic: str | None) -> tuple[str, int | None]:
        """The dead-letter topic and how many committed records its partition of this one holds (one read of
        that partition: dead letters are few)."""
        name = DeadLetterPolicy(0, topic).topic_for(self.ref)
        if name not in self.ctx.topics.list(include_internal=True):
            return name, None
        partitions = self.ctx.topics.get(name).partitions
        partition = self.ref.partition % partitions
        path = paths.partition_log_path(name, partition)
        reader = PartitionReader(self.ctx.partition_state(path, shared=False), name, partition, READ_COMMITTED)
        reader.seek(self.ctx.partition_log(path).log_start(refresh=True).offset)
        count = 0
        while batches := reader.poll():
            count += sum(b.num_rows for b in batches)
        return name, count

    def skip_lost(self) -> int:
        """Give up the records retention removed before they were acknowledged, for every consumer (see
        :meth:`SubscriptionConsumer.skip_lost`; returns how far the mark-delete position moved): for an
        operator when no consumer runs."""
        return self.acklog.give_up_lost("admin")

    def trim(
        self, *, min_age_ms: int = trimming.MIN_ENTRY_AGE_MS, now_ms: int | None = None, check_min_age: bool = True
    ) -> trimming.TrimResult:
        """Snapshot and trim the ack log and old leases now (for a cron when no consumer runs). ``min_age_ms``
        below :data:`~txn_core.partition.ages.SAFE_ENTRY_AGE_MS` is refused unless ``check_min_age`` is false: an
        acknowledging producer in another process could write its marker at a slot just trimmed."""
        if check_min_age:
            check_min_age_of("trimming the ack log", min_age_ms, SAFE_ENTRY_AGE_MS)
        holds = self.holds if self.meta.type.held else None
        return trimming.trim(self.ctx, self.acklog, self.leases, min_age_ms=min_age_ms, now_ms=now_ms, holds=holds)


def trim_all(
    log: SupportsContext,
    *,
    min_age_ms: int = trimming.MIN_ENTRY_AGE_MS,
    now_ms: int | None = None,
    check_min_age: bool = True,
) -> dict[str, trimming.TrimResult]:
    """Trim every subscription of every topic; returns results by ``topic/partition/name``
    (``check_min_age`` as in :meth:`Subscription.trim`)."""
    ctx = log.context
    if check_min_age:
        check_min_age_of("trimming ack logs", min_age_ms, SAFE_ENTRY_AGE_MS)
    out = {}
    for topic in ctx.topics.list(include_internal=True):
        for p in range(ctx.topics.get(topic).partitions):
            for name in list_subscriptions(ctx.storage, topic, p):
                out[f"{topic}/{p}/{name}"] = Subscription(ctx, topic, p, name).trim(
                    min_age_ms=min_age_ms, now_ms=now_ms, check_min_age=False
                )
    return out
