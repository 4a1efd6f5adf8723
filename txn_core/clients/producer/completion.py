"""The second phase of a producer's decided transactions (PROTOCOL.md "Transactions", two-phase end).

``commit_transaction`` returns once the decision (the Prepare record) is durable. Then, off the
application's critical path, this module writes the transaction's markers into every participant log
(a background thread) and gets its Complete record written. The Complete record is **folded** into the
producer's next coordinator record (the next ``begin``, an ``add`` or the next ``prepare``) when that
record is created after the markers are durable: one record instead of two. The next ``begin`` never
waits for the markers: begun while the previous transaction is still Prepare*, it makes that one the
transactional id's *completing* transaction, completed by a later record. If no record of the producer
claims a completion within :data:`COMPLETE_LINGER_S` of its markers landing, the background thread writes
the Complete record alone. ``close()`` and ``wait_for_completion()`` finish everything at once.

Where the producer's records are faster than a hand-off to a thread (:data:`FAST_RECORD_S`: tmpfs, a fast
local disk, the memory store), the committing thread writes the markers itself before it returns: the
background thread's Python work would contend with the application's for the interpreter and cost more
than the write. Only the linger stays in the background, with one watcher thread for all such completions
(:meth:`Completions._watcher`), not a hand-off per transaction. Which thread writes the markers changes
nothing else: the decision was durable before, and the records and their order are the same.

Invariants:

* at most two completions are pending: the id's completing transaction and the last decided one; a
  ``begin`` needs all but the last decided one folded first (:meth:`Completions.claim` with
  ``for_begin``), because the coordinator keeps one completing transaction per id;
* a completion is claimed by at most one party: a producer record (``folded``) or the background thread
  (``alone``), decided under the completion's lock; a record that fails releases its claims;
* a Complete is only ever written after every marker of the transaction is durable.

Crash windows: if the process dies with completions pending, the transactions are decided; whoever meets
them after the completion grace (a reader, ``expire_transactions``, the id's next ``init_transactions``)
writes the missing markers and the Complete record (PROTOCOL.md "Recovery").
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from txn_core.clients.producer.carried import MarkerOffers, MarkerSet
from txn_core.coordinator.txnlog import TidState
from txn_core.errors import CompletionFailedError, StorageError, TxnLogError
from txn_core.format.entry import CarriedMarker
from txn_core.format.ids import TxnId
from txn_core.format.states import CoordinatorState
from txn_core.logs import get_logger

if TYPE_CHECKING:
    from txn_core.coordinator.service import TransactionCoordinator

#: How long a decided transaction's Complete waits, after its markers landed, for a record to carry it.
COMPLETE_LINGER_S = 0.2

#: A producer whose decision records take less than this (a moving average of their wall time) writes its
#: markers on the committing thread, and its begin before its first entries (``Sender.write_buffers``):
#: markers and begins are records of the same size, so they cost it about as long, while handing them to
#: another thread costs the committing thread 0.1-0.3 ms of interpreter contention per transaction
#: (measured on tmpfs, 2 cores, 2 MB per transaction: transactional produce went from about 0.65x to about
#: 0.77x of idempotent produce). A store with a real round trip (a disk whose fsync takes milliseconds, an
#: object store) stays above it: markers in the background, the begin overlapped with the entries.
FAST_RECORD_S = 0.0003

#: Weight of the newest decision record's wall time in the moving average.
_RECORD_COST_WEIGHT = 0.25

logger = get_logger("txnlog.producer")


@dataclass
class PendingCompletion:
    """One decided transaction whose Complete record is not written yet."""

    prepared: TidState
    future: Future[None] | None = None
    markers_written: threading.Event = field(default_factory=threading.Event)
    claimed: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: claimed by a record of the producer (in flight or landed)
    folded: bool = False
    #: claimed by the background thread, which writes the Complete record alone
    alone: bool = False
    done: threading.Event = field(default_factory=threading.Event)
    completed: TidState | None = None
    #: when its markers were written by the committing thread (time.monotonic)
    markers_at: float = 0.0
    #: its topic partitions' markers, offered to the producer's next entries (PROTOCOL.md "Carried markers");
    #: None when every marker is written alone
    offers: MarkerSet | None = None
    #: the logs whose markers are written alone at once (None: every participant)
    lone: list[str] | None = None

    @property
    def txn(self) -> TxnId:
        if self.prepared.txn is None:  # pragma: no cover - a decided transaction has an id
            raise ValueError("a decided transaction without an id")
        return self.prepared.txn


class Completions:
    """The pending second phases of one producer. Used under the producer's lock, except for the
    background thread, which touches a completion only under that completion's lock."""

    def __init__(self, coordinator: Callable[[], TransactionCoordinator], offers: MarkerOffers | None = None) -> None:
        # Looked up at each use, so a test (or a wrapper) may replace the coordinator's methods.
        self._coordinator = coordinator
        #: where the markers of topic partitions wait for the producer's next entries (None: never)
        self._offers = offers
        self._pending: list[PendingCompletion] = []
        self._executor: ThreadPoolExecutor | None = None
        #: moving average of the wall time of this producer's decision records (None: none measured yet)
        self._record_s: float | None = None
        #: completions whose markers were written inline and whose Complete no record has claimed yet
        self._watched: list[PendingCompletion] = []
        self._watching = False
        self._watch_lock = threading.Lock()
        self._watch_executor: ThreadPoolExecutor | None = None
        self._stop = threading.Event()

    def __bool__(self) -> bool:
        return bool(self._pending)

    def start(self, prepared: TidState, record_s: float | None = None) -> None:
        """The decision on ``prepared`` is durable (its record took ``record_s`` seconds, when measured):
        write its markers, here when such records are cheaper than a hand-off (:data:`FAST_RECORD_S`),
        else in the background. Never raises for the markers: if writing them here fails, the background
        thread writes them again (markers are idempotent) and a failure there is handled as always."""
        if record_s is not None:
            last = self._record_s
            self._record_s = record_s if last is None else last + _RECORD_COST_WEIGHT * (record_s - last)
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="txnlog-completer")
        pending = PendingCompletion(prepared)
        self._pending.append(pending)
        if self._offer(pending):
            # the offered markers are carried by the producer's next entries or, after the linger, written alone
            pending.future = self._executor.submit(self._second_phase, pending, self._lone_here(pending))
            return
        if not self.fast_records():
            pending.future = self._executor.submit(self._second_phase, pending)
            return
        try:
            self._coordinator().write_markers(prepared)
        except BaseException as exc:
            pending.future = self._executor.submit(self._second_phase, pending)
            if not isinstance(exc, Exception):
                raise
            logger.debug("transaction %s: markers failed here (%s); writing them in the background", pending.txn, exc)
            return
        pending.markers_at = time.monotonic()  # real time: the linger is a blocking wait (txn_core.clock)
        pending.markers_written.set()
        self._watch(pending)

    def _offer(self, pending: PendingCompletion) -> bool:
        """Offer ``pending``'s topic-partition markers to the producer's next entries (PROTOCOL.md "Carried
        markers"); False when none may be carried."""
        offers, prepared = self._offers, pending.prepared
        if offers is None or not offers.enabled or prepared.txn is None:
            return False
        carriable = offers.carriable(prepared.participants)
        if not carriable:
            return False
        committed = prepared.state in (CoordinatorState.PREPARE_COMMIT, CoordinatorState.COMPLETE_COMMIT)
        marker = CarriedMarker(committed, prepared.txn, prepared.epoch)
        coordinator = self._coordinator

        def write(paths: list[str]) -> None:
            coordinator().write_markers(prepared, paths)

        pending.offers = MarkerSet(marker, prepared.producer_id, carriable, write)
        pending.lone = [p for p in prepared.participants if p not in pending.offers.offers]
        offers.add(pending.offers)
        return True

    def _lone_here(self, pending: PendingCompletion) -> bool:
        """Write the markers of ``pending`` that are not offered (a group's or an ack log's) on this thread
        where records are fast; whether none is left for the background phase."""
        if not pending.lone:
            return True
        if not self.fast_records():
            return False
        try:
            self._coordinator().write_markers(pending.prepared, pending.lone)
        except Exception as exc:
            logger.debug("transaction %s: markers failed here (%s); writing them in the background", pending.txn, exc)
            return False
        return True

    def fast_records(self) -> bool:
        """Whether this producer's records are cheaper to write on its own thread than to hand off
        (:data:`FAST_RECORD_S`): then it writes its markers, and its begin, itself."""
        return self._record_s is not None and self._record_s < FAST_RECORD_S

    def _second_phase(self, pending: PendingCompletion, lone_written: bool = False) -> None:
        if not lone_written:
            self._coordinator().write_markers(pending.prepared, pending.lone)
        offers = pending.offers
        if offers is not None and not offers.wait(self._offers.linger_s if self._offers is not None else 0):
            offers.force()  # nothing carried them within the linger: alone
        pending.markers_written.set()
        if not pending.claimed.wait(COMPLETE_LINGER_S):
            self._complete_alone(pending)

    def _watch(self, pending: PendingCompletion) -> None:
        """Have the background thread complete ``pending`` alone if no record claims it within
        :data:`COMPLETE_LINGER_S` of its markers. One watcher serves every such completion of the producer and
        runs only while there are some: no hand-off per transaction."""
        with self._watch_lock:
            self._watched.append(pending)
            if self._watching:
                return
            self._watching = True
        if self._watch_executor is None:  # its own thread: a second phase lingering never delays it, nor it one
            self._watch_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="txnlog-linger")
        self._watch_executor.submit(self._watcher)

    def _watcher(self) -> None:
        """Every half linger: complete alone the watched completions unclaimed for a whole linger; exits when
        none is left. On shutdown, completes the unclaimed ones at once (as their lingers would have)."""
        try:
            self._watch_loop()
        except BaseException:
            with self._watch_lock:
                self._watching = False  # the next inline completion starts another watcher
            raise

    def _watch_loop(self) -> None:
        while True:
            stopping = self._stop.wait(COMPLETE_LINGER_S / 2)
            now = time.monotonic()
            with self._watch_lock:
                live = [p for p in self._watched if not p.claimed.is_set()]
                due = [p for p in live if stopping or now - p.markers_at >= COMPLETE_LINGER_S]
                self._watched = [p for p in live if p not in due]
                last = not self._watched
                if last:
                    self._watching = False  # a later start() submits a new watcher
            for pending in due:
                try:
                    self._complete_alone(pending)
                except Exception as exc:  # as in a second phase: the producer's next record or finish() completes it
                    logger.debug("transaction %s: Complete not written (%s)", pending.txn, exc)
            if last:
                return

    def _complete_alone(self, pending: PendingCompletion) -> None:
        """No record of the producer claimed ``pending``: write its Complete record alone (unless one did
        meanwhile)."""
        with pending.lock:
            if pending.folded or pending.completed is not None:
                return
            pending.alone = True
        try:
            pending.completed = self._coordinator().complete(pending.prepared, markers_written=True)
        except BaseException:
            with pending.lock:
                pending.alone = False  # the producer's next record, or finish(), completes it
            raise
        finally:
            pending.done.set()

    def _failed(self, pending: PendingCompletion) -> bool:
        """Whether the background phase of ``pending`` failed before its markers were all written."""
        future = pending.future
        return future is not None and future.done() and not pending.markers_written.is_set()

    def begin_waits(self) -> bool:
        """Whether a begin now would first wait for older markers (more than one completion pending)."""
        return sum(1 for p in self._pending if p.completed is None) > 1

    def claim(
        self, *, for_begin: bool = False, finish_failed: bool = True, wait_all: bool = False
    ) -> list[PendingCompletion]:
        """Claim the completions a record of the producer can carry: the oldest ones whose markers are
        durable. ``for_begin``: first make sure all but the newest pending completion can be claimed (their
        markers written, or they were completed), so that the begin leaves at most one completing
        transaction. ``wait_all``: the same for every pending completion, the newest included (a decision
        that begins the next transaction ahead must leave nothing completing; the markers it waits for were
        started a transaction earlier, so the wait is short). A completion whose markers failed is finished
        here, synchronously, unless ``finish_failed`` is false: the record is created while entries of the
        producer wait for it (the overlapped begin), and writing markers now would queue them behind those
        entries, which wait for this record: a deadlock. It then stays pending (as the completing transaction,
        if it is the newest) and the producer's next record finishes it."""
        newest = self._pending[-1] if self._pending else None
        for pending in list(self._pending):
            if pending.alone and (for_begin or wait_all):
                pending.done.wait()
            if self._failed(pending):
                if finish_failed:
                    self._finish_one(pending)
            elif (wait_all or (for_begin and pending is not newest)) and pending.completed is None:
                try:
                    self._wait_markers(pending)
                except TxnLogError:
                    self._finish_one(pending)
            if pending.completed is not None:
                self._pending.remove(pending)
        claimed: list[PendingCompletion] = []
        for pending in self._pending:
            if not pending.markers_written.is_set():
                break
            with pending.lock:
                if pending.alone or pending.completed is not None:
                    break
                pending.folded = True
            pending.claimed.set()
            claimed.append(pending)
        return claimed

    def landed(self, claimed: list[PendingCompletion], state: TidState | None) -> None:
        """The record carrying ``claimed`` is durable: those transactions are complete."""
        for pending in claimed:
            pending.completed = state
            pending.done.set()
            if pending in self._pending:
                self._pending.remove(pending)

    def release(self, claimed: list[PendingCompletion]) -> None:
        """The record meant to carry ``claimed`` failed: they are pending again (a later record, ``finish``
        or, after the grace, anyone completes them)."""
        for pending in claimed:
            with pending.lock:
                pending.folded = False

    def finish(self) -> TidState | None:
        """Write every pending completion's markers and Complete record now; the last state written."""
        last: TidState | None = None
        for pending in list(self._pending):
            last = self._finish_one(pending) or last
            self._pending.remove(pending)
        return last

    def _finish_one(self, pending: PendingCompletion) -> TidState | None:
        """Complete ``pending`` now (markers first if they are not durable); its state after. A storage
        failure is raised as :class:`CompletionFailedError`: whatever the caller was about to write for a
        later transaction was not written (an unknown outcome here is this transaction's, not the caller's)."""
        try:
            return self._complete_now(pending)
        except StorageError as exc:
            raise CompletionFailedError(
                f"completing the earlier transaction {pending.txn} (decided; its markers or its Complete record "
                f"could not be written) failed: {exc}",
                txn=pending.txn,
            ) from exc

    def _complete_now(self, pending: PendingCompletion) -> TidState | None:
        coordinator = self._coordinator()
        pending.claimed.set()
        try:
            self._wait_markers(pending)
        except TxnLogError:
            pending.completed = coordinator.complete(pending.prepared)  # the whole second phase again, once
            if pending.offers is not None:
                pending.offers.retire()  # every marker written: nothing left to carry
            pending.done.set()
            return pending.completed
        with pending.lock:
            alone = pending.alone
            if not alone:
                pending.folded = True
        if alone:
            pending.done.wait()
        if pending.completed is None:
            pending.completed = coordinator.complete(pending.prepared, markers_written=True)
            pending.done.set()
        return pending.completed

    def wait_markers(self) -> None:
        """Block until the markers of the last decided transaction are durable; if writing them failed,
        finish its second phase here (or raise)."""
        if self._pending:
            last = self._pending[-1]
            try:
                self._wait_markers(last)
            except TxnLogError:
                self._finish_one(last)
                self._pending.remove(last)

    @staticmethod
    def _wait_markers(pending: PendingCompletion) -> None:
        """Block until ``pending``'s markers are durable (writing alone at once those still offered); raises
        what failed while writing them."""
        if pending.offers is not None and not pending.offers.landed:
            with contextlib.suppress(StorageError):  # the background phase meets it too, and raises it below
                pending.offers.force()
        while not pending.markers_written.wait(0.05):
            if pending.future is not None and pending.future.done():
                pending.future.result()  # raises the failure
                if not pending.markers_written.is_set():  # pragma: no cover - the phase always sets it
                    raise TxnLogError(f"transaction {pending.txn}: markers not written")

    def shutdown(self) -> None:
        self._stop.set()
        for executor in (self._executor, self._watch_executor):
            if executor is not None:
                executor.shutdown(wait=True)
        self._executor = self._watch_executor = None
        self._stop = threading.Event()
