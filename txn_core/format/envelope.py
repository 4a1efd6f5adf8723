"""The envelope of every txnlog object that is not a partition entry (PROTOCOL.md "Envelope").

Layout (little-endian, 40 bytes, then the payload)::

    off size field         meaning
    0   4    magic         b"TXLO"
    4   1    version       1
    5   1    kind          ObjectKind
    6   2    flags         bit 0: payload is Arrow IPC (else JSON)
    8   16   writer_id     unique per write; resolves unknown outcomes
    24  8    payload_len
    32  4    payload_crc   CRC-32C of the payload
    36  4    header_crc    CRC-32C of bytes [0, 36)

The writer id is in the first 24 bytes, so ``create_resolving`` compares the whole 40-byte header.
"""

from __future__ import annotations

import enum
import json
import struct
import uuid
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from txn_core.errors import CorruptDataError, ObjectExistsError
from txn_core.format.checksum import crc32c
from txn_core.storage.base import Storage, create_resolving

MAGIC = b"TXLO"
VERSION = 1
_STRUCT = struct.Struct("<4sBBH16sQI")
_CRC = struct.Struct("<I")
HEADER_SIZE = _STRUCT.size + _CRC.size
FLAG_ARROW = 1


class ObjectKind(enum.IntEnum):
    FORMAT = 1
    TOPIC_META = 2
    COORDINATOR_RECORD = 3
    COORDINATOR_SNAPSHOT = 4
    PRODUCER_ID_BLOCK = 5
    BUFFER_SNAPSHOT = 6
    BUFFER_SNAPSHOT_PART = 7
    LOG_START = 8
    SEGMENT_INDEX = 9  # reserved, never written: a segment carries its index inside (PROTOCOL.md "Segments")
    SUBSCRIPTION = 10
    GROUP_SNAPSHOT = 11
    OFFSETS_CLAIM = 12
    LOST_ENTRY = 13


@dataclass(frozen=True, slots=True)
class Envelope:
    kind: ObjectKind
    writer_id: bytes
    payload: memoryview
    is_arrow: bool

    def json(self, key: str) -> dict[str, Any]:
        try:
            value = json.loads(bytes(self.payload))
        except ValueError as exc:
            raise CorruptDataError(f"{key}: payload is not valid JSON: {exc}", key) from exc
        if not isinstance(value, dict):
            raise CorruptDataError(f"{key}: payload is not a JSON object", key)
        return value

    def arrow(self, key: str) -> pa.Table:
        try:
            return pa.ipc.open_stream(pa.py_buffer(self.payload)).read_all()
        except pa.ArrowException as exc:
            raise CorruptDataError(f"{key}: payload is not a valid Arrow IPC stream: {exc}", key) from exc


def encode(
    kind: ObjectKind, payload: bytes | pa.Buffer, *, is_arrow: bool = False, writer_id: bytes | None = None
) -> tuple[bytes, bytes | pa.Buffer]:
    """Header and payload of a new object. The header is unique (fresh writer id unless given)."""
    wid = writer_id or uuid.uuid4().bytes
    view = memoryview(payload)
    body = _STRUCT.pack(MAGIC, VERSION, int(kind), FLAG_ARROW if is_arrow else 0, wid, len(view), crc32c(view))
    return body + _CRC.pack(crc32c(body)), payload


def encode_json(kind: ObjectKind, value: dict[str, Any]) -> tuple[bytes, bytes]:
    payload = json.dumps(value, separators=(",", ":"), sort_keys=True).encode()
    header, _ = encode(kind, payload)
    return header, payload


def decode(data: bytes, key: str, expected: ObjectKind | None = None) -> Envelope:
    """Decode and verify an object; raises :class:`CorruptDataError` naming ``key`` on any damage."""
    if len(data) < HEADER_SIZE:
        raise CorruptDataError(
            f"{key} is truncated ({len(data)} bytes) or not a txnlog object; remove or restore it.", key
        )
    body = data[: _STRUCT.size]
    magic, version, kind, flags, wid, plen, pcrc = _STRUCT.unpack(body)
    if magic != MAGIC:
        raise CorruptDataError(f"{key} is not a txnlog object (bad magic {magic!r}); move it away.", key)
    (hcrc,) = _CRC.unpack(data[_STRUCT.size : HEADER_SIZE])
    if hcrc != crc32c(body):
        raise CorruptDataError(f"{key}: header checksum mismatch; the object is corrupt.", key)
    if version != VERSION:
        raise CorruptDataError(f"{key}: object format version {version} is not supported; upgrade txnlog.", key)
    try:
        okind = ObjectKind(kind)
    except ValueError as exc:
        raise CorruptDataError(f"{key}: unknown object kind {kind}", key) from exc
    if expected is not None and okind != expected:
        raise CorruptDataError(f"{key}: expected a {expected.name} object, found {okind.name}", key)
    payload = memoryview(data)[HEADER_SIZE:]
    if len(payload) != plen:
        raise CorruptDataError(f"{key} is truncated: payload has {len(payload)} bytes, header says {plen}.", key)
    if crc32c(payload) != pcrc:
        raise CorruptDataError(f"{key}: payload checksum mismatch; the object is corrupt.", key)
    return Envelope(okind, wid, payload, bool(flags & FLAG_ARROW))


def create_json(storage: Storage, key: str, kind: ObjectKind, value: dict[str, Any]) -> bool:
    """Create ``key`` holding ``value`` if absent. True if this call created it, False if it existed."""
    header, payload = encode_json(kind, value)
    try:
        create_resolving(storage, key, [header, payload], header)
    except ObjectExistsError:
        return False
    return True


def read_json(storage: Storage, key: str, kind: ObjectKind) -> dict[str, Any]:
    return decode(storage.read(key), key, kind).json(key)
