"""Ack sets: which records of one entry are still unacknowledged (PROTOCOL.md "Subscriptions").

An entry of a topic partition holds ``count`` records with dense offsets ``base .. base + count - 1``. Its
**ack set** is a bitset over those records in Pulsar's convention: bit ``i`` set means record ``base + i``
is *not* acknowledged; a cleared bit means acknowledged. A fresh entry's ack set is :func:`full`; a fully
acknowledged entry's is ``0``. Bitsets are Python ints (arbitrary width, O(count / 64) per operation).

The three operations of the seed (Pulsar's PendingAckHandle, batch-index acks):

* **AND** (:func:`merge`): acknowledging merges a request's ack set into the current one; the result has
  a bit cleared if either had it cleared.
* **flip** (:func:`cleared`): the bits a request cleared are the complement of its ack set within
  ``count`` bits.
* **OR** (:func:`restore`): aborting a transaction ORs the flip of its ack set back into the combined ack
  set, setting again exactly the bits it cleared. This is exact only if no other party cleared one of
  those bits too, which the conflict rule guarantees (a bit is cleared by at most one of: the committed
  state, or one open transaction).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from txn_core.errors import CorruptDataError


def full(count: int) -> int:
    """The ack set of an entry of ``count`` records with nothing acknowledged (all bits set)."""
    return (1 << count) - 1


def below(count: int, index: int) -> int:
    """The bits of indexes ``< index`` (clamped to ``[0, count]``)."""
    return full(max(0, min(count, index)))


def from_indexes(indexes: Iterable[int], count: int) -> int:
    """The ack set of a request acknowledging the records at ``indexes`` (each in ``[0, count)``)."""
    mask = 0
    for i in indexes:
        if not 0 <= i < count:
            raise ValueError(f"batch index {i} outside an entry of {count} records")
        mask |= 1 << i
    return full(count) & ~mask


def merge(current: int, request: int) -> int:
    """AND: ``current`` with everything ``request`` acknowledges also acknowledged."""
    return current & request


def cleared(ack_set: int, count: int) -> int:
    """Flip: the bits ``ack_set`` has cleared (the records it acknowledges), as a mask."""
    return full(count) & ~ack_set


def restore(combined: int, txn_ack_set: int, count: int) -> int:
    """Flip ``txn_ack_set`` and OR it into ``combined``: undo exactly what that transaction cleared."""
    return combined | cleared(txn_ack_set, count)


def indexes(mask: int) -> Iterator[int]:
    """Positions of the set bits of ``mask``, ascending (O(set bits))."""
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


def to_hex(bits: int) -> str:
    return format(bits, "x")


def from_hex(text: object, count: int, where: str) -> int:
    """Parse a hex ack set of an entry of ``count`` records; :class:`CorruptDataError` if malformed."""
    if not isinstance(text, str) or not text or len(text) > count // 4 + 2:
        raise CorruptDataError(f"{where}: bad ack set {text!r} for an entry of {count} records", where)
    try:
        bits = int(text, 16)
    except ValueError as exc:
        raise CorruptDataError(f"{where}: bad ack set {text!r}", where) from exc
    if bits >> count:
        raise CorruptDataError(f"{where}: ack set {text!r} has bits beyond the entry's {count} records", where)
    return bits
