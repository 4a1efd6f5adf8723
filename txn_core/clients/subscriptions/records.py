"""Ack-log records: the payload of every DATA entry of a subscription's ack log (PROTOCOL.md
"Subscriptions", "Ack records").

A record is one acknowledgement request, JSON (compact, sorted keys)::

    {"v": 1, "op": "ack", "acks": [[base, count, "ack set hex"], ...], "skips": [[first, end], ...],
     "by": "consumer id"}
    {"v": 1, "op": "cumulative", "upto": 1234, "skips": [], "by": "..."}
    {"v": 1, "op": "skip", "skips": [[17, 18]], "by": "..."}

* ``acks``: per topic entry ``[base offset, record count, ack set]`` (see :mod:`.bitsets`: bit ``i`` set =
  record ``base + i`` not acknowledged by this request), ascending, non-overlapping.
* ``upto``: a cumulative acknowledgement of every offset ``< upto``; for ``lost``, the topic partition's
  log start when retention had removed offsets below it before they were acknowledged: they are given up
  (never deliverable again), whatever any transaction holds.
* ``skips``: ranges ``[first, end)`` of topic offsets a read_committed reader never delivers (control
  markers, aborted or duplicate data). They are facts about the topic, applied by replay whatever the
  record's transaction or verdict, so the mark-delete position can pass them.

The entry header says whether the request is transactional (its ``txn`` field). Records are written by
:mod:`txn_core.clients.subscriptions.acklog` and by ``Producer.append_to_transaction``.
"""

from __future__ import annotations

import enum
import itertools
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from txn_core.clients.subscriptions import bitsets
from txn_core.errors import CorruptDataError
from txn_core.format.ids import is_int

VERSION = 1
MAX_ENTRY_RECORDS = 1 << 31


class AckOp(enum.Enum):
    ACK = "ack"
    CUMULATIVE = "cumulative"
    SKIP = "skip"
    LOST = "lost"


@dataclass(frozen=True, slots=True)
class EntryAck:
    """An acknowledgement of some records of one topic entry ``[base, base + count)``."""

    base: int
    count: int
    ack_set: int  # bit i set = record base + i NOT acknowledged by this request

    @property
    def end(self) -> int:
        return self.base + self.count

    @property
    def cleared(self) -> int:
        """Mask of the records this request acknowledges."""
        return bitsets.cleared(self.ack_set, self.count)

    def offsets(self) -> list[int]:
        return [self.base + i for i in bitsets.indexes(self.cleared)]


@dataclass(frozen=True, slots=True)
class AckRecord:
    """One acknowledgement request (see module doc)."""

    op: AckOp
    acks: tuple[EntryAck, ...] = ()
    upto: int = 0
    skips: tuple[tuple[int, int], ...] = ()
    consumer: str = ""

    def encode(self) -> bytes:
        value: dict[str, Any] = {
            "v": VERSION,
            "op": self.op.value,
            "by": self.consumer,
            "skips": [list(s) for s in self.skips],
        }
        if self.op is AckOp.ACK:
            value["acks"] = [[a.base, a.count, bitsets.to_hex(a.ack_set)] for a in self.acks]
        elif self.op in (AckOp.CUMULATIVE, AckOp.LOST):
            value["upto"] = self.upto
        return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def decode(cls, payload: bytes | memoryview, key: str) -> AckRecord:
        """Parse and validate a record; :class:`CorruptDataError` naming ``key`` if it is malformed."""
        try:
            value = json.loads(bytes(payload))
        except ValueError as exc:
            raise CorruptDataError(f"{key}: ack record is not valid JSON: {exc}", key) from exc
        if not isinstance(value, dict) or value.get("v") != VERSION:
            raise CorruptDataError(f"{key}: not an ack record of version {VERSION}", key)
        try:
            op = AckOp(value.get("op"))
        except ValueError as exc:
            raise CorruptDataError(f"{key}: unknown ack record op {value.get('op')!r}", key) from exc
        skips = tuple(_skip(s, key) for s in value.get("skips", ()))
        consumer = str(value.get("by", ""))
        if op is AckOp.ACK:
            acks = tuple(_entry_ack(a, key) for a in value.get("acks", ()))
            for prev, nxt in itertools.pairwise(acks):
                if nxt.base < prev.end:
                    raise CorruptDataError(f"{key}: ack record entries overlap or are unordered", key)
            if not acks:
                raise CorruptDataError(f"{key}: ack record acknowledges nothing", key)
            return cls(op, acks, 0, skips, consumer)
        if op in (AckOp.CUMULATIVE, AckOp.LOST):
            upto = value.get("upto")
            if not is_int(upto) or upto <= 0:
                raise CorruptDataError(f"{key}: bad {op.value} bound {upto!r}", key)
            return cls(op, (), upto, skips, consumer)
        return cls(op, (), 0, skips, consumer)


def _int(v: object, key: str, what: str) -> int:
    if not is_int(v) or v < 0:
        raise CorruptDataError(f"{key}: bad {what} {v!r} in ack record", key)
    return v


def _entry_ack(v: object, key: str) -> EntryAck:
    if not isinstance(v, list) or len(v) != 3:
        raise CorruptDataError(f"{key}: bad entry ack {v!r}", key)
    base = _int(v[0], key, "base offset")
    count = _int(v[1], key, "record count")
    if not 1 <= count <= MAX_ENTRY_RECORDS:
        raise CorruptDataError(f"{key}: bad record count {count}", key)
    ack_set = bitsets.from_hex(v[2], count, key)
    if ack_set == bitsets.full(count):
        raise CorruptDataError(f"{key}: entry ack at {base} acknowledges nothing", key)
    return EntryAck(base, count, ack_set)


def _skip(v: object, key: str) -> tuple[int, int]:
    if not isinstance(v, list) or len(v) != 2:
        raise CorruptDataError(f"{key}: bad skip range {v!r}", key)
    first, end = _int(v[0], key, "skip start"), _int(v[1], key, "skip end")
    if end <= first:
        raise CorruptDataError(f"{key}: empty skip range {v!r}", key)
    return first, end


def entry_acks(offsets: Iterable[int], bounds: Callable[[int], tuple[int, int]]) -> tuple[EntryAck, ...]:
    """Group ``offsets`` by the topic entry holding each (``bounds(offset) -> (base, count)``) into
    ascending :class:`EntryAck` values."""
    by_entry: dict[int, tuple[int, int]] = {}  # base -> (count, mask of acked indexes)
    for o in sorted(set(offsets)):
        base, count = bounds(o)
        prev = by_entry.get(base)
        mask = (prev[1] if prev else 0) | (1 << (o - base))
        by_entry[base] = (count, mask)
    return tuple(EntryAck(base, count, bitsets.full(count) & ~mask) for base, (count, mask) in sorted(by_entry.items()))


def ranges_of(offsets: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted offsets as maximal ``[first, end)`` ranges."""
    out: list[tuple[int, int]] = []
    for o in sorted(set(offsets)):
        if out and out[-1][1] == o:
            out[-1] = (out[-1][0], o + 1)
        else:
            out.append((o, o + 1))
    return out
