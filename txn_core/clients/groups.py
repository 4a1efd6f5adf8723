"""Consumer-group offsets (PROTOCOL.md "Consumer groups").

A group's committed offsets live in an internal single-partition log, ``groups/<group>/offsets``, whose
entries are Arrow tables ``(topic, partition, offset, metadata, commit_ms)``. A plain commit appends a
non-transactional entry; ``send_offsets_to_transaction`` appends a transactional entry and registers the
group log as a participant, so the offsets get the transaction's marker and become visible exactly when
its data does (Kafka's AddOffsetsToTxn + TxnOffsetCommit). The committed offsets are the latest value per
topic-partition among the entries a read_committed reader sees, in offset order.

A :class:`GroupView` keeps a reader positioned at the end of what it has applied, so ``committed()`` costs
one GET when nothing changed. Every :data:`GROUP_SNAPSHOT_EVERY` entries it writes a group snapshot
(``groups/<group>/snapshots/<020d position>``: the offsets map as of ``position``) so a new process does not
replay the whole history.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from txn_core.errors import (
    ConfigurationError,
    CorruptDataError,
    InvalidOffsetError,
    ObjectNotFoundError,
    UnstableOffsetsError,
)
from txn_core.format import envelope, paths
from txn_core.format.entry import EntryKind, Payload
from txn_core.format.ids import TopicPartition, TxnId, is_int, validate_name
from txn_core.partition.reader import READ_COMMITTED, PartitionReader
from txn_core.storage.guarded import opportunistic

if TYPE_CHECKING:
    from txn_core.clock import Clock
    from txn_core.coordinator.txnlog import CoordinatorViews
    from txn_core.partition.registry import PartitionStates
    from txn_core.storage import Storage

OFFSETS_SCHEMA = pa.schema(
    [
        pa.field("topic", pa.string(), nullable=False),
        pa.field("partition", pa.int32(), nullable=False),
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("metadata", pa.string()),
        pa.field("commit_ms", pa.int64(), nullable=False),
    ]
)
GROUP_SNAPSHOT_EVERY = 256
GROUP_SNAPSHOTS_KEPT = 2


def group_snapshots(group: str) -> str:
    return f"{paths.GROUPS}{group}/snapshots/"


@dataclass(frozen=True, slots=True)
class GroupOffset:
    topic: str
    partition: int
    offset: int
    metadata: str | None
    commit_ms: int


class GroupView:
    """The committed offsets of one group, kept current by reading its offsets log."""

    def __init__(self, store: GroupStore, group: str) -> None:
        self.store = store
        self.storage = store.storage
        self.group = group
        self.path = paths.group_log_path(group)
        self.offsets: dict[TopicPartition, GroupOffset] = {}
        self._reader: PartitionReader | None = None
        self._since_snapshot = 0
        self._lock = threading.Lock()

    def _open(self) -> PartitionReader:
        state = self.store.states.get(self.path, shared=False)
        reader = PartitionReader(state, f"__group:{self.group}", 0, READ_COMMITTED)
        position = self._load_snapshot()
        reader.seek(max(position, state.log.log_start().offset))
        return reader

    def _load_snapshot(self) -> int:
        prefix = group_snapshots(self.group)
        names = paths.slot_names(self.storage.list(prefix))
        for name in reversed(names):
            try:
                value = envelope.read_json(self.storage, prefix + name, envelope.ObjectKind.GROUP_SNAPSHOT)
            except (ObjectNotFoundError, CorruptDataError):
                continue
            self.offsets = {
                TopicPartition(t, int(p)): GroupOffset(t, int(p), int(o), m, int(ts))
                for t, p, o, m, ts in value["offsets"]
            }
            return int(value["position"])
        return 0

    def refresh(self) -> dict[TopicPartition, GroupOffset]:
        with self._lock:
            if self._reader is None:
                self._reader = self._open()
            while True:
                batches = self._reader.poll()
                if not batches:
                    break
                for batch in batches:
                    cols = batch.to_pydict()
                    for t, p, o, m, ts in zip(
                        cols["topic"],
                        cols["partition"],
                        cols["offset"],
                        cols["metadata"],
                        cols["commit_ms"],
                        strict=True,
                    ):
                        self.offsets[TopicPartition(t, p)] = GroupOffset(t, p, o, m, ts)
                    self._since_snapshot += batch.num_rows
            if self._since_snapshot >= GROUP_SNAPSHOT_EVERY:
                position = self._reader.position
                opportunistic(self.storage, "group snapshot", lambda: self._write_snapshot(position))
            return dict(self.offsets)

    def pending(self) -> tuple[TxnId, str | None] | None:
        """The open transaction holding back this group's later offset commits, if any (call after
        :meth:`refresh`): its id and transactional id."""
        with self._lock:
            if self._reader is None:
                return None
            state = self._reader.state
            bound = state.read_bound()
            if bound >= state.log.end_offset():
                return None
            for first, ongoing in state.buffer.ongoing.items():
                if first == bound:
                    status = self.store.views.get(ongoing.txn.coordinator).status(ongoing.txn)
                    return ongoing.txn, status.tid if status else None
            return None

    def _write_snapshot(self, position: int) -> None:
        prefix = group_snapshots(self.group)
        value = {
            "group": self.group,
            "position": position,
            "offsets": [
                [o.topic, o.partition, o.offset, o.metadata, o.commit_ms]
                for o in sorted(self.offsets.values(), key=lambda x: (x.topic, x.partition))
            ],
        }
        envelope.create_json(
            self.storage, prefix + paths.slot_name(position), envelope.ObjectKind.GROUP_SNAPSHOT, value
        )
        self._since_snapshot = 0
        names = paths.slot_names(self.storage.list(prefix))
        for name in names[:-GROUP_SNAPSHOTS_KEPT]:
            self.storage.delete(prefix + name)


class GroupStore:
    """Commits and reads group offsets for one log: groups' offsets logs are partition logs of ``states``,
    whose transactions ``views`` name (the transactional id holding a group's offsets back)."""

    def __init__(self, storage: Storage, *, clock: Clock, states: PartitionStates, views: CoordinatorViews) -> None:
        self.storage = storage
        self.clock = clock
        self.states = states
        self.views = views
        self._views: dict[str, GroupView] = {}
        self._lock = threading.Lock()

    def view(self, group: str) -> GroupView:
        validate_name("group", group)
        with self._lock:
            v = self._views.get(group)
            if v is None:
                v = GroupView(self, group)
                self._views[group] = v
            return v

    def offsets_table(
        self, offsets: Mapping[tuple[str, int] | TopicPartition, int], metadata: str | None = None
    ) -> pa.Table:
        """The offsets entry's rows, stamped with the log's clock (``commit_ms``)."""
        if metadata is not None and not isinstance(metadata, str):
            raise ConfigurationError(f"offset metadata must be a string, got {type(metadata).__name__}")
        items = offset_items(offsets)
        topics = [t for t, _p, _o in items]
        parts = [p for _t, p, _o in items]
        offs = [o for _t, _p, o in items]
        now = self.clock()
        return pa.table(
            {
                "topic": topics,
                "partition": pa.array(parts, pa.int32()),
                "offset": pa.array(offs, pa.int64()),
                "metadata": pa.array([metadata] * len(topics), pa.string()),
                "commit_ms": pa.array([now] * len(topics), pa.int64()),
            },
            schema=OFFSETS_SCHEMA,
        )

    def commit(
        self, group: str, offsets: Mapping[tuple[str, int] | TopicPartition, int], metadata: str | None = None
    ) -> None:
        """Commit offsets outside any transaction (visible at once)."""
        validate_name("group", group)
        table = self.offsets_table(offsets, metadata)
        if table.num_rows == 0:
            return
        self.states.logs.get(paths.group_log_path(group)).append_payload(
            EntryKind.DATA, Payload.of_arrow(table.to_batches(), OFFSETS_SCHEMA), table.num_rows
        )

    def committed(
        self, group: str, *, require_stable: bool = False, timeout_s: float = 60.0
    ) -> dict[TopicPartition, GroupOffset]:
        """The group's committed offsets as read_committed readers see them.

        With ``require_stable`` (Kafka's ``require_stable``), waits while a transaction that wrote offsets
        to this group is still open -- its offsets, and any committed after it, are not visible yet --
        and raises :class:`UnstableOffsetsError` naming it after ``timeout_s``. A consumer resuming from
        the group must use it, or it could re-read what that transaction is about to commit.
        """
        view = self.view(group)
        deadline = time.monotonic() + timeout_s
        while True:
            offsets = view.refresh()
            if not require_stable:
                return offsets
            pending = view.pending()
            if pending is None:
                return offsets
            if time.monotonic() >= deadline:
                txn, tid = pending
                raise UnstableOffsetsError(
                    f"group {group!r} has offsets pending in open transaction {txn}"
                    + (f" of transactional id {tid!r}" if tid else "")
                    + f" after waiting {timeout_s:.0f} s; wait for it to commit or time out, or abort it "
                    f"(txnlog transactions abort URL {tid or '...'}), then retry"
                )
            time.sleep(0.1)

    def list(self) -> list[str]:
        return [n.rstrip("/") for n in self.storage.list(paths.GROUPS) if n.endswith("/")]


def offset_items(
    offsets: Mapping[tuple[str, int] | TopicPartition, int], *, what: str = "offsets", least: int = 0
) -> list[tuple[str, int, int]]:
    """``offsets`` as ``(topic, partition, offset)`` triples, each offset at least ``least``;
    :class:`ConfigurationError` (or :class:`InvalidOffsetError` for an offset) naming what is wrong."""
    if not isinstance(offsets, Mapping):
        raise ConfigurationError(
            f"{what} must be a mapping of (topic, partition) to the next offset to read, e.g. {{('orders', 0): 42}}; "
            f"got {type(offsets).__name__}"
        )
    items = []
    for tp, off in offsets.items():
        if isinstance(tp, TopicPartition):
            topic, partition = tp.topic, tp.partition
        elif isinstance(tp, tuple) and len(tp) == 2:
            topic, partition = tp
        else:
            raise ConfigurationError(f"{what} keys must be (topic, partition) pairs or TopicPartitions, got {tp!r}")
        if not isinstance(topic, str):
            raise ConfigurationError(f"bad topic {topic!r} in {what}: topics are named by strings")
        if not is_int(partition) or partition < 0:
            raise ConfigurationError(f"bad partition {partition!r} for topic {topic!r} in {what}")
        if not is_int(off) or off < least:
            raise InvalidOffsetError(
                f"{what}: offset for {topic}-{partition} must be an int of at least {least}, got {off!r}"
            )
        items.append((topic, partition, off))
    return items
