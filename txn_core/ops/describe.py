"""Topics, partitions and groups described (PROTOCOL.md "Admin", "Read bound", "Damage"): per partition its
log start and end, last stable offset, open transactions, counts and size, and its damaged entries; per
group its committed offsets and their lag behind the last stable offset.

A description reads what a ``read_committed`` reader would (scanning each partition to a fresh end) and
may, as such a reader does, abort a transaction past its timeout on the way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from txn_core.clients.topics import TopicConfig, TopicMeta
from txn_core.errors import ConfigurationError, TxnLogError
from txn_core.format import paths
from txn_core.format.ids import TxnId
from txn_core.partition.lost import list_lost
from txn_core.partition.skipping import skipped_lost
from txn_core.partition.state import PartitionState

if TYPE_CHECKING:
    from txn_core.clients.context import SupportsContext


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


def describe_topic(log: SupportsContext, name: str) -> TopicDescription:
    """Per partition: log start and end, last stable offset, open transactions, aborted count, size."""
    meta = log.context.topics.get(name)
    parts = tuple(describe_partition(log, name, p, meta=meta) for p in range(meta.partitions))
    return TopicDescription(name, meta.schema, parts, meta.version, meta.config)


def describe_partition(
    log: SupportsContext, topic: str, partition: int, *, meta: TopicMeta | None = None
) -> PartitionDescription:
    meta = meta or log.context.topics.get(topic)
    if not 0 <= partition < meta.partitions:
        raise ConfigurationError(f"topic {topic!r} has no partition {partition} (0..{meta.partitions - 1})")
    return describe_path(log, paths.partition_log_path(topic, partition), partition)


def describe_path(log: SupportsContext, path: str, partition: int = 0) -> PartitionDescription:
    """The description of the partition log at ``path`` (a topic partition or a group's offsets log), from its
    shared state (not thread-safe: admin queries run from one thread)."""
    ctx = log.context
    state = ctx.partition_state(path)
    bound = state.scanned_bound()
    buffer = state.buffer
    now = ctx.clock()
    ongoing = []
    for o in buffer.ongoing.values():
        status = ctx.views.get(o.txn.coordinator).status(o.txn)
        label = status.state.value if status is not None and status.state is not None else "Finished (no marker here)"
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
        state.end_offset(),
        bound,
        tuple(ongoing),
        len(buffer.aborted),
        buffer.committed_count,
        max(0, buffer.size_bytes - start.bytes_before),
        damaged,
    )


def describe_group(log: SupportsContext, group: str) -> list[dict[str, Any]]:
    """Per topic-partition of ``group``: committed offset, last stable offset, log end and lag."""
    ctx = log.context
    rows = []
    for tp, off in sorted(ctx.groups.committed(group).items()):
        try:
            desc = describe_partition(ctx, tp.topic, tp.partition)
            lso, end = desc.last_stable_offset, desc.log_end_offset
        except TxnLogError:  # the topic was deleted or shrank: no lag to report
            lso = end = -1
        rows.append(
            {
                "topic": tp.topic,
                "partition": tp.partition,
                "committed": off.offset,
                "last_stable_offset": lso,
                "log_end_offset": end,
                "lag": max(0, lso - off.offset) if lso >= 0 else None,
                "metadata": off.metadata,
            }
        )
    return rows


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
