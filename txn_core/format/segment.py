"""The segment object: a contiguous range of a partition's entries with an index (PROTOCOL.md "Segments").

Layout (little-endian)::

    header, 80 bytes
    off size field
    0   4    magic          b"TXLS"
    4   1    version        1
    5   1    reserved       0
    6   2    flags          0
    8   8    first_slot
    16  8    end_slot       exclusive; count = end_slot - first_slot >= 1
    24  8    base_offset    of the entry at first_slot
    32  8    next_offset    of the entry at end_slot - 1
    40  8    data_len       bytes after the index
    48  8    created_ms     the roller's clock
    56  16   writer_id
    72  4    index_crc      CRC-32C of the index
    76  4    header_crc     CRC-32C of bytes [0, 76)

    index, count rows of 160 bytes (row i: slot first_slot + i)
    0   128  the entry's header, verbatim
    128 8    position       of the entry's bytes (header + payload, as the loose object held them)
    136 8    length         128 + payload_len
    144 8    data_len       inlined staged payload right after the entry's bytes (0: none)
    152 4    data_crc       CRC-32C of the inlined payload
    156 1    form           0 entry, 1 DATA_REF with delivered rows inlined, 2 DATA_REF with rows dropped,
                            3 DATA_REF of aborted or skipped rows, inlined
    157 3    reserved

    data: per row, the entry's bytes, then its inlined payload

Invariants checked when a segment is opened (:meth:`SegmentIndex.parse`): both checksums, the rows chain
(positions contiguous from the end of the index, base offsets dense from ``base_offset`` to
``next_offset``), every row's length matches its header. Each row's header checksum is verified when the
header is decoded, an entry's bytes must begin with its row's header (:meth:`SegmentIndex.entry_at`), and
payloads are verified by their user (:func:`txn_core.format.entry.verify_payload`, :meth:`Inlined.payload`).
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from txn_core.errors import CorruptDataError
from txn_core.format.checksum import crc32c
from txn_core.format.entry import (
    HEADER_SIZE,
    VERSION_CARRIER,
    VERSIONS,
    CarriedMarker,
    EntryHeader,
    EntryKind,
    decode_header,
)
from txn_core.format.ids import TxnId

MAGIC = b"TXLS"
VERSION = 1
SEGMENT_HEADER_SIZE = 80
ROW_SIZE = 160
_HEADER = struct.Struct("<4sBBHqqqqqq16sI")
assert _HEADER.size == 76
_CRC = struct.Struct("<I")
_ROW_TAIL = struct.Struct("<QQQIB3x")
assert HEADER_SIZE + _ROW_TAIL.size == ROW_SIZE

#: The index rows as a numpy record: the entry header's fields the checks need, then the row's own.
ROW_DTYPE = np.dtype(
    [
        ("magic", "S4"),
        ("version", "u1"),
        ("kind", "u1"),
        ("flags", "<u2"),
        ("header_size", "<u2"),
        ("reserved", "<u2"),
        ("base_offset", "<i8"),
        ("record_count", "<u4"),
        ("producer_id", "<i8"),
        ("producer_epoch", "<i4"),
        ("base_sequence", "<i4"),
        ("txn_hi", "<u8"),
        ("txn_lo", "<u8"),
        ("timestamp_ms", "<i8"),
        ("payload_len", "<u8"),
        ("payload_crc", "<u4"),
        ("writer_id", "V16"),
        # the carried marker of a version-2 header (zero in version 1)
        ("marker_kind", "u1"),
        ("marker_pad", "V3"),
        ("marker_epoch", "<i4"),
        ("marker_txn_hi", "<u8"),
        ("marker_txn_lo", "<u8"),
        ("pad", "V8"),
        ("header_crc", "<u4"),
        ("position", "<u8"),
        ("length", "<u8"),
        ("data_len", "<u8"),
        ("data_crc", "<u4"),
        ("form", "u1"),
        ("tail", "V3"),
    ]
)
assert ROW_DTYPE.itemsize == ROW_SIZE
_KIND_OF = {int(k): k for k in EntryKind if k is not EntryKind.LOST}  # LOST is never stored
_KINDS = np.array(sorted(_KIND_OF), dtype=np.uint8)


def _carriers_valid(rows: np.ndarray) -> bool:
    """Whether every version-2 row is a data entry carrying a COMMIT or ABORT marker (what
    :func:`~txn_core.format.entry.decode_header` checks of one header)."""
    v2 = rows["version"] == VERSION_CARRIER
    if not v2.any():
        return True
    data = np.isin(rows["kind"][v2], [int(EntryKind.DATA), int(EntryKind.DATA_REF)])
    marker = np.isin(rows["marker_kind"][v2], [int(EntryKind.COMMIT), int(EntryKind.ABORT)])
    padding = (rows["marker_pad"][v2] == np.void(b"\0" * 3)) & (rows["pad"][v2] == np.void(b"\0" * 8))
    return bool(np.all(data & marker & padding))


class Form(enum.IntEnum):
    """How a row holds its entry (PROTOCOL.md "Segments", "What a segment holds")."""

    ENTRY = 0  # the entry's bytes alone
    INLINED = 1  # a DATA_REF whose rows readers deliver, its staged object's payload right after it
    DROPPED = 2  # a DATA_REF of aborted or skipped rows whose staged object was gone already: no rows kept
    HIDDEN = 3  # a DATA_REF of aborted or skipped rows, inlined (for read_uncommitted readers)


@dataclass(frozen=True, slots=True)
class Inlined:
    """The rows of a DATA_REF as a segment holds them: the staged payload (``data``), or None when the
    segment dropped them (aborted or skipped data, which no read_committed reader delivers)."""

    data: Any  # a pyarrow.Buffer slice, or None
    crc: int
    where: str

    def payload(self) -> memoryview:
        """The inlined payload, verified against the reference's checksum."""
        view = memoryview(self.data)
        crc = crc32c(view)
        if crc != self.crc:
            raise CorruptDataError(
                f"{self.where}: inlined staged rows fail their checksum (stored {self.crc:#010x}, computed "
                f"{crc:#010x}); the segment is corrupt.",
                self.where,
            )
        return view


