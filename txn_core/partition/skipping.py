"""Passing over records a reader cannot read (PROTOCOL.md "Damage"): lost-entry records, and damage a
reader chose to skip (Spark's ``failOnDataLoss=false``, ``Consumer(skip_damaged=True)``).

A reader never passes records silently: it passes them only when a lost-entry record names them, or when
it chose to skip damage, and then always with a warning (:func:`warn_skipped`). Marking entries lost, and
finding damage, are operations (:mod:`txn_core.ops.damage`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from txn_core.errors import CorruptDataError, DamagedEntryError, ObjectNotFoundError
from txn_core.format.entry import EntryHeader
from txn_core.logs import get_logger
from txn_core.partition.lost import LostEntry, damaged_entry_error

if TYPE_CHECKING:
    from txn_core.partition.partition import Entry, PartitionLog

logger = get_logger("txnlog.damage")


def skipped_lost(plog: PartitionLog, exc: DamagedEntryError) -> LostEntry | None:
    """The offsets of the damaged entry ``exc`` names as its neighbours give them, as an unmarked
    :class:`LostEntry` for a reader that chose to skip damage; None when they are unknown (it is the last
    entry, or the entry after it is damaged too): such a reader stops there as at the log end."""
    header = exc.header
    if header is not None:  # only the payload is damaged: the header gives the offsets
        return _lost_with_header(plog, exc.slot, header, exc.check or str(exc))
    try:
        first, timestamp = plog.boundary_before(exc.slot)
        following = plog.read_header(exc.slot + 1).base_offset
    except (ObjectNotFoundError, DamagedEntryError):
        return None
    if following <= first:
        return None
    return LostEntry(plog.path, exc.slot, first, following, timestamp, exc.check or str(exc), marked=False)


def lost_records(
    plog: PartitionLog, slot: int, header: EntryHeader, exc: CorruptDataError, *, skip: bool
) -> LostEntry | None:
    """Why the records of the entry at ``slot`` (whose intact ``header`` reading met ``exc``) may be
    passed over: its lost-entry record, or, for a reader that chose to skip damage, an unmarked one;
    None: they may not (the caller raises ``exc``)."""
    lost = plog.lost_entry(slot)
    if lost is None and skip:
        lost = _lost_with_header(plog, slot, header, exc.check or str(exc))
    return lost


def unreadable_records(plog: PartitionLog, entry: Entry, exc: CorruptDataError) -> CorruptDataError:
    """The error a reader raises for the records of ``entry``, whose intact header reads fine, when it may
    not pass over them (:func:`lost_records` gave None). A loose entry's damaged payload or missing staged
    object becomes the :class:`DamagedEntryError` a damaged header gives, which says how to restore the
    entry or mark it lost (PROTOCOL.md "Damage"); an entry read from a segment keeps ``exc``, which names
    the segment."""
    if isinstance(exc, DamagedEntryError) or entry.key != plog.entries.key(entry.slot):
        return exc
    return damaged_entry_error(plog.path, entry.slot, exc, entry.header, payload=True)


def _lost_with_header(plog: PartitionLog, slot: int, header: EntryHeader, check: str) -> LostEntry:
    return LostEntry(
        plog.path,
        slot,
        header.base_offset,
        header.next_offset,
        header.timestamp_ms,
        check,
        header_intact=True,
        marked=False,
    )


def warn_skipped(lost: LostEntry, why: str = "") -> None:
    """The warning every reader logs when it passes lost offsets (never a silent skip)."""
    if lost.marked:
        logger.warning("%s; skipping them", lost.describe())
    else:
        logger.warning("%s; skipping them because %s", lost.describe(), why or "this reader chose to skip damage")
