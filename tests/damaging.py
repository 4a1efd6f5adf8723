"""Damage as a disk or a careless hand leaves it: a flipped bit in an object, in a segment's entry."""

from __future__ import annotations

import struct
from collections.abc import Callable

import txn_core
from txn_core.format.entry import HEADER_SIZE, EntryHeader, decode_header

#: The segment format (PROTOCOL.md "Segments"): an 80-byte header, then one 160-byte index row per slot,
#: each holding the entry's 128-byte header and, right after it, where the entry's bytes start.
SEGMENT_HEADER, INDEX_ROW = 80, 160


def flip_bit(log: txn_core.Log, key: str, position: int) -> None:
    """Flip the lowest bit of byte ``position`` of object ``key`` (through the storage interface)."""
    data = bytearray(log.storage.read(key))
    data[position] ^= 0x01
    log.storage.delete(key)
    log.storage.create(key, [bytes(data)])


def segment_rows(log: txn_core.Log, segment: str) -> list[tuple[int, EntryHeader, int]]:
    """``(slot, header, position of its bytes)`` of every entry of ``segment``, from its index."""
    blob = log.storage.read(segment)
    first, end = struct.unpack_from("<qq", blob, 8)
    rows = []
    for i in range(end - first):
        row = SEGMENT_HEADER + INDEX_ROW * i
        (position,) = struct.unpack_from("<q", blob, row + HEADER_SIZE)
        rows.append((first + i, decode_header(blob[row : row + HEADER_SIZE], segment), position))
    return rows


def damage_segment_payload(log: txn_core.Log, segment: str, which: Callable[[EntryHeader], bool]) -> int:
    """Flip a bit in the payload of the one entry of ``segment`` whose header satisfies ``which``; its slot."""
    ((slot, _, position),) = [row for row in segment_rows(log, segment) if which(row[1])]
    flip_bit(log, segment, position + HEADER_SIZE + 2)
    return slot
