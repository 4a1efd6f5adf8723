"""The write side, run by every Spark task: Arrow batches in, staged objects out, references returned.

A task conforms each incoming ``pyarrow.RecordBatch`` to the topic schema, routes its rows to partitions
(by a stable hash of ``keyColumn``; without one, to a current partition, starting at the task's Spark
partition and moving to the next one each time a staged object is written), and buffers them per
partition. Without a key a task thus writes as few objects as its size allows, spread over partitions.
A partition's buffer is written as one staged object (:func:`txn_core.partition.staging.write_staged`) when it
reaches ``object_bytes``; when all buffers together reach ``buffer_bytes`` the largest is written.
Objects are written by one background thread while the task keeps reading its input, with at most one
object in flight. Memory is therefore bounded by ``buffer_bytes``, plus the object being written, plus
one routing group (``ROUTE_BYTES``, plus one incoming batch), whatever the partition size.

Nothing a task writes is visible: staged objects become data only when the driver commits references
to them. A failed or duplicate attempt leaves objects no commit names; they are garbage (see
:mod:`spark_txn_sink.commit` for who deletes them).
"""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from txn_core.clients.routing import split_by_key
from txn_core.clock import system_clock
from txn_core.errors import SchemaMismatchError
from txn_core.format.schema import conform
from txn_core.partition.staging import StagedRef, write_staged
from txn_core.storage.base import Storage

DEFAULT_OBJECT_BYTES = 32 << 20
DEFAULT_BUFFER_BYTES = 64 << 20
#: With a key, rows are routed in groups of this many rows (or bytes), not per incoming batch.
ROUTE_ROWS = 65_536
ROUTE_BYTES = 8 << 20


@dataclass(frozen=True, slots=True)
class TopicTarget:
    """Where and how a task writes: everything a task needs, picklable. ``ignored_columns`` are the frame's
    columns the tasks drop: the txnlog source's metadata columns when the plan found the frame carries them
    all (:func:`spark_txn_sink.topic.ignored_columns`), else none; any other column reaches the topic or fails."""

    url: str
    storage_items: tuple[tuple[str, Any], ...]
    topic: str
    schema: pa.Schema
    partitions: int
    key_column: str | None
    object_bytes: int = DEFAULT_OBJECT_BYTES
    buffer_bytes: int = DEFAULT_BUFFER_BYTES
    ignored_columns: tuple[str, ...] = ()

    def open_storage(self) -> Storage:
        from txn_core.storage import open_storage

        return open_storage(self.url, dict(self.storage_items) if self.storage_items else None)


def align_timestamps(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """Relabel time-zone-aware timestamps with the topic's zone, at any depth: top-level columns and
    timestamps inside structs, lists and maps; and give a naive topic column the wall-clock time Spark's own
    cast gives.

    Spark labels instants with the session time zone (``Etc/UTC``, ``Europe/Paris``...), nested ones
    included (a ``window()`` column is ``struct<start, end>``); the values are UTC instants either way, so
    relabelling changes metadata only, whatever the units: a topic written by pandas (``timestamp[ns, tz=UTC]``)
    or with another label (``Europe/Paris``) takes Spark's microseconds, which conform then casts exactly.

    Between an instant and a wall-clock time (Spark's ``timestamp`` and ``timestamp_ntz``) Spark converts in
    the session time zone. An instant written into a naive topic column becomes its wall-clock time in the
    zone Spark labelled it with (the session's), as ``CAST(t AS TIMESTAMP_NTZ)`` gives. A wall-clock time
    written into an instant column, or an instant into a naive column nested in a struct, list or map, is
    refused (:class:`SchemaMismatchError` naming the column and the cast that writes it): the conversion
    needs the session zone, which a naive value does not carry. Columns whose shape differs from the topic's
    otherwise are left for :func:`txn_core.format.schema.conform` to report.
    """
    fixes: dict[int, pa.DataType] = {}
    for i, field in enumerate(batch.schema):
        if field.name not in schema.names:
            continue
        target = schema.field(field.name).type
        if _to_wall_clock(field.type, target):
            fixes[i] = target  # its local time, below
            continue
        aligned = _aligned_type(field.type, target, field.name)
        if aligned != field.type:
            fixes[i] = aligned
    if not fixes:
        return batch
    arrays = [
        _aligned_column(batch.column(i), fixes[i]) if i in fixes else batch.column(i) for i in range(batch.num_columns)
    ]
    fields = [pa.field(f.name, fixes[i], f.nullable) if i in fixes else f for i, f in enumerate(batch.schema)]
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))


