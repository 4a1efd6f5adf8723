"""Maintenance: retention, snapshots, transaction-log compaction, rolling into segments, staged-data cleanup
(PROTOCOL.md "Retention", "Segments" and "Compaction").

Retention of a partition, in this order (each step is safe to crash after):

1. scan the partition's transaction buffer to the end; pick the new log start: the first entry to keep,
   never beyond the first entry of an open transaction (its data must survive until it ends), and never
   an entry younger than ``min_age_ms`` (a stalled writer's cached tail must not point into deleted
   slots; see "Stale writers" in PROTOCOL.md);
2. publish the log start: create ``<path>/start/<020d slot>`` holding ``{slot, offset}``;
3. write a buffer snapshot at the current position with everything below the new start pruned;
4. delete the entries below the start (and the staged objects their DATA_REF entries name), oldest first:
   the loose entries still present (one LIST; slots rolled into segments are read from them), then the
   segments whose end lies at or below the start, then the lost-entry marks below it (PROTOCOL.md
   "Damage").

It never reaches past a damaged entry not marked lost: the buffer stops there, and so does the walk.

Readers that meet a missing entry below the published start raise :class:`DataLossError` (or skip
forward when told to), never read past a hole silently.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from txn_core.errors import ConfigurationError, CorruptDataError, ObjectNotFoundError
from txn_core.format import envelope, paths
from txn_core.format.entry import HEADER_SIZE, EntryKind, decode_header, verify_payload
from txn_core.logs import get_logger
from txn_core.ops.rolling import MIN_AGE_MS, Roller, RollPolicy, RollResult
from txn_core.partition.ages import SAFE_ENTRY_AGE_MS, check_min_age_of
from txn_core.partition.lost import list_lost
from txn_core.partition.snapshots import SnapshotStore
from txn_core.partition.staging import name_prefix

if TYPE_CHECKING:
    from txn_core.clients.context import LogContext, SupportsContext

logger = get_logger(__name__)

#: Entries younger than this are never deleted by retention (stale-writer guard; PROTOCOL.md), nor by the
#: cleanup after a roll.
MIN_ENTRY_AGE_MS = MIN_AGE_MS
#: The least age at which unreferenced staged objects are swept (unless told not to check): a batch's staged
#: objects are unreferenced until it commits, and sweeping them before would commit references to deleted
#: data (its rows unreadable, as damage).
SAFE_STAGED_AGE_MS = 3600 * 1000


#: What sweeping staged objects too young risks.
STAGED_RISK = "a batch still being written or committed would commit references to deleted objects (rows lost)"


START_MARKERS_KEPT = 2


@dataclass(frozen=True, slots=True)
class RetentionResult:
    topic: str
    partition: int
    old_start: int
    new_start: int
    entries_deleted: int
    bytes_deleted: int


def apply_retention(
    log: SupportsContext,
    topic: str,
    *,
    retention_ms: int | None = None,
    retention_bytes: int | None = None,
    min_age_ms: int = MIN_ENTRY_AGE_MS,
    now_ms: int | None = None,
    check_min_age: bool = True,
) -> list[RetentionResult]:
    """Delete what the topic's retention (or the arguments) no longer keeps, for every partition.
    ``min_age_ms`` below :data:`SAFE_ENTRY_AGE_MS` is refused unless ``check_min_age`` is false."""
    ctx = log.context
    if check_min_age:
        check_min_age_of("retention", min_age_ms, SAFE_ENTRY_AGE_MS)
    meta = ctx.topics.get(topic)
    retention_ms = meta.config.retention_ms if retention_ms is None else retention_ms
    retention_bytes = meta.config.retention_bytes if retention_bytes is None else retention_bytes
    if retention_ms is None and retention_bytes is None:
        raise ConfigurationError(
            f"topic {topic!r} keeps everything (no retention_ms or retention_bytes set); set one with "
            "Log.set_retention() or pass it explicitly"
        )
    now_ms = ctx.clock() if now_ms is None else now_ms
    return [_retain(ctx, topic, p, retention_ms, retention_bytes, min_age_ms, now_ms) for p in range(meta.partitions)]


def _retain(
    ctx: LogContext,
    topic: str,
    partition: int,
    retention_ms: int | None,
    retention_bytes: int | None,
    min_age_ms: int,
    now_ms: int,
) -> RetentionResult:
    path = paths.partition_log_path(topic, partition)
    plog = ctx.partition_log(path)
    state = ctx.partition_state(path)
    state.scan_to_end()
    start = plog.log_start(refresh=True)
    tail_slot, _end = plog.readable_tail(refresh=True)
    # Never delete data of a transaction that is still open, nor anything from a damaged entry not marked
    # lost on (the buffer stops there: what it does not know it does not delete).
    limit = state.read_bound()
    total = state.buffer.size_bytes
    # Walk entries from the start, deciding how far retention reaches.
    slot, offset, freed = start.slot, start.offset, 0
    headers = []
    while slot < min(tail_slot, state.buffer.slot):
        header = plog.read_header(slot)
        size = HEADER_SIZE + header.payload_len
        expired = retention_ms is not None and now_ms - header.timestamp_ms > retention_ms
        oversize = retention_bytes is not None and total - freed > retention_bytes
        if not (expired or oversize) or header.next_offset > limit or now_ms - header.timestamp_ms < min_age_ms:
            break
        headers.append((slot, header))
        freed += size
        slot, offset = slot + 1, header.next_offset
    if slot == start.slot:
        return RetentionResult(topic, partition, start.offset, start.offset, 0, 0)
    # 2. publish the new start before deleting anything
    envelope.create_json(
        ctx.storage,
        paths.log_start(path) + paths.slot_name(slot),
        envelope.ObjectKind.LOG_START,
        {"slot": slot, "offset": offset, "time_ms": now_ms, "bytes_before": start.bytes_before + freed},
    )
    plog.log_start(refresh=True)
    # 3. a snapshot at or after the new start, so no reader rebuilds from the start (readers prune what
    #    a snapshot still says about deleted offsets when they load it)
    store = SnapshotStore(ctx.storage, path, clock=ctx.clock)
    finals = store.finals()
    if not finals or finals[-1] < offset:
        store.write(state.buffer.copy(), log_start=offset)
    state.buffer.prune(offset)
    # 4. delete, oldest first: the loose entries still present, then the segments wholly below the start
    present = set(plog.entries.list_slots())
    for s, header in headers:
        if s not in present:
            continue  # rolled into a segment and deleted since
        key = plog.entries.key(s)
        if header.kind == EntryKind.DATA_REF:
            try:
                data = ctx.storage.read(key)
                ref = json.loads(bytes(verify_payload(header, data, key)))
                ctx.storage.delete(str(ref["key"]))
            except (ObjectNotFoundError, CorruptDataError):
                pass  # a damaged reference names nothing for sure: its staged object is left to the sweep
        ctx.storage.delete(key)
    for first in plog.segments.refresh():
        if first < slot and plog.segments.end_of(first) <= slot:
            ctx.storage.delete(plog.segments.key(first))
    plog.segments.refresh()
    for name in paths.slot_names(ctx.storage.list(paths.lost_entries(path))):  # a lost mark goes with its entry
        if int(name) < slot:
            ctx.storage.delete(paths.lost_entries(path) + name)
    markers = paths.slot_names(ctx.storage.list(paths.log_start(path)))
    for name in markers[:-START_MARKERS_KEPT]:
        ctx.storage.delete(paths.log_start(path) + name)
    return RetentionResult(topic, partition, start.offset, offset, len(headers), freed)


def roll_segments(
    log: SupportsContext,
    topic: str,
    *,
    policy: RollPolicy | None = None,
    min_age_ms: int = MIN_ENTRY_AGE_MS,
    now_ms: int | None = None,
    check_min_age: bool = True,
) -> list[RollResult]:
    """Roll every partition of ``topic`` into segments as far as ``policy`` allows, and delete the loose
    entries (and staged objects) of segments older than ``min_age_ms`` (PROTOCOL.md "Segments"). Safe at
    any time, next to producers, readers, retention and other rollers; for cron use (the Spark sink rolls
    by itself after its commits). Each partition gets a fresh :class:`~txn_core.ops.rolling.Roller`: it starts
    from the newest buffer snapshot, so a call costs the entries since that snapshot plus what it rolls.
    ``min_age_ms`` below :data:`SAFE_ENTRY_AGE_MS` is refused unless ``check_min_age`` is false."""
    ctx = log.context
    if check_min_age:
        check_min_age_of("rolling", min_age_ms, SAFE_ENTRY_AGE_MS)
    meta = ctx.topics.get(topic)
    return [
        Roller(ctx, paths.partition_log_path(topic, p), policy).roll(min_age_ms=min_age_ms, now_ms=now_ms)
        for p in range(meta.partitions)
    ]


def take_snapshots(log: SupportsContext, topic: str) -> list[int]:
    """Write a transaction-buffer snapshot of every partition now; returns their positions."""
    ctx = log.context
    meta = ctx.topics.get(topic)
    out = []
    for p in range(meta.partitions):
        path = paths.partition_log_path(topic, p)
        state = ctx.partition_state(path)
        state.scan_to_end()
        start = ctx.partition_log(path).log_start(refresh=True)
        out.append(SnapshotStore(ctx.storage, path, clock=ctx.clock).write(state.buffer.copy(), log_start=start.offset))
    return out


def compact_transaction_log(log: SupportsContext, *, min_age_ms: int | None = None, check_min_age: bool = True) -> int:
    """Snapshot every coordinator partition and delete transaction-log records below the snapshots that
    are older than ``min_age_ms`` (default and least: one hour, as writers trust a slot they saw free for
    half of it; PROTOCOL.md "Appending without a read"; below it only with ``check_min_age`` false).
    Returns records deleted."""
    ctx = log.context
    from txn_core.coordinator.txnlog import COMPACTION_MIN_AGE_MS

    age = COMPACTION_MIN_AGE_MS if min_age_ms is None else min_age_ms
    if check_min_age:
        check_min_age_of("transaction-log compaction", age, COMPACTION_MIN_AGE_MS)
    deleted = 0
    for c in range(ctx.coordinator_partitions):
        view = ctx.views.get(c)
        view.snapshot_now()
        deleted += view.compact(age)
    return deleted


#: How many times the staging sweep scans a partition whose loose floor moved past its scan's end meanwhile,
#: before it keeps all of that partition's staged objects instead.
SWEEP_BOUND_CHECKS = 4


def _collect_references(
    ctx: LogContext, topic: str, p: int, slots: range, referenced: set[str], unknown: set[str]
) -> None:
    """Add the staged objects the loose DATA_REF entries of partition ``p`` of ``topic`` in ``slots`` reference
    to ``referenced``; a hole or a damaged entry there adds the partition's staged-object prefix to ``unknown``."""
    plog = ctx.partition_log(paths.partition_log_path(topic, p))
    prefix = name_prefix(topic, p)
    for slot in slots:
        key = plog.entries.key(slot)
        try:
            data = ctx.storage.read(key)
            header = decode_header(data, key)
            if header.kind == EntryKind.DATA_REF:
                referenced.add(str(json.loads(bytes(verify_payload(header, data, key)))["key"]))
        except ObjectNotFoundError:
            if plog.is_hole(slot):  # deleted by hand or lost: it may have referenced any of them
                unknown.add(prefix)
                logger.warning("%s is missing: the staged objects of %s-%d are all kept", key, topic, p)
            continue
        except (CorruptDataError, ValueError, KeyError) as exc:
            unknown.add(prefix)
            logger.warning(
                "%s is damaged (%s): the staged objects of %s-%d are all kept, since it may reference any",
                key,
                getattr(exc, "check", None) or exc,
                topic,
                p,
            )