@dataclass(frozen=True, slots=True)
class SegmentHeader:
    first_slot: int
    end_slot: int
    base_offset: int
    next_offset: int
    data_len: int
    created_ms: int
    writer_id: bytes
    index_crc: int

    @property
    def count(self) -> int:
        return self.end_slot - self.first_slot

    @property
    def index_end(self) -> int:
        """Where the index ends (and the data begins)."""
        return SEGMENT_HEADER_SIZE + ROW_SIZE * self.count

    @property
    def size(self) -> int:
        return self.index_end + self.data_len

    def encode(self) -> bytes:
        body = _HEADER.pack(
            MAGIC,
            VERSION,
            0,
            0,
            self.first_slot,
            self.end_slot,
            self.base_offset,
            self.next_offset,
            self.data_len,
            self.created_ms,
            self.writer_id,
            self.index_crc,
        )
        return body + _CRC.pack(crc32c(body))


def decode_segment_header(data: Any, key: str) -> SegmentHeader:
    """The verified header at the start of ``data``."""
    view = memoryview(data)
    if len(view) < SEGMENT_HEADER_SIZE:
        raise CorruptDataError(
            f"{key} is truncated: {len(view)} bytes, shorter than the {SEGMENT_HEADER_SIZE}-byte segment "
            "header. The segment is damaged; delete it (its loose entries, if still present, serve readers) "
            "or restore it.",
            key,
        )
    body = bytes(view[:76])
    magic, version, _r, _flags, first, end, base, nxt, data_len, created, writer_id, index_crc = _HEADER.unpack(body)
    if magic != MAGIC:
        raise CorruptDataError(f"{key} is not a txnlog segment (bad magic {magic!r})", key)
    (crc,) = _CRC.unpack(bytes(view[76:80]))
    if crc != crc32c(body):
        raise CorruptDataError(f"{key}: segment header checksum mismatch; the segment is corrupt.", key)
    if version != VERSION:
        raise CorruptDataError(
            f"{key}: segment format version {version} is not supported by this txnlog (version {VERSION}); "
            "upgrade txnlog.",
            key,
        )
    if end <= first or nxt < base:
        raise CorruptDataError(f"{key}: segment header holds slots [{first}, {end}), offsets [{base}, {nxt})", key)
    return SegmentHeader(first, end, base, nxt, data_len, created, writer_id, index_crc)


@dataclass(frozen=True, slots=True)
class SegmentRow:
    """One entry handed to :func:`encode_segment`: its bytes (header + payload) and how it is held."""

    header: EntryHeader
    entry: Any  # bytes-like: the loose object's bytes
    form: Form = Form.ENTRY
    data: Any = None  # the inlined staged payload (form INLINED)
    data_crc: int = 0