def _is_timestamp(t: pa.DataType) -> bool:
    return bool(pa.types.is_timestamp(t))


def _to_wall_clock(given: pa.DataType, target: pa.DataType) -> bool:
    """Whether ``given`` is an instant (an aware timestamp) written into a wall-clock (naive) ``target``."""
    return _is_timestamp(given) and given.tz is not None and _is_timestamp(target) and target.tz is None


def _aligned_column(column: pa.Array, target: pa.DataType) -> pa.Array:
    """``column`` as ``target``: an aware column into a naive one as its wall-clock time in its own zone (the
    unit is left for conform's exact cast); else relabelled by a cast."""
    if _to_wall_clock(column.type, target):
        return pc.local_timestamp(column)
    return column.cast(target)


def _zone_mismatch(name: str, given: pa.DataType, target: pa.DataType) -> SchemaMismatchError:
    kinds = {True: "timestamp_ntz (a wall-clock time)", False: "timestamp (an instant)"}
    cast = "timestamp" if target.tz is not None else "timestamp_ntz"
    diff = f"column {name!r} is {kinds[given.tz is None]}, the topic's is {kinds[target.tz is None]}"
    return SchemaMismatchError(
        f"{diff}: Spark converts between them in the session time zone; cast the column in Spark first, e.g. "
        f"df.withColumn({name!r}, F.col({name!r}).cast({cast!r})) or CAST({name} AS {cast.upper()}) in SQL",
        (diff,),
    )


def _aligned_type(given: pa.DataType, target: pa.DataType, name: str) -> pa.DataType:
    """``given`` (the column ``name``, or a part of it) with every aware timestamp relabelled to the zone of
    its counterpart in ``target``. An aware timestamp against a naive one, either way, is refused here: the
    top-level column that converts is handled by :func:`align_timestamps` before it comes here."""
    if pa.types.is_timestamp(given):
        if not pa.types.is_timestamp(target):
            return given  # conform reports the type
        if (given.tz is None) != (target.tz is None):
            raise _zone_mismatch(name, given, target)
        if given.tz is None:
            return given  # the unit is the cast's (conform): exact, or refused naming the value
        return given if target.tz == given.tz else pa.timestamp(given.unit, target.tz)
    if pa.types.is_struct(given) and pa.types.is_struct(target):
        names = {target.field(j).name: target.field(j) for j in range(target.num_fields)}
        children = []
        for j in range(given.num_fields):
            g = given.field(j)
            t = names.get(g.name)
            children.append(g if t is None else g.with_type(_aligned_type(g.type, t.type, f"{name}.{g.name}")))
        return pa.struct(children)
    if pa.types.is_map(given) and pa.types.is_map(target):
        key = _aligned_type(given.key_type, target.key_type, f"{name}.key")
        item = given.item_field.with_type(_aligned_type(given.item_type, target.item_type, f"{name}.value"))
        return pa.map_(key, item, keys_sorted=given.keys_sorted)
    for is_list, make in ((pa.types.is_list, pa.list_), (pa.types.is_large_list, pa.large_list)):
        if is_list(given) and (
            pa.types.is_list(target) or pa.types.is_large_list(target) or pa.types.is_fixed_size_list(target)
        ):
            value = given.value_field.with_type(_aligned_type(given.value_type, target.value_type, f"{name}.element"))
            return make(value)
    return given


