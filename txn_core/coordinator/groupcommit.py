"""Group commit of appends to one coordinator partition (PROTOCOL.md "Transaction log": group commit,
appending without a read).

A process appends to a coordinator partition one record at a time (Pulsar's buffered transaction-log
writer). Appends that arrive while a record is being created queue in :class:`GroupCommit` and go into the
next record together, one create for all of them. Each one's actions are validated against the state the
appends before it in the record leave (so the record is a valid transition sequence as replay applies it);
an append whose build raises or whose actions are not valid (a fenced producer) contributes nothing and
gets its error, the others commit. Each begin of a record gets the next index among the record's begins
(its transaction is ``(c, slot, index)``), at most :data:`~txn_core.format.ids.MAX_BEGINS_PER_RECORD` of
them: an append that would begin more is deferred to the next record, first in line, unless it gives a
``fallback`` (its actions without the begin), which also serves if the actions with the begin are not valid.

The partition does the rest (:class:`RecordLog`): it reads first unless it may create the next slot
without reading, folds actions at its next slot, creates the record and only then makes its steps the
state (prepare, persist, then change memory).

Invariants: every queued append is served exactly once: it ends with a result or an error, or is deferred
and queued again ahead of later appends; the appends of one record are served under the partition's lock,
in queue order.

Crash windows: the record is one exclusive create. A process that dies before it leaves nothing (its
callers never got an answer); after it, the record is durable and every participant's replay applies it.
A create that lost the race changes nothing: the partition replays the slot, and the batch is built again
against the new state (each build may now raise, e.g. the producer was fenced meanwhile).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, cast

from txn_core.clock import Clock
from txn_core.coordinator.actions import Action, Begin, Record
from txn_core.coordinator.apply import Step
from txn_core.coordinator.snapshots import Snapshot
from txn_core.coordinator.tidstate import TidState
from txn_core.errors import TxnLogError
from txn_core.format.ids import MAX_BEGINS_PER_RECORD

__all__ = ["Build", "GroupCommit", "RecordLog"]

#: What an append computes from the id's current state: the actions to write (None or none: nothing to do).
Build = Callable[[TidState | None], Sequence[Action] | None]


class RecordLog(Protocol):
    """What group commit needs of the coordinator partition it appends to; called under its lock."""

    def prepare_append(self) -> None:
        """Read the log first unless the next slot may be created without reading it."""

    def state(self, tid: str) -> TidState | None:
        """The id's replayed state."""

    def fold_next(
        self, actions: Sequence[Action], ts: int, states: dict[str, TidState | None], taken: frozenset[int]
    ) -> list[Step]:
        """The steps ``actions`` make in the next record, from ``states`` or the replayed state; raises if
        one is not valid."""

    def create_next(self, record: Record, steps: list[Step]) -> bool:
        """Create the next slot holding ``record`` and make ``steps`` the state; False if another writer took
        the slot (replayed: fold again)."""

    def snapshot_due(self) -> Snapshot | None:
        """The snapshot to write after this record, if one is due."""

    def maintain(self, snapshot: Snapshot) -> None:
        """Write a snapshot :meth:`snapshot_due` gave, outside the lock; never raises."""


def _numbered(actions: Sequence[Action], begins: int) -> list[Action]:
    """``actions`` with each begin given its index in a record that holds ``begins`` begins before them."""
    out: list[Action] = []
    for action in actions:
        if isinstance(action, Begin):
            out.append(replace(action, index=begins or None))  # the first one's 0 is not written
            begins += 1
        else:
            out.append(action)
    return out


#: A queued append's result before its record is decided.
_PENDING: Any = object()


@dataclass(eq=False)
class _Append:
    """One caller's append waiting for (or served by) a record (:meth:`GroupCommit.append`)."""

    tid: str
    build: Build
    #: the actions without a begin, where the caller would rather go without it than wait (see append)
    fallback: Build | None = None
    result: Any = _PENDING
    error: BaseException | None = None
    done: bool = False
    #: left for the next record (its begin would share this record's slot with another begin)
    deferred: bool = False