def sweep_staging(
    log: SupportsContext,
    *,
    older_than_ms: int = 24 * 3600 * 1000,
    now_ms: int | None = None,
    check_min_age: bool = True,
) -> int:
    """Delete staged objects older than ``older_than_ms`` that no DATA_REF entry references.

    A staged object is referenced only when its batch commits, after its writer staged it: ``older_than_ms``
    below :data:`SAFE_STAGED_AGE_MS` is refused unless ``check_min_age`` is false (no batch is being written).

    References are collected from every partition's DATA_REF entries (a full header scan plus a read of
    each reference), so this is a maintenance task for quiet hours, not a hot path. A damaged entry (marked
    lost or not) may be a reference nobody can read: every staged object of its partition is kept.
    """
    ctx = log.context
    if check_min_age:
        check_min_age_of(
            "sweeping staged objects", older_than_ms, SAFE_STAGED_AGE_MS, risk=STAGED_RISK, when="no batch is written"
        )
    now_ms = ctx.clock() if now_ms is None else now_ms
    referenced: set[str] = set()
    #: staged-object name prefixes (``<topic>-<05d p>-``) of partitions holding an entry whose reference
    #: cannot be read: any of their staged objects may be the one it names, so all of them are kept
    unknown: set[str] = set()
    for topic in ctx.topics.list(include_internal=True):
        meta = ctx.topics.get(topic)
        for p in range(meta.partitions):
            plog = ctx.partition_log(paths.partition_log_path(topic, p))
            prefix = name_prefix(topic, p)
            start, floor, end = plog.scan_bounds()
            if any(lost.slot >= start.slot for lost in list_lost(ctx.storage, plog.path)):
                unknown.add(prefix)  # a lost entry may have been a reference nobody can read now
                continue
            # Rolled entries hold their references' rows inlined (PROTOCOL.md "Segments"): only loose entries
            # from the segments' chain end on can still need a staged object. The floor is read again after
            # each scan: if retention or a roll's cleanup deleted loose entries from the floor on between
            # reading it and probing past it, a deleted slot passed for the end of the log, and the floor has
            # since moved past that end. Entries appended after the scan name young staged objects (kept by age).
            for _ in range(SWEEP_BOUND_CHECKS):
                _collect_references(ctx, topic, p, range(floor, end), referenced, unknown)
                _, fresh_floor, fresh_end = plog.scan_bounds()
                if fresh_floor <= end:
                    break
                floor, end = fresh_floor, fresh_end
            else:
                unknown.add(prefix)  # its history kept moving under the scan: keep all its staged objects
    deleted = 0
    for owner in ctx.storage.list(paths.STAGING):
        for batch in ctx.storage.list(paths.STAGING + owner):
            prefix = paths.STAGING + owner + batch
            for name in ctx.storage.list(prefix):
                key = prefix + name
                if key in referenced or name.endswith("/") or name.startswith(tuple(unknown)):
                    continue
                mtime = ctx.storage.mtime_ms(key)
                if mtime is not None and now_ms - mtime < older_than_ms:
                    continue
                ctx.storage.delete(key)
                deleted += 1
    return deleted