class PartitionStager:
    """Buffers one task's rows per target partition and writes them as staged objects (module doc)."""

    def __init__(self, target: TopicTarget, storage: Storage, prefix: str, tag: str, start: int) -> None:
        self.target = target
        self.storage = storage
        self.prefix = prefix
        self.tag = tag
        self._next = start
        self._buffers: dict[int, list[pa.RecordBatch]] = {}
        self._sizes: dict[int, int] = {}
        self._total = 0
        self.refs: list[StagedRef] = []
        self._pending: list[pa.Table] = []
        self._writer: ThreadPoolExecutor | None = None
        self._inflight: Future[StagedRef | None] | None = None
        self._pending_rows = 0
        self._pending_bytes = 0

    def add(self, batch: pa.RecordBatch) -> None:
        """Conform, route and buffer one batch (may write staged objects).

        With a key, incoming batches are first gathered up to ``ROUTE_ROWS`` rows (or ``ROUTE_BYTES``) and
        routed together: hashing and sorting cost per call, and Spark hands over batches of 10k rows.
        """
        t = self.target
        drop = [c for c in t.ignored_columns if c in batch.schema.names]
        if drop:
            batch = batch.drop_columns(drop)
        if batch.num_rows == 0:
            return
        table = conform(align_timestamps(batch, t.schema), t.schema, topic=t.topic)
        if t.key_column is None:
            self._route({self._next % t.partitions: table})
            return
        self._pending.append(table)
        self._pending_rows += table.num_rows
        self._pending_bytes += table.nbytes
        if self._pending_rows >= ROUTE_ROWS or self._pending_bytes >= ROUTE_BYTES:
            self._route_pending()

    def _route_pending(self) -> None:
        if not self._pending:
            return
        t = self.target
        table = pa.concat_tables(self._pending) if len(self._pending) > 1 else self._pending[0]
        self._pending, self._pending_rows, self._pending_bytes = [], 0, 0
        self._route(split_by_key(table, t.key_column or "", t.partitions))

    def _route(self, routed: dict[int, pa.Table]) -> None:
        for p, part in routed.items():
            for b in part.to_batches():
                if b.num_rows:
                    self._buffer(p, b)

    def _buffer(self, partition: int, batch: pa.RecordBatch) -> None:
        self._buffers.setdefault(partition, []).append(batch)
        size = batch.nbytes
        self._sizes[partition] = self._sizes.get(partition, 0) + size
        self._total += size
        if self._sizes[partition] >= self.target.object_bytes:
            self._write(partition)
        while self._total >= self.target.buffer_bytes and self._sizes:
            self._write(max(self._sizes, key=lambda p: self._sizes[p]))

    def _write(self, partition: int) -> None:
        """Hand one partition's buffer to the background writer (at most one object in flight)."""
        batches = self._buffers.pop(partition)
        self._total -= self._sizes.pop(partition)
        self._collect()
        if self._writer is None:
            self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="txnlog-stager")
        t = self.target
        self._inflight = self._writer.submit(
            write_staged,
            self.storage,
            self.prefix,
            t.topic,
            partition,
            batches,
            t.schema,
            tag=self.tag,
            clock=system_clock,  # a task has no Log: the executor's wall clock stamps what it stages
        )
        if t.key_column is None and partition == self._next % t.partitions:
            self._next += 1  # without a key, each staged object goes to the next partition

    def _collect(self) -> None:
        """Wait for the object in flight and record its reference (re-raises its error)."""
        if self._inflight is not None:
            future, self._inflight = self._inflight, None
            ref = future.result()
            if ref is not None:
                self.refs.append(ref)

    def finish(self) -> list[StagedRef]:
        """Write every remaining buffer; the refs of everything this task staged, in write order."""
        self._route_pending()
        for p in sorted(self._buffers):
            self._write(p)
        self._collect()
        self.close()
        return self.refs

    def close(self) -> None:
        """Stop the background writer (waits for an object in flight)."""
        if self._writer is not None:
            self._writer.shutdown(wait=True)
            self._writer = None

    def stage_all(self, batches: Iterable[pa.RecordBatch]) -> list[StagedRef]:
        try:
            for b in batches:
                self.add(b)
            return self.finish()
        finally:
            self.close()
