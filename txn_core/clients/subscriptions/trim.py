"""Bounded growth: snapshots, ack-log trimming and lease cleanup (PROTOCOL.md "Subscriptions",
"Snapshots and trimming").

The snapshot list is the index from acknowledged position to log position: snapshot ``state/<slot>.<ms>``
records the cursor (mark-delete position and the acknowledgements above it) and the pending
acknowledgements as of ack-log slot ``slot``. Entries below a snapshot's slot are no longer needed by
anyone who starts from it, so the ack log is trimmed to the **anchor**: the newest snapshot written at
least ``min_age_ms`` ago. The age guard protects writers that appended an entry and are replaying up to it
to learn their verdict, and appenders with a stale cached tail (PROTOCOL.md "Retention").

Unlike Pulsar's pending-ack store, which trims only when a new acknowledgement arrives (so the last
stretch of the log, whose mark-delete only moves when the final commit marker lands, is never trimmed
when acknowledgements stop — the seed's open question), trimming here runs on every access to the
subscription (consumers poll even when idle) and from :func:`trim_subscription` for a cron when no
consumer runs: at most ``min_age_ms`` plus one snapshot interval after the last change, the ack log is
empty below its tail.

Steps, each safe to crash after (as retention of a topic partition):

1. catch up; write a snapshot at the current slot if anything changed since the last one;
2. choose the anchor; publish the ack log's log start ``acks/start/<anchor slot>`` before deleting;
3. delete entries below the anchor, oldest first; delete snapshots below the anchor except that the
   anchor and the newest :data:`SNAPSHOTS_KEPT` stay;
4. delete the lease objects of offset ranges entirely below the mark-delete position.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from txn_core.clients.subscriptions.acklog import AckLog
from txn_core.clients.subscriptions.leases import LeaseStore, ListedLeaseStore
from txn_core.errors import CorruptDataError, ObjectNotFoundError
from txn_core.format import envelope, paths

if TYPE_CHECKING:
    from txn_core.clients.context import SupportsContext

#: Entries younger than this are never trimmed (same guard as topic retention).
MIN_ENTRY_AGE_MS = 10 * 60 * 1000
#: Newest snapshots kept besides the anchor.
SNAPSHOTS_KEPT = 3
START_MARKERS_KEPT = 2


@dataclass(frozen=True, slots=True)
class TrimResult:
    old_start_slot: int
    new_start_slot: int
    entries_deleted: int
    snapshots_deleted: int
    leases_deleted: int
    snapshot_written: bool


def trim(
    log: SupportsContext,
    acklog: AckLog,
    leases: LeaseStore,
    *,
    min_age_ms: int = MIN_ENTRY_AGE_MS,
    now_ms: int | None = None,
    holds: ListedLeaseStore | None = None,
) -> TrimResult:
    """Snapshot, then trim the ack log and lease objects as far as is safe (see module doc); with ``holds``
    (an Exclusive or Failover subscription's), also its hold generations but the newest two."""
    ctx = log.context
    now = ctx.clock() if now_ms is None else now_ms
    state = acklog.refresh()
    written = False
    if state.slot > acklog.last_snapshot.slot:
        acklog.write_snapshot(now)
        written = True
    plog = acklog.plog
    start = plog.log_start(refresh=True)
    snaps = acklog.snapshots.list()
    old = [s for s in snaps if now - s.time_ms >= min_age_ms and s.slot >= start.slot]
    anchor = max(old, default=None)
    deleted = 0
    if anchor is not None and anchor.slot > start.slot:
        try:
            anchor_state = acklog.snapshots.read(anchor)
        except (ObjectNotFoundError, CorruptDataError):
            # Another trimmer deleted it (it keeps newer ones), or it is damaged: not this round.
            return TrimResult(start.slot, start.slot, 0, 0, 0, written)
        envelope.create_json(
            ctx.storage,
            paths.log_start(acklog.path) + paths.slot_name(anchor.slot),
            envelope.ObjectKind.LOG_START,
            {"slot": anchor.slot, "offset": anchor_state.position, "time_ms": now},
        )
        plog.log_start(refresh=True)
        for slot in range(start.slot, anchor.slot):
            ctx.storage.delete(plog.entries.key(slot))
            deleted += 1
        markers = paths.slot_names(ctx.storage.list(paths.log_start(acklog.path)))
        for name in markers[:-START_MARKERS_KEPT]:
            ctx.storage.delete(paths.log_start(acklog.path) + name)
    snaps_deleted = 0
    if anchor is not None:
        keep = {anchor, *snaps[-SNAPSHOTS_KEPT:]}
        for s in snaps:
            if s not in keep:
                acklog.snapshots.delete(s)
                snaps_deleted += 1
    leases_deleted = leases.delete_below(acklog.state.mark_delete)
    if holds is not None:
        leases_deleted += holds.delete_stale()
    new_start = anchor.slot if anchor is not None and anchor.slot > start.slot else start.slot
    return TrimResult(start.slot, new_start, deleted, snaps_deleted, leases_deleted, written)