def encode_segment(first_slot: int, rows: Sequence[SegmentRow], created_ms: int, writer_id: bytes) -> list[Any]:
    """The chunks of a segment holding ``rows`` as slots ``first_slot, first_slot + 1, ...``.

    Checks what a reader will check (dense offsets, entry bytes matching their headers), so a damaged
    input never becomes a segment.
    """
    if not rows:
        raise ValueError("a segment holds at least one entry")
    index = bytearray(ROW_SIZE * len(rows))
    position = SEGMENT_HEADER_SIZE + len(index)
    data: list[Any] = []
    expected = rows[0].header.base_offset
    for i, row in enumerate(rows):
        header = row.header
        entry = memoryview(row.entry)
        raw = bytes(entry[:HEADER_SIZE])
        if header.base_offset != expected or len(entry) != HEADER_SIZE + header.payload_len:
            raise CorruptDataError(
                f"slot {first_slot + i}: entry at offset {header.base_offset} ({len(entry)} bytes) does not "
                f"continue the segment at offset {expected}",
                str(first_slot + i),
            )
        expected = header.next_offset
        data_len = 0 if row.data is None else len(memoryview(row.data))
        at = ROW_SIZE * i
        index[at : at + HEADER_SIZE] = raw
        index[at + HEADER_SIZE : at + ROW_SIZE] = _ROW_TAIL.pack(
            position, len(entry), data_len, row.data_crc if row.data is not None else 0, int(row.form)
        )
        data.append(entry)
        if row.data is not None:
            data.append(row.data)
        position += len(entry) + data_len
    segment = SegmentHeader(
        first_slot,
        first_slot + len(rows),
        rows[0].header.base_offset,
        expected,
        position - SEGMENT_HEADER_SIZE - len(index),
        created_ms,
        writer_id,
        crc32c(index),
    )
    return [segment.encode(), bytes(index), *data]


