"""The partition-log entry: a fixed 128-byte header followed by a payload (PROTOCOL.md "Entries").

Header layout (little-endian)::

    off size field            meaning
    0   4    magic            b"TXLE"
    4   1    version          1; 2 for a DATA or DATA_REF entry that carries a marker
    5   1    kind             0 DATA, 1 COMMIT marker, 2 ABORT marker, 3 DATA_REF, 4 SEAL
    6   2    flags            bit 0: transactional
    8   2    header_size      128
    10  2    reserved         0
    12  8    base_offset      offset of the first record
    20  4    record_count     records in the entry (1 for a marker)
    24  8    producer_id      -1 when none
    32  4    producer_epoch
    36  4    base_sequence    -1 when none
    40  8    txn_hi           coordinator id | index in its begin record << 32 (0 when not transactional)
    48  8    txn_lo           transaction sequence
    56  8    timestamp_ms     append time, writer's clock
    64  8    payload_len
    72  4    payload_crc      CRC-32C of the payload
    76  16   writer_id        unique per write attempt; resolves unknown outcomes
    92  32   carried marker   zero in version 1; in version 2 the marker the entry carries:
                                 92 u8 kind (1 COMMIT, 2 ABORT), 93 3 zero bytes, 96 i32 epoch,
                                 100 u64 txn_hi, 108 u64 txn_lo, 116 8 zero bytes
    124 4    header_crc       CRC-32C of bytes [0, 124)

A **carried marker** (version 2, PROTOCOL.md "Carried markers") is a COMMIT or ABORT marker of an earlier
transaction of the entry's producer, travelling in the producer's next entry to that partition instead of an
entry of its own: readers apply it before the entry's records, at the entry's base offset (it takes no
offset). A version-1 reader refuses a version-2 header ("upgrade txnlog"), so it never misses the marker.

DATA payload: an Arrow IPC stream (schema + record batches). DATA_REF payload: JSON naming one staged
object (an entry-format DATA object written elsewhere) with its size, payload crc and row count.
Marker payload: JSON ``{"outcome": "COMMIT"|"ABORT", "txn": "C:S"}``. SEAL payload: JSON naming the lost
entry it closes (PROTOCOL.md "Damage").
"""

from __future__ import annotations

import enum
import json
import struct
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from txn_core.errors import CorruptDataError
from txn_core.format.checksum import crc32c
from txn_core.format.ids import TxnId

MAGIC = b"TXLE"
VERSION = 1
#: the version of an entry that carries a marker (:class:`CarriedMarker`)
VERSION_CARRIER = 2
VERSIONS = (VERSION, VERSION_CARRIER)
HEADER_SIZE = 128
_STRUCT = struct.Struct("<4sBBHHHqIqiiQQqQI16s32s")
assert _STRUCT.size == 124
_CRC = struct.Struct("<I")
_CARRIED = struct.Struct("<B3xiQQ8x")
assert _CARRIED.size == 32
_NO_CARRIED = b"\0" * 32
FLAG_TRANSACTIONAL = 1


class EntryKind(enum.IntEnum):
    DATA = 0
    COMMIT = 1
    ABORT = 2
    DATA_REF = 3
    #: closes the offsets of a damaged last entry that an operator marked lost (PROTOCOL.md "Damage")
    SEAL = 4
    #: never stored: the header readers make up for an entry marked lost (its offsets, no records)
    LOST = 255

    @property
    def is_control(self) -> bool:
        return self in (EntryKind.COMMIT, EntryKind.ABORT, EntryKind.SEAL)


@dataclass(frozen=True, slots=True)
class CarriedMarker:
    """The marker of transaction ``txn`` (its outcome, and its producer's epoch) that a data entry carries
    (header version 2). Same producer id as the carrying entry."""

    committed: bool
    txn: TxnId
    epoch: int

    @property
    def kind(self) -> EntryKind:
        return EntryKind.COMMIT if self.committed else EntryKind.ABORT

    def encode(self) -> bytes:
        return _CARRIED.pack(int(self.kind), self.epoch, self.txn.header_hi, self.txn.sequence)


