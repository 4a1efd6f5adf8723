"""Holes and damaged records in one coordinator partition's transaction log (PROTOCOL.md "Damage").

A damaged transaction-log record is not contained: it holds decisions nothing else can rebuild, and the
partition's state is the replay of its records. :func:`damaged` is the error replay raises for it, naming
the record, what it blocks and the one way out (restore the object from a backup). A **missing** record
with a later one present (a **hole**: deleted by hand, lost by the store) is damage of the same kind, never
the end of the log: slot ``n + 1`` is only created by a writer that replayed slot ``n``, and only
compaction deletes records (below a snapshot). :class:`HoleProbe` tells replay when to look past a missing
slot, and confirms a hole before replay reports it.

Invariants: a view probes at its first refresh and then at most every :data:`HOLE_RECHECK_S`; a slot is
reported missing only after a read made after its successor was seen, and after the snapshot listing ruled
out compaction (or a reload for that slot was already made).

Crash windows: none of its own (it only reads). What it guards against is a write into a hole: an append
there would take the slot of a decision the records after it were built on, so replay fails instead and
nothing is appended. A warm writer appends without reading and does not look, which is why a record MUST
NOT be deleted while writers run.
"""

from __future__ import annotations

from collections.abc import Callable

from txn_core.coordinator.snapshots import CoordinatorSnapshots
from txn_core.errors import CorruptDataError, ObjectNotFoundError
from txn_core.format.slotlog import SlotLog

__all__ = ["HOLE_RECHECK_S", "HoleProbe", "damaged"]

#: How often a view's refresh also asks whether a record follows the slot it finds missing (a hole,
#: PROTOCOL.md "Damage"): at its first refresh, then at most this often (seconds).
HOLE_RECHECK_S = 5.0


def damaged(exc: CorruptDataError, key: str, coordinator: int, *, missing: bool = False) -> CorruptDataError:
    """What a damaged (or ``missing``) record of ``coordinator``'s log stops, and the way out: the
    transaction log holds the decisions, which nothing else can rebuild."""
    last = (
        "Nothing is written into its slot meanwhile: a record there would replace the one the records after it "
        "were built on."
        if missing
        else "Do not delete it: the records after it would be overwritten."
    )
    return CorruptDataError(
        f"{exc} It is a record of the transaction log of coordinator partition {coordinator}: until it "
        "is restored from a backup of that object, the transactional ids of this coordinator partition can "
        "neither begin nor end transactions, and readers cannot decide their open ones (other coordinator "
        f"partitions are unaffected). {last}",
        key,
        exc.check,
    )


class HoleProbe:
    """When one view's replay looks past a missing slot, and what it finds there. Not thread-safe: the
    partition's lock guards it."""

    def __init__(
        self, slots: SlotLog, coordinator: int, snapshots: CoordinatorSnapshots, monotonic: Callable[[], float]
    ) -> None:
        self.slots = slots
        self.coordinator = coordinator
        self._snapshots = snapshots
        self._monotonic = monotonic
        self._checked: float | None = None  # when a refresh last probed past the slot it missed

    def due(self) -> bool:
        """Whether this refresh asks, beside each read, whether the next slot exists: the view's first
        refresh, then one every :data:`HOLE_RECHECK_S`."""
        now = self._monotonic()
        if self._checked is not None and now - self._checked < HOLE_RECHECK_S:
            return False
        self._checked = now
        return True

    def confirm(self, slot: int, *, compaction: bool = True) -> bytes | None:
        """``slot`` was missing while ``slot + 1`` was present. Read it again, asked after the later one was
        seen: a record created between the two requests is no hole (returned). With ``compaction``, a snapshot
        listed past it means compaction may have removed it (None: reload from the newest readable snapshot;
        the caller asks so once per slot, since a reload that lands below the slot again, the newer snapshot
        unreadable, would otherwise go round for ever). Otherwise it is a hole: slot ``n + 1`` is only
        created by a writer that replayed slot ``n``, and only compaction deletes records; raise its damage."""
        try:
            return self.slots.read(slot)
        except ObjectNotFoundError:
            pass
        if compaction and self._snapshots.newest_slot() > slot:
            return None
        key = self.slots.key(slot)
        check = "missing: the record is gone although later records exist"
        raise damaged(CorruptDataError(f"{key}: {check}.", key, check), key, self.coordinator, missing=True)
