"""Buffering and batching of a producer's data, per partition log (Kafka's RecordAccumulator).

Tables sent to one partition log wait in its :class:`PartitionBuffer` until the buffer reaches the
producer's batch size, a flush, or a commit; then they leave in entries of at most ``max_entry_bytes``
each. Taking a table out is O(1) (a deque), so a buffer of many small sends drains in time linear in
its tables.

An entry whose append has an unknown outcome stays **in flight** (:class:`InFlight`): the same writer id
and payload are appended again before anything else of that partition log, so the partition log
resolves the earlier attempt instead of writing the data twice (PROTOCOL.md "Idempotence").
"""

from __future__ import annotations

import uuid
from collections import deque
from dataclasses import dataclass, field

import pyarrow as pa

from txn_core.format.entry import Payload


@dataclass(frozen=True, slots=True)
class InFlight:
    """An append that was attempted and whose outcome is not known yet."""

    writer_id: bytes
    payload: Payload
    rows: int
    #: the base sequence it carries (-1 for entries without a sequence)
    sequence: int


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

    def next_entry(self, max_bytes: int, sequence: int) -> InFlight:
        """Encode the next entry's tables as one payload and put it in flight with a fresh writer id."""
        tables = self.take(max_bytes)
        batches = [b for t in tables for b in t.to_batches() if b.num_rows]
        payload = Payload.of_arrow(batches, tables[0].schema)
        self.inflight = InFlight(uuid.uuid4().bytes, payload, sum(t.num_rows for t in tables), sequence)
        return self.inflight

    def clear(self) -> None:
        self.tables.clear()
        self.nbytes = self.rows = 0
        self.inflight = None