@dataclass(frozen=True, slots=True)
class EntryHeader:
    """A decoded entry header. ``txn`` is None for non-transactional entries; ``carried`` is the marker a
    version-2 data entry carries (applied before its records, at its base offset), else None."""

    kind: EntryKind
    base_offset: int
    record_count: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    txn: TxnId | None
    timestamp_ms: int
    payload_len: int
    payload_crc: int
    writer_id: bytes
    carried: CarriedMarker | None = None

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.record_count

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.record_count - 1

    @property
    def is_control(self) -> bool:
        return self.kind.is_control

    def with_base_offset(self, base_offset: int) -> EntryHeader:
        return EntryHeader(
            self.kind,
            base_offset,
            self.record_count,
            self.producer_id,
            self.producer_epoch,
            self.base_sequence,
            self.txn,
            self.timestamp_ms,
            self.payload_len,
            self.payload_crc,
            self.writer_id,
            self.carried,
        )

    def encode(self) -> bytes:
        txn_hi, txn_lo = (self.txn.header_hi, self.txn.sequence) if self.txn else (0, 0)
        flags = FLAG_TRANSACTIONAL if self.txn is not None else 0
        body = _STRUCT.pack(
            MAGIC,
            VERSION if self.carried is None else VERSION_CARRIER,
            int(self.kind),
            flags,
            HEADER_SIZE,
            0,
            self.base_offset,
            self.record_count,
            self.producer_id,
            self.producer_epoch,
            self.base_sequence,
            txn_hi,
            txn_lo,
            self.timestamp_ms,
            self.payload_len,
            self.payload_crc,
            self.writer_id,
            _NO_CARRIED if self.carried is None else self.carried.encode(),
        )
        return body + _CRC.pack(crc32c(body))


def decode_header(data: Any, key: str) -> EntryHeader:
    """Decode and verify the header at the start of ``data`` (which may hold more than the header).

    Raises :class:`CorruptDataError` naming ``key`` and, as its ``check``, the check that failed."""
    if len(data) < HEADER_SIZE:
        if len(data) >= 4 and bytes(memoryview(data)[:4]) != MAGIC:
            raise _foreign(key, bytes(memoryview(data)[:4]))
        raise CorruptDataError(
            f"{key} is truncated: {len(data)} bytes, shorter than the {HEADER_SIZE}-byte entry header. "
            'The object is damaged; restore it from a replica or mark it lost (PROTOCOL.md "Damage").',
            key,
            f"truncated to {len(data)} bytes, shorter than the {HEADER_SIZE}-byte header",
        )
    body = bytes(memoryview(data)[:124])
    (
        magic,
        version,
        kind,
        flags,
        header_size,
        _r,
        base_offset,
        count,
        pid,
        epoch,
        seq,
        txn_hi,
        txn_lo,
        ts,
        plen,
        pcrc,
        writer_id,
        reserved,
    ) = _STRUCT.unpack(body)
    if magic != MAGIC:
        raise _foreign(key, magic)
    (crc,) = _CRC.unpack(bytes(memoryview(data)[124:128]))
    if crc != crc32c(body):
        check = f"header checksum mismatch (stored {crc:#010x}, computed {crc32c(body):#010x})"
        raise CorruptDataError(f"{key}: entry {check}; the object is corrupt.", key, check)
    if version not in VERSIONS or header_size != HEADER_SIZE:
        raise CorruptDataError(
            f"{key}: entry format version {version} (header {header_size} bytes) is not supported by this "
            f"txnlog (versions {VERSION} and {VERSION_CARRIER}); upgrade txnlog.",
            key,
            f"unsupported entry format version {version}",
        )
    try:
        ekind = EntryKind(kind)
    except ValueError:
        ekind = EntryKind.LOST  # not a kind an entry may have
    if ekind is EntryKind.LOST:
        raise CorruptDataError(f"{key}: unknown entry kind {kind}", key, f"unknown entry kind {kind}")
    txn = TxnId.from_header(txn_hi, txn_lo) if flags & FLAG_TRANSACTIONAL else None
    carried = _carried_marker(ekind, reserved, key) if version == VERSION_CARRIER else None
    return EntryHeader(ekind, base_offset, count, pid, epoch, seq, txn, ts, plen, pcrc, writer_id, carried)


def _carried_marker(kind: EntryKind, reserved: bytes, key: str) -> CarriedMarker:
    """The marker a version-2 header of ``kind`` carries in its 32 reserved bytes."""
    mkind, mepoch, mhi, mlo = _CARRIED.unpack(reserved)
    if reserved[1:4] != b"\0\0\0" or reserved[24:] != b"\0" * 8:
        check = "a carried marker with non-zero padding"
        raise CorruptDataError(f"{key}: {check}; the header is corrupt.", key, check)
    if kind not in (EntryKind.DATA, EntryKind.DATA_REF) or mkind not in (EntryKind.COMMIT, EntryKind.ABORT):
        check = f"a version-2 {kind.name} entry carrying a marker of kind {mkind}"
        raise CorruptDataError(f"{key}: {check}; only data entries carry COMMIT or ABORT markers.", key, check)
    return CarriedMarker(mkind == EntryKind.COMMIT, TxnId.from_header(mhi, mlo), mepoch)