class SegmentIndex:
    """A segment's verified header and index (what a reader keeps of an opened segment). Immutable."""

    __slots__ = ("_damaged", "_raw", "header", "key", "rows")

    def __init__(self, key: str, header: SegmentHeader, index: bytes) -> None:
        self.key = key
        self.header = header
        self._raw = index
        self.rows = np.frombuffer(index, dtype=ROW_DTYPE)
        #: a row header fails its own checks (checksum, version, size, kind): single lookups name it
        self._damaged = False

    @classmethod
    def parse(cls, key: str, head: Any) -> tuple[SegmentHeader, SegmentIndex | None]:
        """The header, and the index when ``head`` (the object's first bytes) holds all of it."""
        header = decode_segment_header(head, key)
        view = memoryview(head)
        if len(view) < header.index_end:
            return header, None
        return header, cls.from_bytes(key, header, bytes(view[SEGMENT_HEADER_SIZE : header.index_end]))

    @classmethod
    def from_bytes(cls, key: str, header: SegmentHeader, index: bytes) -> SegmentIndex:
        if len(index) != ROW_SIZE * header.count:
            raise CorruptDataError(f"{key}: segment index is truncated", key)
        if crc32c(index) != header.index_crc:
            raise CorruptDataError(f"{key}: segment index checksum mismatch; the segment is corrupt.", key)
        seg = cls(key, header, index)
        seg._check()
        return seg

    def _check(self) -> None:
        rows, h, key = self.rows, self.header, self.key
        ends = rows["position"] + rows["length"] + rows["data_len"]
        ok = (
            bool(np.all(rows["magic"] == b"TXLE"))
            and bool(np.all(rows["length"] == HEADER_SIZE + rows["payload_len"]))
            and int(rows["position"][0]) == h.index_end
            and bool(np.all(rows["position"][1:] == ends[:-1]))
            and int(ends[-1]) == h.size
            and int(rows["base_offset"][0]) == h.base_offset
            and bool(np.all(rows["base_offset"][1:] == rows["base_offset"][:-1] + rows["record_count"][:-1]))
            and int(rows["base_offset"][-1]) + int(rows["record_count"][-1]) == h.next_offset
            and bool(np.all(rows["form"] <= int(Form.HIDDEN)))
        )
        if not ok:
            raise CorruptDataError(f"{key}: the segment index does not chain (positions or offsets); corrupt.", key)
        # Every row header's own checks, once (the headers of a span are then built from the columns).
        raw = memoryview(self._raw)
        crcs = rows["header_crc"].tolist()
        self._damaged = (
            any(crc32c(raw[ROW_SIZE * n : ROW_SIZE * n + 124]) != crc for n, crc in enumerate(crcs))
            or not bool(np.all(np.isin(rows["version"], VERSIONS)))
            or not _carriers_valid(rows)
            or not bool(np.all(rows["header_size"] == HEADER_SIZE))
            # np.isin, not np.unique: unique imports numpy.ma on first use (~75 ms on a fresh reader's path)
            or not bool(np.all(np.isin(rows["kind"], _KINDS)))
        )

    @property
    def damaged(self) -> bool:
        """A row header fails its own checks (reading it one by one names it)."""
        return self._damaged

    @property
    def first(self) -> int:
        return self.header.first_slot

    @property
    def end(self) -> int:
        return self.header.end_slot

    def holds(self, slot: int) -> bool:
        return self.header.first_slot <= slot < self.header.end_slot

    def entry_header(self, slot: int) -> EntryHeader:
        """The verified header of ``slot`` (from the index: no request)."""
        at = ROW_SIZE * (slot - self.header.first_slot)
        return decode_header(memoryview(self._raw)[at : at + HEADER_SIZE], self.where(slot))

    def entry_headers(self, first: int, end: int) -> list[EntryHeader]:
        """The verified headers of slots ``[first, end)``, built from the index's columns at once (a span
        read or a header scan takes thousands: :func:`decode_header` field by field would cost more than
        reading them). The same checks: magic, version, size, kind, each header's checksum."""
        if self._damaged:
            return [self.entry_header(s) for s in range(first, end)]  # raises, naming the damaged one
        i, j = first - self.header.first_slot, end - self.header.first_slot
        rows = self.rows[i:j]
        kinds = [_KIND_OF[k] for k in rows["kind"].tolist()]
        carried: list[CarriedMarker | None] = [None] * len(rows)
        for n in np.flatnonzero(rows["version"] == VERSION_CARRIER).tolist():
            row = rows[n]
            carried[n] = CarriedMarker(
                int(row["marker_kind"]) == int(EntryKind.COMMIT),
                TxnId.from_header(int(row["marker_txn_hi"]), int(row["marker_txn_lo"])),
                int(row["marker_epoch"]),
            )
        columns = zip(
            kinds,
            rows["flags"].tolist(),
            rows["base_offset"].tolist(),
            rows["record_count"].tolist(),
            rows["producer_id"].tolist(),
            rows["producer_epoch"].tolist(),
            rows["base_sequence"].tolist(),
            rows["txn_hi"].tolist(),
            rows["txn_lo"].tolist(),
            rows["timestamp_ms"].tolist(),
            rows["payload_len"].tolist(),
            rows["payload_crc"].tolist(),
            rows["writer_id"].tolist(),
            carried,
            strict=True,
        )
        return [
            EntryHeader(
                kind,
                base,
                count,
                pid,
                epoch,
                seq,
                TxnId.from_header(hi, lo) if flags & 1 else None,
                ts,
                plen,
                pcrc,
                wid,
                marker,
            )
            for kind, flags, base, count, pid, epoch, seq, hi, lo, ts, plen, pcrc, wid, marker in columns
        ]

    def where(self, slot: int) -> str:
        """How errors name a slot of this segment."""
        return f"{self.key} (slot {slot})"

    def byte_range(self, first: int, end: int) -> tuple[int, int]:
        """The bytes holding slots ``[first, end)``: one contiguous range."""
        i, j = first - self.header.first_slot, end - 1 - self.header.first_slot
        rows = self.rows
        return int(rows["position"][i]), int(rows["position"][j] + rows["length"][j] + rows["data_len"][j])

    def entries(
        self, first: int, end: int, block: Any, block_start: int
    ) -> list[tuple[int, EntryHeader, Any, Inlined | None, str]]:
        """Slots ``[first, end)``: slot, header, entry bytes, inlined rows and name for errors, sliced from
        ``block`` (a pyarrow.Buffer holding the object's bytes from ``block_start``). Each entry's bytes
        MUST begin with its row's header."""
        i, j = first - self.header.first_slot, end - self.header.first_slot
        rows = self.rows[i:j]
        raw = memoryview(self._raw)
        view = memoryview(block).cast("B")
        out: list[tuple[int, EntryHeader, Any, Inlined | None, str]] = []
        columns = zip(
            self.entry_headers(first, end),
            rows["position"].tolist(),
            rows["length"].tolist(),
            rows["data_len"].tolist(),
            rows["data_crc"].tolist(),
            rows["form"].tolist(),
            strict=True,
        )
        for n, (header, position, length, data_len, data_crc, form) in enumerate(columns):
            slot, at, lo = first + n, ROW_SIZE * (i + n), position - block_start
            where = self.where(slot)
            if lo + length + data_len > len(view) or view[lo : lo + HEADER_SIZE] != raw[at : at + HEADER_SIZE]:
                raise CorruptDataError(f"{where}: the entry's bytes do not match its index row; corrupt.", self.key)
            inlined = None
            if form in (Form.INLINED, Form.HIDDEN):
                inlined = Inlined(block.slice(lo + length, data_len), data_crc, where)
            elif form == Form.DROPPED:
                inlined = Inlined(None, 0, where)
            out.append((slot, header, block.slice(lo, length), inlined, where))
        return out

    def span(self, first: int, end: int, block: Any, block_start: int) -> SegmentSpan:
        """Slots ``[first, end)`` sliced from ``block`` (as :meth:`entries` takes it) without an object per
        entry: what a reader of thousands of small entries classifies and decodes column by column. The
        same check as :meth:`entries`: each entry's bytes begin with its row's header (all at once)."""
        i, j = first - self.header.first_slot, end - self.header.first_slot
        rows = self.rows[i:j]
        lo = rows["position"].astype(np.int64) - block_start
        hi = lo + rows["length"].astype(np.int64) + rows["data_len"].astype(np.int64)
        data = np.frombuffer(block, dtype=np.uint8)
        if len(rows) and (int(lo.min()) < 0 or int(hi.max()) > len(data)):
            where = self.where(first)
            raise CorruptDataError(f"{where}: the entries' bytes lie outside what was read; corrupt.", self.key)
        heads = data[lo[:, None] + np.arange(HEADER_SIZE)]
        index = np.frombuffer(self._raw, dtype=np.uint8).reshape(-1, ROW_SIZE)[i:j, :HEADER_SIZE]
        bad = np.flatnonzero(np.any(heads != index, axis=1))
        if len(bad):
            where = self.where(first + int(bad[0]))
            raise CorruptDataError(f"{where}: the entry's bytes do not match its index row; corrupt.", self.key)
        return SegmentSpan(self, first, end, rows, block, lo)

    def forms(self) -> np.ndarray:
        return self.rows["form"]

    def slot_for_offset(self, offset: int) -> int | None:
        """The slot of the entry containing ``offset``, if this segment holds it."""
        span = self.entry_span(offset)
        return span[0] if span is not None else None

    def entry_span(self, offset: int) -> tuple[int, int, int] | None:
        """``(slot, base offset, next offset)`` of the entry containing ``offset``, if this segment holds it
        (entries are consecutive: each begins where the one before ends)."""
        if not self.header.base_offset <= offset < self.header.next_offset:
            return None
        bases = self.rows["base_offset"]
        i = int(np.searchsorted(bases, offset, side="right")) - 1
        after = int(bases[i + 1]) if i + 1 < len(bases) else self.header.next_offset
        return self.header.first_slot + i, int(bases[i]), after

    @property
    def nbytes(self) -> int:
        return len(self._raw)


