"""Snapshots and compaction of one coordinator partition's transaction log (PROTOCOL.md "Transaction
log", snapshots; "Compaction").

A coordinator snapshot ``_txnlog/coordinators/<05d c>/snapshots/<020d slot>`` (envelope kind 4, JSON) holds
exactly the replayed state at ``next_slot`` (:func:`snapshot_value`, :func:`restored`; the field table is
PROTOCOL.md's). Whoever replays or appends across a multiple of :data:`SNAPSHOT_EVERY` records writes one
after its record landed, outside the partition's lock, and deletes all but the newest
:data:`SNAPSHOTS_KEPT`. Compaction (:meth:`CoordinatorSnapshots.compact`) deletes the records below the
newest snapshot that are older than :data:`COMPACTION_MIN_AGE_MS`.

Invariants: ``slot`` (the newest snapshot this process loaded or wrote) is never past the partition's
next slot; at most one thread of a process writes the snapshot :meth:`CoordinatorSnapshots.claim` gave it.

Crash windows: a snapshot is one exclusive create, so it is whole or absent; a writer that dies before
deleting the older ones leaves one too many, deleted by the next writer. Two processes writing the
snapshot of one slot write the same state: the second create fails and changes nothing. A failed write is
logged and never reported as a failure of the append or read that triggered it (the next participant tries
again). Loading skips a snapshot that is unreadable or was deleted meanwhile and takes the next older one.
Compaction deletes records in slot order and stops at the first one that is too young, so a crash leaves a
shorter deleted prefix; a view idle for more than half the compaction age re-lists snapshots before it
trusts a missing slot as the end (``CoordinatorPartition._compacted_past_us``), and an append never writes a
slot compaction freed (PROTOCOL.md "Transaction log", appending without a read).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from txn_core.clock import Clock
from txn_core.coordinator.tidstate import TidState
from txn_core.errors import CorruptDataError, ObjectNotFoundError
from txn_core.format import envelope, paths
from txn_core.format.slotlog import SlotLog
from txn_core.format.states import CoordinatorState
from txn_core.logs import get_logger
from txn_core.storage.base import Storage
from txn_core.storage.guarded import opportunistic

__all__ = [
    "COMPACTION_MIN_AGE_MS",
    "SNAPSHOTS_KEPT",
    "SNAPSHOT_EVERY",
    "CoordinatorSnapshots",
    "Restored",
    "Snapshot",
    "restored",
    "snapshot_value",
]

#: A snapshot is written when the log has grown this many records past the newest one.
SNAPSHOT_EVERY = 500
#: Snapshots kept (older ones are deleted once a newer one exists).
SNAPSHOTS_KEPT = 2
#: Compaction deletes only records older than this; a view idle for half of it re-checks snapshots.
COMPACTION_MIN_AGE_MS = 3600 * 1000

#: A coordinator snapshot's JSON value, as written.
Snapshot = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Restored:
    """The replayed state a snapshot holds, decoded; the partition that loads it takes its containers."""

    next_slot: int
    tids: dict[str, TidState]
    outcomes: OrderedDict[tuple[int, int], CoordinatorState]
    log_time_ms: int


def snapshot_value(
    coordinator: int,
    next_slot: int,
    low_watermark: int,
    tids: Iterable[TidState],
    outcomes: OrderedDict[tuple[int, int], CoordinatorState],
    log_time_ms: int,
    time_ms: int,
) -> Snapshot:
    """The snapshot of the replayed state at ``next_slot`` (taken under the partition's lock)."""
    return {
        "coordinator": coordinator,
        "next_slot": next_slot,
        "low_watermark": low_watermark,
        "tids": [t.to_json() for t in tids],
        "outcomes": [[s, v.value, i] if i else [s, v.value] for (s, i), v in outcomes.items()],
        "log_time_ms": log_time_ms,
        "time_ms": time_ms,
    }


def restored(snap: Snapshot) -> Restored:
    """The state ``snap`` holds. An outcome is ``[sequence, state]`` for a transaction whose index in its
    record is 0, ``[sequence, state, index]`` else; a snapshot without ``log_time_ms`` (older ones) takes
    the greatest ``updated_ms`` of its ids."""
    tids = {t["tid"]: TidState.from_json(t) for t in snap["tids"]}
    return Restored(
        next_slot=int(snap["next_slot"]),
        tids=tids,
        outcomes=OrderedDict(
            ((int(o[0]), int(o[2]) if len(o) > 2 else 0), CoordinatorState(o[1])) for o in snap["outcomes"]
        ),
        log_time_ms=int(snap.get("log_time_ms", max((t.updated_ms for t in tids.values()), default=0))),
    )


class CoordinatorSnapshots:
    """The snapshots of one coordinator partition: loading the newest, writing new ones, compacting the log.

    It keeps ``slot`` (the newest snapshot loaded or written) and whether a thread of this process is
    writing one, both guarded by the partition's ``lock``, which it is given: the partition claims a
    snapshot (:meth:`claim`) under that lock, in the same step as it takes the snapshot's value."""

    def __init__(self, storage: Storage, coordinator: int, slots: SlotLog, clock: Clock, lock: threading.RLock) -> None:
        self.storage = storage
        self.coordinator = coordinator
        self.slots = slots
        self.clock: Clock = clock
        self._lock = lock
        self._prefix = paths.coordinator_snapshots(coordinator)
        #: the slot of the newest snapshot this process loaded or wrote (0: none)
        self.slot = 0
        self._writing = False

    def load(self) -> Restored | None:
        """Under the lock: the state of the newest readable snapshot, which becomes ``slot``; None without
        one."""
        names = paths.slot_names(self.storage.list(self._prefix))
        for name in reversed(names):
            try:
                snap = envelope.read_json(self.storage, self._prefix + name, envelope.ObjectKind.COORDINATOR_SNAPSHOT)
            except (ObjectNotFoundError, CorruptDataError):
                continue  # a newer snapshot raced a delete, or a damaged one: use an older one
            state = restored(snap)
            self.slot = state.next_slot
            return state
        return None

    def newest_slot(self) -> int:
        """The slot of the newest snapshot listed (0 without one)."""
        names = self.storage.list(self._prefix)
        return max((int(n) for n in paths.slot_names(names)), default=0)

    def claim(self, next_slot: int) -> bool:
        """Under the lock: whether a snapshot is due at ``next_slot`` (the log grew :data:`SNAPSHOT_EVERY`
        records past the newest one) and no thread of this process is writing one; if so, the caller takes
        the snapshot's value now and hands it to :meth:`maintain`."""
        if self._writing or next_slot - self.slot < SNAPSHOT_EVERY:
            return False
        self._writing = True
        return True

    def write(self, snap: Snapshot) -> None:
        """Write ``snap`` (taken under the lock) and delete snapshots beyond the newest
        :data:`SNAPSHOTS_KEPT`. Runs outside the lock: a slow store delays no append."""
        key = self._prefix + paths.slot_name(int(snap["next_slot"]))
        if envelope.create_json(self.storage, key, envelope.ObjectKind.COORDINATOR_SNAPSHOT, snap):
            get_logger("txnlog.snapshots").info("coordinator snapshot %s written", key)
        # else another participant wrote the snapshot of the same slot: the same state
        with self._lock:
            self.slot = max(self.slot, int(snap["next_slot"]))
        names = paths.slot_names(self.storage.list(self._prefix))
        for name in names[:-SNAPSHOTS_KEPT]:
            self.storage.delete(self._prefix + name)

    def maintain(self, snap: Snapshot) -> None:
        """Write the snapshot :meth:`claim` gave, after a record landed or was replayed, outside the lock.
        Whatever fails here is logged and never turns a committed append or a read into a reported failure:
        the next participant tries again."""
        try:
            opportunistic(self.storage, "coordinator snapshot", lambda: self.write(snap))
        except Exception as exc:
            get_logger("txnlog.snapshots").warning(
                "coordinator %d: snapshot at slot %s not written (%s); the next participant tries again",
                self.coordinator,
                snap["next_slot"],
                exc,
            )
        finally:
            with self._lock:
                self._writing = False

    def compact(self, limit: int, min_age_ms: int) -> int:
        """Delete the log's slots below ``limit`` (the newest snapshot's, read after a refresh) that are
        older than ``min_age_ms``, in slot order up to the first younger one; returns how many."""
        deleted = 0
        names = self.slots.list_slots()
        now = self.clock()
        for slot in names:
            if slot >= limit:
                break
            mtime = self.storage.mtime_ms(self.slots.key(slot))
            if mtime is not None and now - mtime < min_age_ms:
                break
            self.storage.delete(self.slots.key(slot))
            deleted += 1
        return deleted