def _foreign(key: str, magic: bytes) -> CorruptDataError:
    return CorruptDataError(
        f"{key} is not a txnlog entry (bad magic {magic!r}); a foreign or damaged object sits in the log. "
        'Move it away, or mark it lost (PROTOCOL.md "Damage"); nothing after it is read until then.',
        key,
        f"bad magic {magic!r}: not a txnlog entry",
    )


def verify_payload(header: EntryHeader, data: Any, key: str) -> memoryview:
    """The payload following the header in ``data``, verified against the header's length and crc."""
    view = memoryview(data)[HEADER_SIZE:]
    if len(view) != header.payload_len:
        raise CorruptDataError(
            f"{key} is truncated: payload has {len(view)} bytes, header says {header.payload_len}. "
            "The object is damaged; nothing after it is read.",
            key,
            f"payload has {len(view)} bytes, header says {header.payload_len}",
        )
    crc = crc32c(view)
    if crc != header.payload_crc:
        check = f"payload checksum mismatch (stored {header.payload_crc:#010x}, computed {crc:#010x})"
        raise CorruptDataError(f"{key}: {check}; the object is corrupt.", key, check)
    return view


def crc32(data: Any) -> int:
    """The payload checksum (CRC-32C; the name predates the switch from zlib's CRC-32)."""
    return crc32c(data)


@dataclass(frozen=True, slots=True)
class Payload:
    """An entry's payload ready to append: its bytes as chunks, its length and its checksum, computed once.

    Built with :meth:`of` (bytes or a buffer), :meth:`of_json` (marker, reference and ack payloads) or
    :meth:`of_arrow` (DATA); appended with :meth:`txn_core.partition.partition.PartitionLog.append_payload`. A retried
    append reuses the same value, so the checksum is never computed twice.
    """

    chunks: tuple[Any, ...]
    length: int
    crc: int

    @classmethod
    def of(cls, data: bytes | memoryview | pa.Buffer) -> Payload:
        view = memoryview(data)
        return cls((view,), len(view), crc32(view))

    @classmethod
    def of_json(cls, value: dict[str, Any]) -> Payload:
        return cls.of(encode_json(value))

    @classmethod
    def of_arrow(cls, batches: list[pa.RecordBatch], schema: pa.Schema) -> Payload:
        return cls.of(encode_arrow(batches, schema))


# --- payload codecs ------------------------------------------------------------------------------


def encode_arrow(batches: list[pa.RecordBatch], schema: pa.Schema) -> pa.Buffer:
    """An Arrow IPC stream of ``batches`` (the DATA payload).

    Sized by a first pass over a mock stream (no copying), then written once into a buffer of exactly
    that size: 4-10x faster than a growing ``BufferOutputStream`` for multi-megabyte entries.
    """
    mock = pa.MockOutputStream()
    with pa.ipc.new_stream(mock, schema) as writer:
        for b in batches:
            writer.write_batch(b)
    buf = pa.allocate_buffer(mock.size())
    with pa.ipc.new_stream(pa.FixedSizeBufferWriter(buf), schema) as writer:
        for b in batches:
            writer.write_batch(b)
    return buf


def decode_arrow(payload: memoryview | bytes | pa.Buffer, key: str) -> pa.Table:
    """Decode a DATA payload into a table (zero-copy over ``payload``)."""
    try:
        buf = payload if isinstance(payload, pa.Buffer) else pa.py_buffer(payload)
        return pa.ipc.open_stream(buf).read_all()
    except (pa.ArrowInvalid, pa.ArrowException) as exc:
        raise CorruptDataError(f"{key}: payload is not a valid Arrow IPC stream: {exc}", key) from exc


def encode_json(value: dict[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()


def decode_json(payload: memoryview | bytes, key: str) -> dict[str, Any]:
    try:
        value = json.loads(bytes(payload))
    except ValueError as exc:
        raise CorruptDataError(f"{key}: payload is not valid JSON: {exc}", key) from exc
    if not isinstance(value, dict):
        raise CorruptDataError(f"{key}: payload is not a JSON object", key)
    return value
