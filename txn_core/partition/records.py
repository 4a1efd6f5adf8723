"""Turning entries into Arrow record batches with metadata columns (PROTOCOL.md "Reading").

The hot path of every reader: decode an entry's Arrow IPC payload zero-copy, slice it to the wanted
offsets, and append ``_topic``, ``_partition``, ``_offset`` and ``_timestamp`` built with numpy, never
with a Python object per row. ``DATA_REF`` entries are resolved here: the referenced staged object is
read and verified against the size, checksum and row count the reference records; an entry read from a
segment has them inlined (PROTOCOL.md "Segments"), and a loose reference whose staged object is gone
because its slot was rolled is re-read from the segment.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from txn_core.errors import ConfigurationError, CorruptDataError, ObjectNotFoundError
from txn_core.format.arrays import from_numpy
from txn_core.format.entry import EntryKind, decode_arrow, decode_header, decode_json, verify_payload
from txn_core.format.segment import Inlined
from txn_core.partition.partition import Entry
from txn_core.storage.base import Storage

#: The ``_timestamp`` type (made once: building a time-zone-aware type costs more than a column of one row).
TIMESTAMP = pa.timestamp("ms", tz="UTC")
METADATA_FIELDS = [
    pa.field("_topic", pa.string(), nullable=False),
    pa.field("_partition", pa.int32(), nullable=False),
    pa.field("_offset", pa.int64(), nullable=False),
    pa.field("_timestamp", TIMESTAMP, nullable=False),
]


#: Consecutive small parts are merged into batches of at most this many bytes (:meth:`MetadataColumns.add_many`).
MAX_MERGED_BYTES = 4 << 20

#: How many of a timestamp unit make one millisecond (the units an entry's append time converts to exactly).
_PER_MS = {"ms": 1, "us": 1_000, "ns": 1_000_000}


def with_metadata_schema(schema: pa.Schema, fields: Sequence[pa.Field] = METADATA_FIELDS) -> pa.Schema:
    return pa.schema([*schema, *fields])


def buildable_metadata_field(field: pa.Field) -> bool:
    """Whether :class:`MetadataColumns` can build ``field`` directly: a metadata column of txnlog's own type
    (nullable or not), or ``_timestamp`` as a UTC timestamp of a unit milliseconds convert to exactly."""
    own = {f.name: f.type for f in METADATA_FIELDS}.get(field.name)
    if own is None:
        return False
    if field.name != "_timestamp":
        return bool(field.type == own)
    t = field.type
    return pa.types.is_timestamp(t) and t.unit in _PER_MS and t.tz == own.tz


def constant_string(value: str, n: int) -> pa.Array:
    """``n`` copies of ``value`` as a plain string array, built from two buffers."""
    raw = value.encode()
    offsets = np.arange(n + 1, dtype=np.int32) * len(raw)
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(raw * n))


class MetadataColumns:
    """Builds the metadata columns of one partition; constant columns are sliced from cached arrays.

    ``fields`` are :data:`METADATA_FIELDS` or, for a reader that hands batches to an engine with its own
    schema (Spark wants nullable fields and microseconds), replacements for which
    :func:`buildable_metadata_field` holds: the columns are then built in those types, never cast.
    """

    __slots__ = ("_partition", "_per_ms", "_schemas", "_timestamp_type", "_topic", "fields", "partition", "topic")

    def __init__(self, topic: str, partition: int, fields: Sequence[pa.Field] = METADATA_FIELDS) -> None:
        if [f.name for f in fields] != [f.name for f in METADATA_FIELDS] or not all(
            map(buildable_metadata_field, fields)
        ):
            raise ConfigurationError(f"metadata fields must be {METADATA_FIELDS} or buildable replacements: {fields}")
        self.topic = topic
        self.partition = partition
        self.fields = list(fields)
        self._timestamp_type = fields[3].type
        self._per_ms = _PER_MS[self._timestamp_type.unit]
        self._topic = constant_string(topic, 0)
        self._partition = from_numpy(np.empty(0, dtype=np.int32))
        self._schemas: tuple[pa.Schema, pa.Schema] | None = None  # the last schema and its with metadata

    def _grow(self, n: int) -> None:
        size = max(n, 2 * len(self._topic), 1024)
        self._topic = constant_string(self.topic, size)
        self._partition = from_numpy(np.full(size, self.partition, dtype=np.int32))

    def columns(self, n: int, first_offset: int, timestamp_ms: int) -> list[pa.Array]:
        if n > len(self._topic):
            self._grow(n)
        return [
            self._topic.slice(0, n),
            self._partition.slice(0, n),
            from_numpy(np.arange(first_offset, first_offset + n, dtype=np.int64)),
            from_numpy(np.full(n, timestamp_ms * self._per_ms, dtype=np.int64)).view(self._timestamp_type),
        ]

    def add(self, batch: pa.RecordBatch, first_offset: int, timestamp_ms: int) -> pa.RecordBatch:
        cols = self.columns(batch.num_rows, first_offset, timestamp_ms)
        cached = self._schemas
        if cached is None or not cached[0].equals(batch.schema, check_metadata=True):
            cached = self._schemas = (batch.schema, with_metadata_schema(batch.schema, self.fields))
        return pa.RecordBatch.from_arrays([*batch.columns, *cols], schema=cached[1])

    def add_many(self, parts: Sequence[tuple[pa.RecordBatch, int, int] | pa.RecordBatch]) -> list[pa.RecordBatch]:
        """``parts`` (records, first offset, append time), in offset order, with metadata columns; a part
        that is a batch has them already (:meth:`add_run`) and is handed out as it is.

        Consecutive small parts of one schema become one batch (their columns concatenated, up to
        :data:`MAX_MERGED_BYTES`): a reader of one-row transactions hands out a few large batches, not one
        per transaction, and builds the metadata columns of all of them at once. A large part is handed out
        as it is (no copy)."""
        out: list[pa.RecordBatch] = []
        group: list[tuple[pa.RecordBatch, int, int]] = []
        size = 0
        schema = None
        for part in parts:
            if isinstance(part, pa.RecordBatch):
                if group:
                    out.append(self._merged(group))
                    group, size = [], 0
                out.append(part)
                continue
            batch = part[0]
            nbytes = batch.get_total_buffer_size()  # a slice counts its whole buffers: handed out alone (no copy)
            same = batch.schema is schema or (schema is not None and schema.equals(batch.schema))
            if group and (size + nbytes > MAX_MERGED_BYTES or not same):
                out.append(self._merged(group))
                group, size = [], 0
            group.append(part)
            size += nbytes
            schema = batch.schema
        if group:
            out.append(self._merged(group))
        return out

    def _merged(self, group: list[tuple[pa.RecordBatch, int, int]]) -> pa.RecordBatch:
        if len(group) == 1:
            return self.add(*group[0])
        batches = [b for b, _, _ in group]
        counts = np.fromiter((b.num_rows for b in batches), dtype=np.int64, count=len(batches))
        firsts = np.fromiter((f for _, f, _ in group), dtype=np.int64, count=len(group))
        times = np.fromiter((t for _, _, t in group), dtype=np.int64, count=len(group))
        return self.add_run(batches, firsts, counts, times)

    def add_run(
        self, batches: list[pa.RecordBatch], firsts: np.ndarray, counts: np.ndarray, times: np.ndarray
    ) -> pa.RecordBatch:
        """``batches`` (one schema, ``counts[i]`` rows in the i-th) as one batch with metadata columns, built
        at once: the i-th batch's rows are at offsets from ``firsts[i]``, appended at ``times[i]`` (ms)."""
        n = int(counts.sum())
        starts = np.cumsum(counts) - counts
        if n > len(self._topic):
            self._grow(n)
        offsets = np.repeat(firsts - starts, counts) + np.arange(n, dtype=np.int64)
        stamps = np.repeat(times * self._per_ms, counts)
        merged = pa.Table.from_batches(batches).combine_chunks().to_batches()
        cols = merged[0].columns if merged else batches[0].slice(0, 0).columns
        schema = batches[0].schema
        cached = self._schemas
        if cached is None or not cached[0].equals(schema, check_metadata=True):
            cached = self._schemas = (schema, with_metadata_schema(schema, self.fields))
        meta = [
            self._topic.slice(0, n),
            self._partition.slice(0, n),
            from_numpy(offsets),
            from_numpy(stamps).view(self._timestamp_type),
        ]
        return pa.RecordBatch.from_arrays([*cols, *meta], schema=cached[1])


