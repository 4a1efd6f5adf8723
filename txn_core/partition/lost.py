"""Lost entries: offsets whose records are gone, recorded as such (PROTOCOL.md "Damage").

A partition entry whose object fails its checks (a damaged or truncated header, a payload or staged object
that does not match its header) cannot be read. Readers stop before it and raise
:class:`~txn_core.errors.DamagedEntryError` naming it, until either the object is restored or an operator
marks its offsets **lost**: an explicit act, recorded in the log itself as the immutable object
``<path>/lost/<020d slot>`` (envelope kind 13, JSON). Every reader then skips those offsets, logging a
warning, and the transaction buffer moves past them as the record says.

Invariants of a :class:`LostEntry`:

* ``first_offset < next_offset``; ``first_offset`` is the previous entry's next offset (or the log start),
  ``next_offset`` the following entry's base offset, so offsets stay dense across it;
* ``outcomes`` names every transaction that was open in the partition just before the lost entry (which
  may have held its marker), with the outcome the transaction log gave when it was marked: ``commit``,
  ``abort``, ``unknown`` (finished, outcome no longer kept: read_committed delivers none of its records)
  or ``ongoing`` (not decided then: its marker is still to come, so it was not in the lost entry);
* a record with ``header_intact`` describes an entry whose header is fine (only its payload or staged
  object is damaged): the buffer applies the real header, and only the records are skipped.

A reader that chose to skip damage (Spark's ``failOnDataLoss=false``, ``Consumer(skip_damaged=True)``)
makes an unmarked :class:`LostEntry` (``marked=False``, no outcomes) for a damaged entry whose neighbours
give its offsets; nothing of it is written, and a buffer that passed one writes no snapshots.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from txn_core.errors import CorruptDataError, DamagedEntryError, ObjectNotFoundError
from txn_core.format import envelope, paths
from txn_core.format.entry import EntryHeader, EntryKind
from txn_core.format.ids import TxnId
from txn_core.storage.base import Storage

VERSION = 1
COMMIT, ABORT, UNKNOWN, ONGOING = "commit", "abort", "unknown", "ongoing"
OUTCOMES = (COMMIT, ABORT, UNKNOWN, ONGOING)
_NO_WRITER = bytes(16)


@dataclass(frozen=True, slots=True)
class LostEntry:
    """Offsets ``[first_offset, next_offset)`` of the entry at ``slot`` of ``path``, whose records are gone."""

    path: str
    slot: int
    first_offset: int
    next_offset: int
    #: the timestamp readers give the lost offsets: the previous entry's (entries stay nearly ordered)
    timestamp_ms: int
    #: the check the entry failed when it was found or marked
    check: str
    header_intact: bool = False
    outcomes: tuple[tuple[TxnId, str], ...] = ()
    marked: bool = True
    reason: str = ""
    by: str = ""
    marked_ms: int = 0
    size: int | None = None
    #: a SEAL entry was written after it (it was the last entry: its offsets were fixed by the operator)
    sealed: bool = False

    @property
    def key(self) -> str:
        """The damaged entry's object."""
        return paths.entries(self.path) + paths.slot_name(self.slot)

    @property
    def records(self) -> int:
        return self.next_offset - self.first_offset

    def header(self) -> EntryHeader:
        """The header readers use in place of the damaged one: kind LOST, no producer, no transaction."""
        return EntryHeader(
            EntryKind.LOST, self.first_offset, self.records, -1, 0, -1, None, self.timestamp_ms, 0, 0, _NO_WRITER
        )

    def outcome(self, txn: TxnId) -> str | None:
        return dict(self.outcomes).get(txn)

    def describe(self) -> str:
        """One line for warnings: which offsets, which object, who marked them lost and why."""
        what = f"offsets [{self.first_offset}, {self.next_offset}) of {self.path} ({self.key})"
        if not self.marked:
            return f"{what} are damaged ({self.check}) and not marked lost"
        return f"{what} were marked lost by {self.by or 'an operator'}: {self.reason} ({self.check})"

    def to_json(self) -> dict[str, Any]:
        return {
            "version": VERSION,
            "slot": self.slot,
            "key": self.key,
            "first_offset": self.first_offset,
            "next_offset": self.next_offset,
            "timestamp_ms": self.timestamp_ms,
            "check": self.check,
            "header_intact": self.header_intact,
            "open": [[str(t), o] for t, o in self.outcomes],
            "reason": self.reason,
            "by": self.by,
            "marked_ms": self.marked_ms,
            "size": self.size,
            "sealed": self.sealed,
        }

    @classmethod
    def from_json(cls, path: str, value: dict[str, Any], key: str) -> LostEntry:
        try:
            if int(value["version"]) != VERSION:
                raise CorruptDataError(f"{key}: lost-entry record version {value['version']} is not supported", key)
            lost = cls(
                path,
                int(value["slot"]),
                int(value["first_offset"]),
                int(value["next_offset"]),
                int(value["timestamp_ms"]),
                str(value["check"]),
                bool(value["header_intact"]),
                tuple((TxnId.parse(str(t)), str(o)) for t, o in value["open"]),
                True,
                str(value["reason"]),
                str(value["by"]),
                int(value["marked_ms"]),
                None if value.get("size") is None else int(value["size"]),
                bool(value.get("sealed", False)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptDataError(f"{key}: malformed lost-entry record: {exc!r}", key) from exc
        if lost.first_offset >= lost.next_offset or any(o not in OUTCOMES for _, o in lost.outcomes):
            raise CorruptDataError(f"{key}: lost-entry record with impossible offsets or outcomes", key)
        return lost


def damaged_entry_error(
    path: str, slot: int, exc: CorruptDataError, header: EntryHeader | None = None, *, payload: bool = False
) -> DamagedEntryError:
    """The error for the damaged entry at ``slot`` of ``path`` (``exc`` says which check it failed): what
    is wrong, and the two ways out. ``payload``: the header is intact and its records are not (listed by
    ``txnlog maintenance damaged`` only with ``--verify-payloads``)."""
    key = paths.entries(path) + paths.slot_name(slot)
    check = exc.check or str(exc)
    where = paths.topic_partition_of(path)
    if where is None:
        fix = "Restore the object from a copy (an internal log's entries cannot be marked lost)."
    else:
        fix = (
            "Restore the object from a copy, or mark its offsets lost (an operator act recorded in the log; "
            f"readers then skip them): 'txnlog maintenance mark-lost URL --topic {where[0]} --partition "
            f"{where[1]} --slot {slot} --reason TEXT --yes' (inspect it first with 'txnlog maintenance "
            f"damaged URL{' --verify-payloads' if payload else ''}')."
        )
    return DamagedEntryError(
        f"{key} is damaged: {check}. Its records cannot be read and reads stop before it. {fix}",
        key,
        check,
        path=path,
        slot=slot,
        header=header,
    )


def record_key(path: str, slot: int) -> str:
    return paths.lost_entries(path) + paths.slot_name(slot)


def read_lost(storage: Storage, path: str, slot: int) -> LostEntry | None:
    """The lost-entry record of ``slot``, or None when it is not marked lost."""
    key = record_key(path, slot)
    try:
        value = envelope.read_json(storage, key, envelope.ObjectKind.LOST_ENTRY)
    except ObjectNotFoundError:
        return None
    lost = LostEntry.from_json(path, value, key)
    if lost.slot != slot:
        raise CorruptDataError(f"{key}: holds the record of slot {lost.slot}", key)
    return lost


def list_lost(storage: Storage, path: str) -> list[LostEntry]:
    """Every lost-entry record of ``path`` (a LIST and a read each: describe and maintenance only)."""
    out = []
    for name in paths.slot_names(storage.list(paths.lost_entries(path))):
        lost = read_lost(storage, path, int(name))
        if lost is not None:
            out.append(lost)
    return out
