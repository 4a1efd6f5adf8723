"""Finding offsets by time: the first entry appended at or after a timestamp (PROTOCOL.md "Reading").

Entry timestamps are append times from each writer's clock, so across concurrent writers they are only
*nearly* monotonic. The answer is defined exactly all the same:

    ``offset_for_timestamp(T)`` is the base offset of the first entry, in log order, whose timestamp is
    ``>= T``, or the log end when there is none.

The search relies on one assumption, stated as ``max_skew_ms``: a timestamp never runs behind an *earlier*
entry's by more than that (clocks of concurrent writers agree within ``max_skew_ms``). Then every entry after
the answer has a timestamp ``>= T - max_skew_ms``, so a bisection on "timestamp >= T - max_skew_ms" lands at
or before the answer (it can only stop at a false-to-true step, and there is none after the answer), and a
forward scan from there to the first timestamp ``>= T`` finds it exactly. The bisection reads rounds of
SEARCH_PROBES headers in flight together, spread over the bracket, which each round narrows to the gap
between the last probe stamped below the floor and the first at or above it (about log9(n) rounds); the
forward scan reads ahead the entries appended within about ``max_skew_ms`` of ``T``. If the assumption is
broken (a clock far behind), entries stamped ``>= T`` before the bisection point can be missed; the answer is
still an entry stamped ``>= T``, and every entry between the bisection point and it is stamped ``< T``.

A damaged entry (PROTOCOL.md "Damage") counts with its predecessor's timestamp in the bisection; met by
the forward scan, it is the answer (its first offset): its time is unknown, and the reader that starts
there meets the damage rather than passing it unseen.
"""

from __future__ import annotations

from txn_core.errors import DamagedEntryError, ObjectNotFoundError
from txn_core.partition.partition import SEARCH_PROBES, PartitionLog
from txn_core.partition.readahead import HeaderReadAhead
from txn_core.storage.parallel import parallel_map

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
    start = plog.log_start(refresh=True)
    lo = start.slot
    tail_slot, end = plog.readable_tail(refresh=True)
    hi = (
        tail_slot  # invariant: the slot before lo is stamped < floor (or lo is the start); hi is >= floor (or the tail)
    )
    floor = target - skew
    while lo < hi:
        probes = _probes(lo, hi)
        stamps = parallel_map(lambda slot: _stamp(plog, slot, start.slot), probes, leaf=True)
        for slot, stamp in zip(probes, stamps, strict=True):
            if stamp >= floor:
                hi = slot
                break
            lo = slot + 1
    headers = HeaderReadAhead(plog, lo)
    for slot in range(lo, tail_slot):
        try:
            header = headers.next(slot)
        except DamagedEntryError:
            return plog.boundary_before(slot)[0]
        if header.timestamp_ms >= target:
            return header.base_offset
    return end


def _probes(lo: int, hi: int) -> list[int]:
    """The slots of ``[lo, hi)`` one round of the search reads at once (sorted): all of them when few, else
    SEARCH_PROBES spread evenly, which narrows the bracket to about a ``SEARCH_PROBES + 1``-th."""
    if hi - lo <= SEARCH_PROBES:
        return list(range(lo, hi))
    return sorted({lo + (hi - lo) * i // (SEARCH_PROBES + 1) for i in range(1, SEARCH_PROBES + 1)})


def _stamp(plog: PartitionLog, slot: int, first: int) -> int:
    """The timestamp the search gives ``slot``: its entry's, or, damaged, its predecessor's (0 for the
    first slot). Any thread: it only fetches."""
    try:
        return plog.fetch_header(slot).timestamp_ms
    except DamagedEntryError:
        return plog.fetch_header(slot - 1).timestamp_ms if slot > first else 0