class GroupCommit:
    """The appends of this process to one coordinator partition, queued and written a record at a time.
    Thread-safe: the queue has a lock of its own; records are built and created under the partition's
    ``lock``, which it is given."""

    def __init__(self, log: RecordLog, lock: threading.RLock, clock: Clock) -> None:
        self._log = log
        self._lock = lock
        self.clock: Clock = clock
        #: appends waiting for the next record
        self._queue: list[_Append] = []
        self._queue_lock = threading.Lock()

    def queued(self) -> int:
        """How many appends wait for the next record; read unlocked, a guess."""
        return len(self._queue)

    def append(self, tid: str, build: Build, fallback: Build | None = None) -> TidState | None:
        """Append the actions ``build(current state)`` returns, in the next record with every other append
        waiting for it; returns the id's new state, or raises this append's error. See
        :meth:`CoordinatorPartition.append <txn_core.coordinator.txnlog.CoordinatorPartition.append>`."""
        request = _Append(tid, build, fallback)
        with self._queue_lock:
            self._queue.append(request)
        snapshot: Snapshot | None = None
        with self._lock:
            while not request.done:  # a deferred request goes round again (or another thread serves it)
                due = self._serve()
                snapshot = snapshot or due
        if snapshot is not None:
            self._log.maintain(snapshot)
        if request.error is not None:
            raise request.error
        return cast("TidState | None", request.result)

    def _serve(self) -> Snapshot | None:
        """Under the lock: create one record for every queued append (lost race: replay, rebuild, retry).
        Returns the snapshot due after it, if any."""
        log = self._log
        with self._queue_lock:
            batch, self._queue = self._queue, []
        try:
            log.prepare_append()
            while True:
                ts = self.clock()
                actions, steps = self._build(batch, ts)
                if not actions:
                    return None
                if not log.create_next(Record(ts, tuple(actions)), steps):
                    continue
                for request in batch:
                    if request.error is None and request.result is _PENDING and not request.deferred:
                        request.result = log.state(request.tid)
                return log.snapshot_due()
        except BaseException as exc:
            for request in batch:
                if request.error is None and request.result is _PENDING and not request.deferred:
                    request.error = exc
            if not isinstance(exc, Exception):
                raise
            return None
        finally:
            later = [request for request in batch if request.deferred]
            for request in batch:
                request.done = not request.deferred
            if later:  # first in line for the next record, served by whichever of their threads comes first
                with self._queue_lock:
                    self._queue[:0] = later

    def _build(self, batch: list[_Append], ts: int) -> tuple[list[Action], list[Step]]:
        """The actions of the next record and their steps: each queued append's ``build`` against the state
        the appends before it in the record leave. An append whose build raises, or whose actions are not
        valid, gets that error and contributes nothing; one with nothing to do gets its current state.

        A transaction's id is the slot of its begin record and its index among the record's begins, so a
        record holds at most :data:`MAX_BEGINS_PER_RECORD` begins. An append whose actions would begin more
        is **deferred** (``request.deferred``) to the next record, untouched by this one."""
        actions: list[Action] = []
        steps: list[Step] = []
        states: dict[str, TidState | None] = {}
        begins = 0  # so far in the record: the next begin's index
        for request in batch:
            request.result, request.error, request.deferred = _PENDING, None, False
            current = states[request.tid] if request.tid in states else self._log.state(request.tid)
            try:
                folded = self._build_one(request, current, ts, states, begins)
            except Exception as exc:  # this caller's error (fenced, invalid): the others' actions still go
                request.error = exc
                continue
            if folded is None:
                request.deferred = True
                continue
            wanted, mine = folded
            if not wanted:
                request.result = current
                continue
            begins += sum(isinstance(action, Begin) for action in wanted)
            actions.extend(wanted)
            steps.extend(mine)
            for tid, _, after in mine:
                states[tid] = after
        return actions, steps

    def _build_one(
        self,
        request: _Append,
        current: TidState | None,
        ts: int,
        states: dict[str, TidState | None],
        begins: int,
    ) -> tuple[Sequence[Action], list[Step]] | None:
        """One queued append's actions and their steps (none: nothing to do); None: deferred to the next
        record (its begins would pass the record's :data:`MAX_BEGINS_PER_RECORD`). With a fallback, a begin
        that cannot go into this record, or actions that are not valid, give way to the fallback's actions."""
        builds = [request.build] if request.fallback is None else [request.build, request.fallback]
        for i, build in enumerate(builds):
            last = i == len(builds) - 1
            wanted = build(current)
            if not wanted:
                return (), []
            if begins + sum(isinstance(action, Begin) for action in wanted) > MAX_BEGINS_PER_RECORD:
                if last:
                    return None
                continue
            wanted = _numbered(wanted, begins)
            try:
                return wanted, self._log.fold_next(wanted, ts, states, frozenset(range(begins)))
            except TxnLogError:
                if last:
                    raise
        return None  # pragma: no cover - the last build returns or raises
