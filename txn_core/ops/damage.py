"""Damaged entries: finding them, skipping them by choice, and marking their offsets lost (PROTOCOL.md
"Damage").

A damaged entry (its header, payload or staged object fails a check) stops every reader before it. There
are two explicit ways past it, never a silent one:

* **mark it lost** (:func:`mark_lost`, ``txnlog maintenance mark-lost``): an operator act recorded in the log
  as ``<path>/lost/<020d slot>`` (:mod:`txn_core.partition.lost`). The offsets come from the neighbours: the entry
  before it ends where it begins, the entry after it begins where it ends. A damaged *last* entry has no
  entry after it; the operator gives its record count and the act first **seals** it: it creates the next
  slot as a one-offset SEAL entry at ``first + records``, so a writer that still had the old tail in mind
  either lost that race (and appends after the seal) or won it (and its entry's offset is the end). The
  record then names, for every transaction open just before the entry, the outcome the transaction log
  gives now, so that readers decide those transactions the same way whenever they read;
* **skip it** as a reader (:func:`skipped_lost`: Spark's ``failOnDataLoss=false``,
  ``Consumer(skip_damaged=True)``): the offsets its neighbours give are skipped with a warning, in that
  reader only.

Crash windows of :func:`mark_lost`: dying after the seal and before the record leaves a damaged entry
inside the log (readers stop at it as before); marking it again finds the seal and writes the record. The
record is created with create-if-absent: of two operators marking at once, one record wins and both report
it. Nothing is ever deleted or rewritten.
"""

from __future__ import annotations

import getpass
import json
import socket
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from txn_core.errors import (
    ConfigurationError,
    CorruptDataError,
    DamagedEntryError,
    ObjectExistsError,
    ObjectNotFoundError,
)
from txn_core.format import envelope, paths
from txn_core.format.entry import HEADER_SIZE, EntryHeader, EntryKind, Payload
from txn_core.logs import get_logger
from txn_core.partition.lost import (
    ABORT,
    COMMIT,
    ONGOING,
    UNKNOWN,
    LostEntry,
    list_lost,
    record_key,
)
from txn_core.partition.partition import MISSING_CHECK, PartitionLog
from txn_core.partition.records import entry_table
from txn_core.storage.base import create_resolving

if TYPE_CHECKING:
    from txn_core.clients.context import LogContext, SupportsContext
    from txn_core.format.ids import TxnId

logger = get_logger(__name__)


# --- inspecting --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DamagedEntry:
    """A damaged entry of a topic partition, as an operator sees it (``txnlog maintenance damaged``).

    ``first_offset``/``next_offset`` are what its neighbours (or its intact header) say, None where
    unknown; ``lost`` is its lost-entry record once marked; ``hint`` is what the damaged bytes still
    tell (e.g. a payload that reads as an Arrow stream of N records)."""

    topic: str
    partition: int
    slot: int
    key: str
    check: str
    size: int | None
    first_offset: int | None
    next_offset: int | None
    header_intact: bool
    kind: str | None
    lost: LostEntry | None
    hint: str | None = None

    @property
    def last(self) -> bool:
        """No entry follows it: its record count is unknown until an operator gives it."""
        return self.next_offset is None and not self.header_intact


