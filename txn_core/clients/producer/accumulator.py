"""Buffering and batching of a producer's data, per partition log (Kafka's RecordAccumulator), and the
routing of rows to partitions.

:class:`RecordAccumulator` routes each table sent to a topic to its partitions (an explicit partition, a
stable hash of a key column, else one partition per call in round-robin) and checks staged references
against the topics' partition counts (PROTOCOL.md "Staged data"). Tables sent to one partition log wait in
its :class:`PartitionBuffer` until the buffer reaches the producer's batch size, a flush, or a commit; then
they leave in entries of at most :data:`MAX_ENTRY_BYTES` each, written by the
:class:`~txn_core.clients.producer.sender.Sender`. Taking a table out is O(1) (a deque), so a buffer of many
small sends drains in time linear in its tables.

An entry whose append has an unknown outcome stays **in flight** (:class:`InFlight`): the same writer id
and payload are appended again before anything else of that partition log, so the partition log
resolves the earlier attempt instead of writing the data twice (PROTOCOL.md "Idempotence"). Nothing here
is durable: a crash loses what is buffered, which nobody needs (PROTOCOL.md "Recovery", "before begin").

Locking: none of its own. The thread holding the producer's lock adds and routes; the Sender's pool
threads drain the buffers of a write while that thread waits, one partition log's buffer per thread.
"""

from __future__ import annotations

import itertools
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow as pa

from txn_core.clients.routing import split_by_key
from txn_core.errors import ConfigurationError
from txn_core.format import paths
from txn_core.format.entry import Payload
from txn_core.format.ids import is_int

if TYPE_CHECKING:
    from txn_core.clients.producer.carried import Offer
    from txn_core.clients.topics import TopicMeta, TopicStore
    from txn_core.partition.staging import StagedRef

DEFAULT_BATCH_BYTES = 4 << 20
MAX_ENTRY_BYTES = 64 << 20


@dataclass(frozen=True, slots=True)
class InFlight:
    """An append that was attempted and whose outcome is not known yet."""

    writer_id: bytes
    payload: Payload
    rows: int
    #: the base sequence it carries (-1 for entries without a sequence)
    sequence: int
    #: the marker of an earlier transaction it carries (PROTOCOL.md "Carried markers"), kept across retries
    carried: Offer | None = None


@dataclass
class PartitionBuffer:
    """Data buffered for one partition log, and the append in flight there (if any)."""

    tables: deque[pa.Table] = field(default_factory=deque)
    nbytes: int = 0
    rows: int = 0
    inflight: InFlight | None = None

    def add(self, table: pa.Table) -> None:
        self.tables.append(table)
        self.nbytes += table.nbytes
        self.rows += table.num_rows

    @property
    def pending(self) -> bool:
        """Whether anything waits to be written: buffered tables or an append in flight."""
        return bool(self.tables) or self.inflight is not None

    def take(self, max_bytes: int) -> list[pa.Table]:
        """The next entry's tables: at least one, then as many as fit in ``max_bytes``. O(1) per table."""
        tables: list[pa.Table] = []
        nbytes = 0
        queue = self.tables
        while queue and (not tables or nbytes + queue[0].nbytes <= max_bytes):
            t = queue.popleft()
            tables.append(t)
            nbytes += t.nbytes
        self.nbytes -= nbytes
        self.rows -= sum(t.num_rows for t in tables)
        return tables

    def next_entry(self, max_bytes: int, sequence: int, carry: Callable[[], Offer | None] | None = None) -> InFlight:
        """Encode the next entry's tables as one payload and put it in flight with a fresh writer id, carrying
        the marker ``carry()`` offers, if any (asked once the payload is encoded: an encoding error takes
        no marker)."""
        tables = self.take(max_bytes)
        batches = [b for t in tables for b in t.to_batches() if b.num_rows]
        payload = Payload.of_arrow(batches, tables[0].schema)
        carried = carry() if carry is not None else None
        self.inflight = InFlight(uuid.uuid4().bytes, payload, sum(t.num_rows for t in tables), sequence, carried)
        return self.inflight

    def clear(self) -> None:
        """Drop everything buffered and the append in flight (its carried marker is then written alone)."""
        self.tables.clear()
        self.nbytes = self.rows = 0
        if self.inflight is not None and self.inflight.carried is not None:
            self.inflight.carried.release()
        self.inflight = None


