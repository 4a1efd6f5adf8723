"""Finding offsets by time: the first entry appended at or after a timestamp (PROTOCOL.md "Reading").

Entry timestamps are append times from each writer's clock, so across concurrent writers they are only
*nearly* monotonic. The answer is defined exactly all the same:

    ``offset_for_timestamp(T)`` is the base offset of the first entry, in log order, whose timestamp is
    ``>= T``, or the log end when there is none.

The search relies on one assumption, stated as ``max_skew_ms``: a timestamp never runs behind an *earlier*
entry's by more than that (clocks of concurrent writers agree within ``max_skew_ms``). Then every entry after
the answer has a timestamp ``>= T - max_skew_ms``, so a bisection on "timestamp >= T - max_skew_ms" lands at
or before the answer (it can only stop at a false-to-true step, and there is none after the answer), and a
forward scan from there to the first timestamp ``>= T`` finds it exactly. Cost: O(log n) header reads plus
the entries appended within about ``max_skew_ms`` of ``T``. If the assumption is broken (a clock far behind),
entries stamped ``>= T`` before the bisection point can be missed; the answer is still an entry stamped
``>= T``, and every entry between the bisection point and it is stamped ``< T``.

A damaged entry (PROTOCOL.md "Damage") counts with its predecessor's timestamp in the bisection; met by
the forward scan, it is the answer (its first offset): its time is unknown, and the reader that starts
there meets the damage rather than passing it unseen.
"""

from __future__ import annotations

from txn_core.errors import DamagedEntryError, ObjectNotFoundError
from txn_core.partition import PartitionLog

#: Default bound on how far an entry's timestamp may run behind an earlier entry's (clock disagreement).
MAX_CLOCK_SKEW_MS = 60_000


def offset_for_timestamp(plog: PartitionLog, timestamp_ms: int, *, max_skew_ms: int = MAX_CLOCK_SKEW_MS) -> int:
    """The base offset of the first entry whose timestamp is ``>= timestamp_ms``, else the log end."""
    for _attempt in range(3):
        try:
            return _search(plog, timestamp_ms, max_skew_ms)
        except ObjectNotFoundError:
            plog.log_start(refresh=True)  # retention removed entries under the search: start again
    return _search(plog, timestamp_ms, max_skew_ms)


def _search(plog: PartitionLog, target: int, skew: int) -> int:
    lo = plog.log_start(refresh=True).slot
    tail_slot, end = plog.readable_tail(refresh=True)
    hi = tail_slot  # invariant: the answer's slot is >= the returned bisection point, which is in [lo, hi]
    floor = target - skew
    while lo < hi:
        mid = (lo + hi) // 2
        try:
            stamp = plog.read_header(mid).timestamp_ms
        except DamagedEntryError:
            stamp = plog.boundary_before(mid)[1]
        if stamp >= floor:
            hi = mid
        else:
            lo = mid + 1
    for slot in range(lo, tail_slot):
        try:
            header = plog.read_header(slot)
        except DamagedEntryError:
            return plog.boundary_before(slot)[0]
        if header.timestamp_ms >= target:
            return header.base_offset
    return end