def add_metadata(
    table: pa.Table | pa.RecordBatch, topic: str, partition: int, first_offset: int, timestamp_ms: int
) -> pa.RecordBatch | pa.Table:
    cols = MetadataColumns(topic, partition).columns(table.num_rows, first_offset, timestamp_ms)
    schema = with_metadata_schema(table.schema)
    if isinstance(table, pa.RecordBatch):
        return pa.RecordBatch.from_arrays([*table.columns, *cols], schema=schema)
    return pa.Table.from_arrays([*table.columns, *cols], schema=schema)


def entry_table(storage: Storage, entry: Entry) -> pa.Table:
    """The records of a DATA or DATA_REF entry as a table (checksums verified)."""
    payload = entry.payload()
    if entry.header.kind == EntryKind.DATA:
        table = decode_arrow(payload, entry.key)
    elif entry.header.kind == EntryKind.DATA_REF:
        table = _referenced_rows(storage, entry, decode_json(payload, entry.key))
    else:
        raise CorruptDataError(f"{entry.key}: a {entry.header.kind.name} entry has no records", entry.key)
    if table.num_rows != entry.header.record_count:
        raise CorruptDataError(
            f"{entry.key}: payload holds {table.num_rows} records, header says {entry.header.record_count}", entry.key
        )
    return table


