"""Rolling a partition's decided history into segments, and deleting what they replace (PROTOCOL.md
"Segments").

:class:`Roller` rolls one partition log. Each :meth:`Roller.roll`:

1. brings its transaction buffer to the end and computes the read bound (aborting transactions past their
   timeout, resolving zombie writes); the **stable slot** is the first slot whose entry starts at or after
   the buffer's max read position, so every transaction with data below it has its marker here (or was
   decided by a lost entry's record: :meth:`~txn_core.partition.buffer.TxnBuffer.decided_read_position`);
2. re-reads the segment listing and the log start; the **chain end** (the end of the last segment, or the
   log start) is where the next segment starts;
3. while the entries between the chain end and the stable slot reach the policy (:class:`RollPolicy`),
   reads them in slot order with the staged objects of their committed references, and creates
   ``segments/<chain end>`` (create-if-absent; a lost race continues after the winner);
4. deletes the loose entries of segments older than ``min_age_ms`` (and the staged objects of the
   references they inlined), found with one LIST of the loose slots.

Invariants: a segment never passes the stable slot; segments chain (each starts where the last ends);
memory is bounded by one segment (``max_bytes``) plus the read-ahead window; a call costs the entries
appended since the previous call (a long-lived :class:`Roller` keeps its buffer), plus the ones it rolls
and deletes.

Crash windows (every step is safe to die after): before the create nothing changed; the create is atomic
(an unknown outcome is resolved by reading the segment's header back); after it, the loose entries stay
until a later call deletes them; a staged object is deleted before its entry, so a crash between them
leaves a loose reference whose rows the segment holds, which readers take from the segment.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from txn_core.clock import monotonic
from txn_core.errors import ConfigurationError, CorruptDataError, ObjectExistsError, ObjectNotFoundError
from txn_core.format import paths
from txn_core.format.entry import HEADER_SIZE, EntryHeader, EntryKind, decode_header, decode_json, verify_payload
from txn_core.format.segment import (
    ROW_SIZE,
    SEGMENT_HEADER_SIZE,
    Form,
    SegmentRow,
    decode_segment_header,
    encode_segment,
)
from txn_core.logs import get_logger
from txn_core.partition.buffer import Disposition
from txn_core.partition.lost import COMMIT, ONGOING, LostEntry
from txn_core.partition.partition import Entry, PartitionLog
from txn_core.partition.readahead import HeaderReadAhead, ReadAhead
from txn_core.partition.records import StagedDataMissingError
from txn_core.partition.segments import SEGMENT_MAX_ENTRIES
from txn_core.partition.state import PartitionState
from txn_core.storage.base import Storage, create_resolving
from txn_core.storage.parallel import parallel_map

if TYPE_CHECKING:
    from txn_core.clients.context import SupportsContext

logger = get_logger(__name__)

#: Roll when this many entries lie between the chain end and the stable slot...
ROLL_ENTRIES = 1000
#: ...or this many bytes (the entries' own sizes, as the buffer counts them).
ROLL_BYTES = 16 << 20
#: A segment is assembled in memory: at most this many bytes (entries, inlined rows and index).
SEGMENT_MAX_BYTES = 64 << 20
#: Loose entries a segment covers, and their staged objects, are deleted only when the segment and the
#: entry are older than this (PROTOCOL.md "Segments"); retention's minimum entry age is the same.
MIN_AGE_MS = 10 * 60 * 1000
#: Staged objects read at once while assembling a segment.
STAGED_BATCH = 64


@dataclass(frozen=True, slots=True)
class RollPolicy:
    """When to roll (``entries`` or ``bytes`` decided since the last segment) and how large a segment may
    grow (``max_entries``, ``max_bytes``)."""

    entries: int = ROLL_ENTRIES
    bytes: int = ROLL_BYTES
    max_entries: int = SEGMENT_MAX_ENTRIES
    max_bytes: int = SEGMENT_MAX_BYTES

    def __post_init__(self) -> None:
        for name in ("entries", "bytes", "max_entries", "max_bytes"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ConfigurationError(f"roll policy: {name} must be a positive integer, got {getattr(self, name)!r}")


@dataclass(frozen=True, slots=True)
class RollResult:
    """What one :meth:`Roller.roll` did on one partition log."""

    path: str
    segments: int  # segments this call created
    entries: int  # entries in them
    bytes: int  # their size
    lost: int  # segments another roller created first (their ranges skipped)
    chain_end: int  # the slot the next segment starts at
    stable_slot: int  # the first slot that may not be rolled yet
    deleted_entries: int  # loose entries deleted (covered by segments older than the minimum age)
    deleted_staged: int  # staged objects deleted with them


class _SizedState(PartitionState):
    """The roller's buffer: also remembers the size of every entry it applies (the bytes policy)."""

    def __init__(self, plog: PartitionLog, log: SupportsContext) -> None:
        ctx = log.context
        super().__init__(plog, ctx.coordinator.resolve)
        self.sizes: dict[int, int] = {}

    def apply(self, slot: int, header: EntryHeader, size: int, lost: LostEntry | None = None) -> Disposition:
        self.sizes[slot] = size
        return super().apply(slot, header, size, lost)

    def forget_below(self, slot: int) -> None:
        for s in [s for s in self.sizes if s < slot]:
            del self.sizes[s]