class SegmentSpan:
    """Consecutive slots of one segment read at once (:meth:`SegmentIndex.span`): their index rows as
    columns and the bytes that hold them. Entries are made one at a time only when asked for
    (:meth:`entries`); a reader that classifies and decodes them column by column never makes them.
    Immutable."""

    __slots__ = ("block", "end", "first", "index", "rows", "starts")

    def __init__(self, index: SegmentIndex, first: int, end: int, rows: np.ndarray, block: Any, starts: np.ndarray):
        self.index = index
        self.first = first
        self.end = end
        self.rows = rows  # ROW_DTYPE rows of slots [first, end)
        self.block = block  # a pyarrow.Buffer
        self.starts = starts  # where each entry's bytes begin in block

    def __len__(self) -> int:
        return self.end - self.first

    def entries(self, first: int, end: int) -> list[tuple[int, EntryHeader, Any, Inlined | None, str]]:
        """Slots ``[first, end)`` of this span as :meth:`SegmentIndex.entries` gives them."""
        i = first - self.first
        return self.index.entries(first, end, self.block, int(self.rows["position"][i]) - int(self.starts[i]))

    def payloads(self, picked: list[int]) -> list[memoryview]:
        """The payloads of this span's entries ``picked`` (indexes into it, ascending), each verified against
        its row's checksum; those before the first that fails (fewer than asked: reading that entry alone
        raises the error that names it)."""
        view = memoryview(self.block).cast("B")  # unsigned bytes: compared as bytes (ipcrun)
        rows = self.rows[picked]
        starts = (self.starts[picked] + HEADER_SIZE).tolist()
        out: list[memoryview] = []
        for start, size, crc in zip(starts, rows["payload_len"].tolist(), rows["payload_crc"].tolist(), strict=True):
            payload = view[start : start + size]
            if crc32c(payload) != crc:
                break
            out.append(payload)
        return out