class RecordAccumulator:
    """A producer's buffers, one per partition log it sends to, and the routing that fills them."""

    def __init__(self, topics: TopicStore, batch_bytes: int) -> None:
        self._topics = topics
        #: a partition log's buffer counts as full, to be written, at this many bytes
        self.batch_bytes = batch_bytes
        self.buffers: dict[str, PartitionBuffer] = {}
        #: topics whose metadata was read (the first use of a topic reads it fresh, later ones from the cache)
        self._seen: set[str] = set()
        self._rr = itertools.count()

    def topic(self, name: str) -> TopicMeta:
        """The metadata of topic ``name``, read fresh on its first use."""
        meta = self._topics.get(name, refresh=name not in self._seen)
        self._seen.add(name)
        return meta

    def route(
        self, meta: TopicMeta, table: pa.Table, partition: int | None, key_column: str | None
    ) -> dict[str, pa.Table]:
        """``table``'s rows by partition log path: all to ``partition`` if given, else by a stable hash of
        ``key_column``, else all to one partition per call in round-robin."""
        if partition is not None:
            if not is_int(partition):
                raise ConfigurationError(
                    f"partition must be an int, got {partition!r} ({type(partition).__name__}): pass e.g. "
                    f"partition=0 (topic {meta.name!r} has partitions 0..{meta.partitions - 1})"
                )
            if not 0 <= partition < meta.partitions:
                meta = self._topics.get(meta.name)
                if not 0 <= partition < meta.partitions:
                    raise ConfigurationError(
                        f"partition {partition!r} does not exist in topic {meta.name!r} "
                        f"(partitions 0..{meta.partitions - 1})"
                    )
            routed = {partition: table}
        elif key_column is not None:
            routed = split_by_key(table, key_column, meta.partitions)
        else:
            routed = {next(self._rr) % meta.partitions: table}
        return {paths.partition_log_path(meta.name, p): part for p, part in routed.items()}

    def staged(self, refs: list[StagedRef]) -> dict[str, list[StagedRef]]:
        """Staged references by partition log path, in list order, each checked against its topic's
        partition count."""
        by_path: dict[str, list[StagedRef]] = {}
        for ref in refs:
            meta = self.topic(ref.topic)
            if not 0 <= ref.partition < meta.partitions:
                raise ConfigurationError(
                    f"staged data for partition {ref.partition} of topic {ref.topic!r}, "
                    f"which has {meta.partitions} partitions"
                )
            by_path.setdefault(paths.partition_log_path(ref.topic, ref.partition), []).append(ref)
        return by_path

    def add(self, path: str, table: pa.Table) -> PartitionBuffer | None:
        """Buffer ``table`` for ``path``; returns the buffer if that filled it (to be written now)."""
        buffer = self.buffers.setdefault(path, PartitionBuffer())
        buffer.add(table)
        return buffer if buffer.nbytes >= self.batch_bytes else None

    def pending(self) -> dict[str, PartitionBuffer]:
        """The buffers with something to write: buffered tables or an append in flight."""
        return {p: b for p, b in self.buffers.items() if b.pending}

    def inflight(self) -> dict[str, PartitionBuffer]:
        """The buffers with an append in flight."""
        return {p: b for p, b in self.buffers.items() if b.inflight is not None}

    def clear(self) -> None:
        """Drop every buffer, appends in flight included (a new or aborted transaction)."""
        for buffer in self.buffers.values():
            buffer.clear()
        self.buffers.clear()