def find_damaged(log: SupportsContext, topic: str, partition: int, *, payloads: bool = False) -> list[DamagedEntry]:
    """Every damaged entry of one partition, marked lost or not, in slot order.

    Reads every header (one ranged read each, read ahead), and with ``payloads`` every whole entry and
    staged object (checksums and record counts; a control entry's payload checksum too, though readers act
    on its header alone): a task for quiet hours on a large partition.
    """
    ctx = log.context
    from txn_core.partition.readahead import HeaderReadAhead, ReadAhead

    plog = _partition_log(ctx, topic, partition)
    start, _, end = plog.scan_bounds()
    found: dict[int, DamagedEntry] = {}
    for lost in list_lost(ctx.storage, plog.path):
        if lost.slot >= start.slot:
            found[lost.slot] = _inspect(plog, topic, partition, lost.slot, lost.check, None, lost)
    headers = HeaderReadAhead(plog, start.slot)
    for slot in range(start.slot, end):
        if slot in found:
            continue
        try:
            headers.next(slot)
        except DamagedEntryError as exc:
            found[slot] = _inspect(plog, topic, partition, slot, exc.check or str(exc), None, None)
        except ObjectNotFoundError:
            if not plog.is_hole(slot):
                break  # retention ran meanwhile
            found[slot] = _inspect(plog, topic, partition, slot, MISSING_CHECK, None, None)
    if payloads:
        entries = ReadAhead(plog, start.slot, max_depth=8)
        for slot in range(start.slot, end):
            entries.seek(slot)
            try:
                entry = entries.next()
            except DamagedEntryError as exc:
                if slot not in found:
                    found[slot] = _inspect(plog, topic, partition, slot, exc.check or str(exc), exc.header, None)
                continue
            except ObjectNotFoundError:
                if slot in found:
                    continue  # a hole, found above
                break
            if entry.lost is not None or slot in found:
                continue
            try:
                if entry.header.is_control:
                    entry.payload()  # readers act on a marker's header alone; its payload is checked here
                else:
                    entry_table(ctx.storage, entry)
            except CorruptDataError as exc:  # the payload or the staged object it names
                found[slot] = _inspect(plog, topic, partition, slot, exc.check or str(exc), entry.header, None)
    return [found[s] for s in sorted(found)]


def inspect(log: SupportsContext, topic: str, partition: int, slot: int) -> DamagedEntry | None:
    """The entry at ``slot`` if it is damaged (its header or length; or marked lost), else None."""
    ctx = log.context
    plog = _partition_log(ctx, topic, partition)
    lost = plog.lost_entry(slot)
    if lost is not None:
        return _inspect(plog, topic, partition, slot, lost.check, None, lost)
    try:
        plog.fetch_entry(slot)
    except DamagedEntryError as exc:
        return _inspect(plog, topic, partition, slot, exc.check or str(exc), exc.header, None)
    except ObjectNotFoundError:
        if plog.is_hole(slot):
            return _inspect(plog, topic, partition, slot, MISSING_CHECK, None, None)
        return None
    return None


def _inspect(
    plog: PartitionLog,
    topic: str,
    partition: int,
    slot: int,
    check: str,
    header: EntryHeader | None,
    lost: LostEntry | None,
) -> DamagedEntry:
    key = plog.entries.key(slot)
    data: bytes | None
    try:
        data = plog.storage.read(key)
    except ObjectNotFoundError:
        data = None
    first: int | None
    nxt: int | None
    if lost is not None:
        first, nxt = lost.first_offset, lost.next_offset
    elif header is not None:
        first, nxt = header.base_offset, header.next_offset
    else:
        first, nxt = _neighbours(plog, slot)
    return DamagedEntry(
        topic,
        partition,
        slot,
        key,
        check,
        None if data is None else len(data),
        first,
        nxt,
        header is not None or (lost is not None and lost.header_intact),
        header.kind.name if header is not None else None,
        lost,
        None if data is None or header is not None else _hint(data),
    )


def _neighbours(plog: PartitionLog, slot: int) -> tuple[int | None, int | None]:
    first: int | None
    following: int | None
    try:
        first = plog.boundary_before(slot)[0]
    except (DamagedEntryError, ObjectNotFoundError):
        first = None
    try:
        following = plog.read_header(slot + 1).base_offset
    except (DamagedEntryError, ObjectNotFoundError):
        following = None
    return first, following


def _hint(data: bytes) -> str | None:
    """What the bytes after a damaged header still tell, if anything."""
    payload = data[HEADER_SIZE:]
    if not payload:
        return None
    try:
        rows = pa.ipc.open_stream(pa.py_buffer(payload)).read_all().num_rows
        return f"the payload reads as an Arrow stream of {rows} records"
    except (pa.ArrowException, ValueError):
        pass
    try:
        value = json.loads(payload)
    except ValueError:
        return None
    if isinstance(value, dict) and "rows" in value:
        return f"the payload reads as a staged-data reference of {value['rows']} records"
    if isinstance(value, dict) and "outcome" in value:
        return f"the payload reads as a {value['outcome']} marker of transaction {value.get('txn')}"
    return None