class StagedDataMissingError(CorruptDataError):
    """A DATA_REF entry's staged object does not exist. Expected only for aborted transactions, whose
    staged objects cleanup may delete (read_uncommitted readers then skip them); otherwise corruption."""


def _referenced_rows(storage: Storage, entry: Entry, ref: dict[str, Any]) -> pa.Table:
    """The rows of a DATA_REF: inlined by its segment, else read from its staged object (re-read from a
    segment when the staged object is gone because the slot was rolled meanwhile)."""
    if entry.inlined is not None:
        return _inlined_rows(entry.inlined, entry.key)
    try:
        return _resolve_ref(storage, ref, entry.key)
    except StagedDataMissingError:
        rolled = entry.source.rolled_entry(entry.slot) if entry.source is not None else None
        if rolled is None or rolled.inlined is None or rolled.header != entry.header:
            raise
        return _inlined_rows(rolled.inlined, rolled.key)


def _inlined_rows(inlined: Inlined, key: str) -> pa.Table:
    if inlined.data is None:
        raise StagedDataMissingError(
            f"{key}: the rows of this reference (an aborted transaction's, or a skipped write's) were "
            "dropped when the partition was rolled into a segment; no read_committed reader delivers them",
            key,
        )
    return decode_arrow(inlined.payload(), key)


def _resolve_ref(storage: Storage, ref: dict[str, Any], key: str) -> pa.Table:
    target = str(ref["key"])
    try:
        data = storage.read(target)
    except ObjectNotFoundError as exc:
        raise StagedDataMissingError(
            f"{key} references {target}, which does not exist (deleted by hand or by a faulty cleanup)", target
        ) from exc
    header = decode_header(data, target)
    if header.payload_crc != int(ref["crc"]) or len(data) != int(ref["size"]):
        raise CorruptDataError(f"{target} does not match the reference in {key} (size or checksum)", target)
    return decode_arrow(verify_payload(header, data, target), target)


def iter_record_batches(table: pa.Table, start: int, stop: int) -> Iterator[pa.RecordBatch]:
    """Record batches of rows ``[start, stop)`` of ``table`` (zero-copy slices)."""
    for batch in table.slice(start, stop - start).to_batches():
        if batch.num_rows:
            yield batch