class Roller:
    """Rolls the partition log at ``path`` (see module doc). Keep one per partition in a long-lived process
    so that each call costs only what was appended since; not thread-safe (one thread rolls)."""

    def __init__(self, log: SupportsContext, path: str, policy: RollPolicy | None = None) -> None:
        self.ctx = ctx = log.context
        self.path = path
        self.policy = policy or RollPolicy()
        # An instance of its own: a roller runs on a thread of its own next to producers and readers.
        self.plog = PartitionLog(ctx.storage, path, clock=ctx.clock)
        self.state = _SizedState(self.plog, ctx)
        #: loose entries below this slot are known deleted (by this roller); None: not known yet
        self.cleaned_through: int | None = None
        self._created: dict[int, tuple[int, int]] = {}  # segment first slot -> (end slot, created_ms)

    def roll(self, *, min_age_ms: int = MIN_AGE_MS, now_ms: int | None = None, cleanup: bool = True) -> RollResult:
        """Roll what the policy allows, then delete loose entries of segments older than ``min_age_ms``."""
        state, plog, catalog = self.state, self.plog, self.plog.segments
        state.scan_to_end()
        state.read_bound()  # decides timed-out and zombie transactions (markers may land)
        state.scan_to_end()
        buffer = state.buffer
        # A transaction whose marker may be a lost entry is decided by that entry's record, as readers decide it.
        stable = buffer.decided_read_position(blocked=state.damage is not None)
        stable_slot = buffer.slot if stable == buffer.position else plog.slot_for_offset(stable)
        catalog.refresh(lambda: plog.log_start(refresh=True))  # the two listings at once
        start = plog.log_start()
        chain = catalog.chain_end()
        slot = max(start.slot, chain if chain is not None else start.slot)
        made = rolled = written = lost = 0
        while slot < stable_slot and self._due(slot, stable_slot):
            rows = self._assemble(slot, stable_slot)
            if not rows:  # an entry marked lost: it stays a loose object; the next segment starts after it
                slot += 1
                continue
            chunks = encode_segment(slot, rows, self.ctx.clock(), uuid.uuid4().bytes)
            key = catalog.key(slot)
            end = slot + len(rows)
            try:
                create_resolving(self.ctx.storage, key, chunks, chunks[0])
            except ObjectExistsError:
                lost += 1
                end = catalog.end_of(slot)  # another roller's segment: go on after it
                logger.info("%s: segment %s was rolled by another process; continuing at slot %d", self.path, key, end)
            else:
                made, rolled = made + 1, rolled + len(rows)
                written += sum(len(memoryview(c)) for c in chunks)
                self._created[slot] = (end, decode_segment_header(chunks[0], key).created_ms)
                logger.info("%s: rolled slots [%d, %d) into %s", self.path, slot, end, key)
            slot = end
        state.forget_below(slot)
        if made or lost:
            catalog.refresh()
        deleted = staged = 0
        if cleanup:
            deleted, staged = self._cleanup(min_age_ms, self.ctx.clock() if now_ms is None else now_ms)
        return RollResult(self.path, made, rolled, written, lost, slot, stable_slot, deleted, staged)

    # --- policy ---------------------------------------------------------------------------------

    def _due(self, slot: int, stop: int) -> bool:
        """Whether the entries ``[slot, stop)`` reach the policy (entries, else their bytes)."""
        if stop - slot >= self.policy.entries:
            return True
        sizes = self.state.sizes
        unknown = [s for s in range(slot, stop) if s not in sizes]
        total = sum(sizes.get(s, 0) for s in range(slot, stop))
        if unknown:  # applied before this roller's buffer was loaded: read their headers
            headers = HeaderReadAhead(self.plog, unknown[0])
            for s in unknown:
                total += HEADER_SIZE + headers.next(s).payload_len
        return total >= self.policy.bytes

    # --- assembling -----------------------------------------------------------------------------

    def _assemble(self, slot: int, stop: int) -> list[SegmentRow]:
        """The rows of the next segment from ``slot`` (at most up to ``stop`` and the policy's limits). A
        segment ends before an entry marked lost (PROTOCOL.md "Damage"): [] when ``slot`` holds one."""
        policy = self.policy
        ahead = ReadAhead(self.plog, slot)
        rows: list[SegmentRow] = []
        refs: list[tuple[int, Entry, dict[str, Any]]] = []
        total = SEGMENT_HEADER_SIZE
        while slot + len(rows) < stop and len(rows) < policy.max_entries:
            entry = ahead.next()
            if entry.lost is not None:
                break
            header = entry.header
            entry.payload()  # verified before it is copied: a damaged entry never becomes a segment
            size = ROW_SIZE + len(entry.data)
            ref: dict[str, Any] | None = None
            form = Form.ENTRY
            if header.kind == EntryKind.DATA_REF:
                ref = decode_json(entry.payload(), entry.key)
                size += int(ref["size"]) - HEADER_SIZE
                # Rows readers deliver MUST be inlined; aborted or skipped rows are kept while their staged
                # object exists (read_uncommitted readers see them), else dropped (as they see them now).
                form = Form.INLINED if self._delivered(header) else Form.HIDDEN
            if rows and total + size > policy.max_bytes:
                break
            total += size
            if ref is not None:
                refs.append((len(rows), entry, ref))
            rows.append(SegmentRow(header, entry.data, form))
        for i in range(0, len(refs), STAGED_BATCH):
            batch = refs[i : i + STAGED_BATCH]
            for (at, entry, ref), payload in zip(
                batch, parallel_map(self._staged_payload, batch, leaf=True), strict=True
            ):
                if payload is None:
                    rows[at] = SegmentRow(entry.header, entry.data, Form.DROPPED)
                else:
                    rows[at] = SegmentRow(entry.header, entry.data, rows[at].form, payload, int(ref["crc"]))
        return rows

    # --- cleanup --------------------------------------------------------------------------------

    def _segment_info(self, first: int) -> tuple[int, int]:
        """(end slot, created_ms) of the segment at ``first`` (its 80-byte header, unless known)."""
        info = self._created.get(first)
        if info is None:
            key = self.plog.segments.key(first)
            header = decode_segment_header(self.ctx.storage.read(key, 0, SEGMENT_HEADER_SIZE), key)
            info = self._created[first] = (header.end_slot, header.created_ms)
        return info

    def _cleanup(self, min_age_ms: int, now_ms: int) -> tuple[int, int]:
        """Delete the loose entries of segments older than ``min_age_ms`` (see module doc, step 4)."""
        catalog = self.plog.segments
        firsts = catalog.listing() or []
        if not firsts:
            return 0, 0
        present: list[int] | None = None
        if self.cleaned_through is None:
            present = sorted(self.plog.entries.list_slots())
            chain = catalog.chain_end() or 0
            if not present or present[0] >= chain:
                self.cleaned_through = chain
                return 0, 0
            lowest = present[0]
            firsts = [f for i, f in enumerate(firsts) if i + 1 == len(firsts) or firsts[i + 1] > lowest]
        else:  # segments below it were cleaned by this roller; cleaned_through is a segment boundary
            floor = self.cleaned_through
            firsts = [f for f in firsts if f >= floor]
        aged = []
        for first in firsts:
            end, created = self._segment_info(first)
            if now_ms - created < min_age_ms:
                break  # later segments are younger: their turn comes at a later call
            aged.append((first, end))
        if not aged:
            return 0, 0
        if present is None:
            present = sorted(self.plog.entries.list_slots())
        deleted = staged = 0
        clean = True
        for first, end in aged:
            loose = [s for s in present if first <= s < end]
            if not loose:
                continue
            seg = catalog.open(first)
            headers = {s: seg.entry_header(s) for s in loose}
            old = [s for s in loose if now_ms - headers[s].timestamp_ms >= min_age_ms]
            clean = clean and len(old) == len(loose)
            forms = seg.forms()
            inlined = [s for s in old if forms[s - first] == Form.INLINED]
            keys = [k for k in parallel_map(self._staged_key, inlined, leaf=True) if k is not None]
            parallel_map(self.ctx.storage.delete, keys, leaf=True)
            parallel_map(self.ctx.storage.delete, [self.plog.entries.key(s) for s in old], leaf=True)
            deleted, staged = deleted + len(old), staged + len(keys)
        if clean:
            self.cleaned_through = max(self.cleaned_through or 0, aged[-1][1])
        return deleted, staged

    def _staged_key(self, slot: int) -> str | None:
        """The staged object a loose DATA_REF names (None: the entry is gone already)."""
        key = self.plog.entries.key(slot)
        try:
            data = self.ctx.storage.read(key)
        except ObjectNotFoundError:
            return None
        header = decode_header(data, key)
        return str(json.loads(bytes(verify_payload(header, data, key)))["key"])

    def _staged_payload(self, item: tuple[int, Entry, dict[str, Any]]) -> Any:
        """The staged payload of the reference at ``item``; None for aborted or skipped rows whose staged
        object is gone (rows readers deliver MUST be there: :class:`StagedDataMissingError`)."""
        _at, entry, ref = item
        try:
            return staged_payload(self.ctx.storage, entry, ref)
        except StagedDataMissingError:
            if self._delivered(entry.header):
                raise
            return None

    def _delivered(self, header: EntryHeader) -> bool:
        """Whether read_committed readers deliver the rows of the entry ``header`` below the stable slot. A
        transaction still open in the buffer there was decided by a lost entry's record (its marker may
        have been that entry): its rows are delivered only if the record says commit."""
        if self.state.classify(header) not in (Disposition.DATA, Disposition.TXN_DATA):
            return False
        return header.txn is None or self.state.buffer.lost_outcomes.get(header.txn) in (None, ONGOING, COMMIT)