# --- marking lost ------------------------------------------------------------------------------


def operator() -> str:
    """``user@host`` of this process, recorded with an operator act."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def _partition_log(ctx: LogContext, topic: str, partition: int) -> PartitionLog:
    """The log of an existing partition (a partition the topic does not have is an error, not a clean one)."""
    count = ctx.topics.get(topic, refresh=False).partitions  # the caller's own read of it, if it made one
    if not 0 <= partition < count:
        count = ctx.topics.get(topic).partitions  # partitions may have been added since
    if not 0 <= partition < count:
        raise ConfigurationError(
            f"topic {topic!r} has {count} partition(s), 0 to {count - 1}: partition {partition} does not exist"
        )
    return ctx.partition_log(paths.partition_log_path(topic, partition))


def mark_lost(
    log: SupportsContext,
    topic: str,
    partition: int,
    slot: int,
    *,
    reason: str,
    records: int | None = None,
    by: str | None = None,
) -> LostEntry:
    """Mark the damaged entry at ``slot`` lost (see module doc); returns its record (the existing one if it
    was marked already). ``records`` is required for a last entry (or one followed by another damaged
    entry), and must agree with the neighbours otherwise.

    Refuses an entry that reads fine, and an entry after a damaged one not marked lost yet (mark them in
    slot order: each one's offsets begin where the previous one's end)."""
    ctx = log.context
    if not reason.strip():
        raise ConfigurationError("marking an entry lost needs a reason (it is recorded in the log)")
    if records is not None and records <= 0:
        raise ConfigurationError(f"records must be at least 1, got {records}")
    plog = _partition_log(ctx, topic, partition)
    path = plog.path
    start, _, end = plog.scan_bounds()
    plog.readable_tail(refresh=True)  # known, it tells a missing slot inside the log (a hole) from the end
    where = f"{topic}-{partition}"
    if not start.slot <= slot < end:
        raise ConfigurationError(f"{where} has no entry at slot {slot} (its entries are slots {start.slot}..{end - 1})")
    existing = plog.lost_entry(slot)
    if existing is not None:
        return existing
    header, check = _damage_of(ctx, plog, slot, where)
    if header is not None:
        first, nxt, timestamp = header.base_offset, header.next_offset, header.timestamp_ms
        if records is not None and records != header.record_count:
            raise ConfigurationError(
                f"slot {slot} of {where} holds {header.record_count} records by its intact header, not {records}"
            )
        outcomes: tuple[tuple[TxnId, str], ...] = ()
        sealed = False
    else:
        try:
            first, timestamp = plog.boundary_before(slot)
        except DamagedEntryError as exc:
            raise ConfigurationError(
                f"slot {exc.slot} of {where}, before slot {slot}, is damaged too and not marked lost: mark the "
                f"damaged entries in slot order (slot {exc.slot} first)"
            ) from exc
        outcomes = _open_outcomes(ctx, path, slot, first, where)  # refuses before the seal writes anything
        nxt, sealed = _end_of(ctx, plog, slot, first, records, where)
    lost = LostEntry(
        path,
        slot,
        first,
        nxt,
        timestamp,
        check,
        header_intact=header is not None,
        outcomes=outcomes,
        reason=reason.strip(),
        by=by or operator(),
        marked_ms=ctx.clock(),
        size=_size(plog, slot),
        sealed=sealed,
    )
    if not envelope.create_json(ctx.storage, record_key(path, slot), envelope.ObjectKind.LOST_ENTRY, lost.to_json()):
        winner = plog.lost_entry(slot)  # another operator marked it at the same time: theirs stands
        if winner is None:  # pragma: no cover - a record, once created, is never deleted but by retention
            raise CorruptDataError(f"{record_key(path, slot)} vanished while marking", record_key(path, slot))
        return winner
    logger.warning("%s (recorded in %s)", lost.describe(), record_key(path, slot))
    return plog.lost_entry(slot) or lost


def _damage_of(ctx: LogContext, plog: PartitionLog, slot: int, where: str) -> tuple[EntryHeader | None, str]:
    """``(intact header or None, the check that fails)`` of a damaged entry; refuses one that reads fine."""
    try:
        entry = plog.fetch_entry(slot)
    except DamagedEntryError as exc:
        return exc.header, exc.check or str(exc)
    except ObjectNotFoundError:
        if not plog.is_hole(slot):
            raise
        return None, MISSING_CHECK
    if not entry.header.is_control:  # a control entry's payload is never needed to read the log
        try:
            entry_table(ctx.storage, entry)
        except CorruptDataError as exc:
            return entry.header, exc.check or str(exc)
    raise ConfigurationError(
        f"slot {slot} of {where} reads fine (header, payload and records check out): there is nothing to mark "
        "lost. 'txnlog maintenance damaged URL' lists the damaged entries."
    )


def _end_of(
    ctx: LogContext, plog: PartitionLog, slot: int, first: int, records: int | None, where: str
) -> tuple[int, bool]:
    """Where the damaged entry at ``slot`` ends, and whether this call sealed it."""
    try:
        following = plog.read_header(slot + 1).base_offset
    except DamagedEntryError:
        if records is None:
            raise ConfigurationError(
                f"slot {slot + 1} of {where}, after slot {slot}, is damaged too: the offsets of slot {slot} are "
                "unknown. Pass --records K, its record count (see 'txnlog maintenance damaged URL')"
            ) from None
        return first + records, False
    except ObjectNotFoundError:
        if records is None:
            raise ConfigurationError(
                f"slot {slot} is the last entry of {where}: its record count is unknown. Pass --records K with K "
                "at least its record count (a larger K is safe: offsets are skipped, never reused; see "
                "'txnlog maintenance damaged URL' for what its bytes still tell)"
            ) from None
        return _seal(ctx, plog, slot, first + records), True
    if records is not None and records != following - first:
        raise ConfigurationError(
            f"slot {slot} of {where} holds offsets [{first}, {following}) by its neighbours: {following - first} "
            f"records, not {records}"
        )
    if following <= first:
        raise CorruptDataError(
            f"the neighbours of slot {slot} of {where} leave it no offsets ([{first}, {following}))",
            plog.entries.key(slot),
        )
    return following, False


def _seal(ctx: LogContext, plog: PartitionLog, slot: int, end: int) -> int:
    """Create the SEAL entry at ``slot + 1`` starting at ``end``; returns where the damaged entry ends (the
    base offset of whatever entry won slot ``slot + 1``)."""
    payload = Payload.of_json({"lost_slot": slot, "reason": "seals the damaged last entry before it"})
    header = EntryHeader(
        EntryKind.SEAL, end, 1, -1, 0, -1, None, ctx.clock(), payload.length, payload.crc, uuid.uuid4().bytes
    ).encode()
    try:
        create_resolving(ctx.storage, plog.entries.key(slot + 1), [header, *payload.chunks], header)
    except ObjectExistsError:
        return plog.read_header(slot + 1).base_offset  # a writer appended after it first: its offset stands
    return end


def _open_outcomes(ctx: LogContext, path: str, slot: int, first: int, where: str) -> tuple[tuple[TxnId, str], ...]:
    """The transactions open just before ``slot`` (whose entry begins at offset ``first``), with their outcome
    in the transaction log now. Scanned from a snapshot at or before ``first``: a newer one, taken before
    the entry was damaged, holds the buffer as it stood after it."""
    state = ctx.partition_state(path, shared=False)
    state.write_snapshots = False
    state.reload(at_most=first)
    state.scan_to_end()
    if state.buffer.slot != slot:
        damage = state.damage
        raise ConfigurationError(
            f"the entries of {where} before slot {slot} cannot be read to it"
            + (f": slot {damage.slot} is damaged and not marked lost (mark it first)" if damage is not None else "")
        )
    out = []
    for txn in list(state.buffer.by_txn):
        status = state.resolver(txn)
        if status.state is None:
            outcome = UNKNOWN
        elif status.decided:
            committed = status.committed and (not status.participants or path in status.participants)
            outcome = COMMIT if committed else ABORT
        else:
            outcome = ONGOING
        out.append((txn, outcome))
    return tuple(out)


def _size(plog: PartitionLog, slot: int) -> int | None:
    try:
        return plog.storage.size(plog.entries.key(slot))
    except (ObjectNotFoundError, OSError):
        return None