def staged_payload(storage: Storage, entry: Entry, ref: dict[str, Any]) -> Any:
    """The payload of a reference's staged object, verified against the reference (size, checksum, rows)."""
    target = str(ref["key"])
    try:
        data = storage.read_buffer(target)
    except ObjectNotFoundError as exc:
        raise StagedDataMissingError(
            f"{entry.key} (committed) references {target}, which does not exist; the partition cannot be rolled "
            "past it (readers fail at it too). Restore the staged object.",
            target,
        ) from exc
    header = decode_header(data, target)
    if (
        len(data) != int(ref["size"])
        or header.payload_crc != int(ref["crc"])
        or header.record_count != int(ref["rows"])
        or header.record_count != entry.header.record_count
    ):
        raise CorruptDataError(f"{target} does not match the reference in {entry.key} (size, checksum or rows)", target)
    return verify_payload(header, data, target)


# --- rolling in the background ----------------------------------------------------------------


#: A partition the background roller has not looked at for this long is looked at after its next append
#: (the bytes policy, and entries other writers appended, are seen at least this often).
CHECK_INTERVAL_S = 60.0


class BackgroundRoller:
    """Rolls partitions on a thread of its own, one run at a time, keeping one :class:`Roller` per partition
    (the Spark sink's commit worker calls :meth:`appended` after each commit). A partition is looked at when
    it is new to this roller, when the entries appended to it since it was last looked at reach the policy,
    or :data:`CHECK_INTERVAL_S` after that: a look costs a few requests, so it is not paid per commit.
    Errors are logged, never raised: rolling is an optimisation, a later look tries again."""

    def __init__(
        self,
        log: SupportsContext,
        policy: RollPolicy | None = None,
        min_age_ms: int = MIN_AGE_MS,
        *,
        check_min_age: bool = True,
    ) -> None:
        ctx = log.context
        if check_min_age:
            from txn_core.partition.ages import SAFE_ENTRY_AGE_MS, check_min_age_of

            check_min_age_of("background rolling", min_age_ms, SAFE_ENTRY_AGE_MS)
        self.ctx = ctx
        self.policy = policy or RollPolicy()
        self.min_age_ms = min_age_ms
        self._rollers: dict[str, Roller] = {}
        self._lock = threading.Lock()
        self._wanted: set[str] = set()
        self._since: dict[str, int] = {}  # entries appended since the partition was last looked at
        self._looked: dict[str, float] = {}  # when it was (monotonic)
        self._thread: threading.Thread | None = None
        self.runs = 0

    def appended(self, topic: str, entries: dict[int, int]) -> None:
        """``entries[p]`` entries were appended to partition ``p``: roll the partitions that are due soon
        (now, or after the run in progress)."""
        now = monotonic(self.ctx.clock)()
        with self._lock:
            for partition, n in entries.items():
                path = paths.partition_log_path(topic, partition)
                since = self._since[path] = self._since.get(path, 0) + n
                looked = self._looked.get(path)
                if looked is None or since >= self.policy.entries or now - looked >= CHECK_INTERVAL_S:
                    self._wanted.add(path)
            if not self._wanted or (self._thread is not None and self._thread.is_alive()):
                return
            self._thread = threading.Thread(target=self._run, name="txnlog-roll", daemon=True)
            self._thread.start()

    def wait(self, timeout: float | None = None) -> None:
        """Wait for the run in progress (tests, orderly shutdown)."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._lock:
                wanted, self._wanted = sorted(self._wanted), set()
                if not wanted:
                    self._thread = None
                    return
            for path in wanted:
                with self._lock:
                    self._since[path], self._looked[path] = 0, monotonic(self.ctx.clock)()
                roller = self._rollers.get(path)
                if roller is None:
                    roller = self._rollers[path] = Roller(self.ctx, path, self.policy)
                started = time.perf_counter()
                try:
                    result = roller.roll(min_age_ms=self.min_age_ms)
                except Exception as exc:  # an optimisation failing: logged, never raised into the commits
                    self._rollers.pop(path, None)  # start afresh next time
                    logger.warning("rolling %s failed (it is retried after the next commit): %r", path, exc)
                    continue
                if result.segments or result.deleted_entries:
                    logger.info(
                        "%s: %d segment(s), %d entries rolled, %d loose entries deleted (%.0f ms)",
                        path,
                        result.segments,
                        result.entries,
                        result.deleted_entries,
                        (time.perf_counter() - started) * 1000,
                    )
            self.runs += 1
