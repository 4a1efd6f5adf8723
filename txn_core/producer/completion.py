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

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from txn_core.coordinator.txnlog import TidState
from txn_core.errors import CompletionFailedError, StorageError, TxnLogError
from txn_core.ids import TxnId

if TYPE_CHECKING:
    from txn_core.coordinator.service import TransactionCoordinator

#: How long a decided transaction's Complete waits, after its markers landed, for a record to carry it.
COMPLETE_LINGER_S = 0.2


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

    @property
    def txn(self) -> TxnId:
        if self.prepared.txn is None:  # pragma: no cover - a decided transaction has an id
            raise ValueError("a decided transaction without an id")
        return self.prepared.txn


class Completions:
    """The pending second phases of one producer. Used under the producer's lock, except for the
    background thread, which touches a completion only under that completion's lock."""

    def __init__(self, coordinator: Callable[[], TransactionCoordinator]) -> None:
        # Looked up at each use, so a test (or a wrapper) may replace the coordinator's methods.
        self._coordinator = coordinator
        self._pending: list[PendingCompletion] = []
        self._executor: ThreadPoolExecutor | None = None

    def __bool__(self) -> bool:
        return bool(self._pending)

    def start(self, prepared: TidState) -> None:
        """The decision on ``prepared`` is durable: write its markers in the background."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="txnlog-completer")
        pending = PendingCompletion(prepared)
        self._pending.append(pending)
        pending.future = self._executor.submit(self._second_phase, pending)

    def _second_phase(self, pending: PendingCompletion) -> None:
        coordinator = self._coordinator()
        coordinator.write_markers(pending.prepared)
        pending.markers_written.set()
        if pending.claimed.wait(COMPLETE_LINGER_S):
            return  # a record of the producer carries its Complete
        with pending.lock:
            if pending.folded or pending.completed is not None:
                return
            pending.alone = True
        try:
            pending.completed = coordinator.complete(pending.prepared, markers_written=True)
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

    def claim(self, *, for_begin: bool = False, finish_failed: bool = True) -> list[PendingCompletion]:
        """Claim the completions a record of the producer can carry: the oldest ones whose markers are
        durable. ``for_begin``: first make sure all but the newest pending completion can be claimed (their
        markers written, or they were completed), so that the begin leaves at most one completing
        transaction. A completion whose markers failed is finished here, synchronously, unless
        ``finish_failed`` is false: the record is created while entries of the producer wait for it (the
        overlapped begin), and writing markers now would queue them behind those entries, which wait for
        this record: a deadlock. It then stays pending (as the completing transaction, if it is the
        newest) and the producer's next record finishes it."""
        newest = self._pending[-1] if self._pending else None
        for pending in list(self._pending):
            if pending.alone and for_begin:
                pending.done.wait()
            if self._failed(pending):
                if finish_failed:
                    self._finish_one(pending)
            elif for_begin and pending is not newest and pending.completed is None:
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
        """Block until ``pending``'s markers are durable; raises what failed while writing them."""
        while not pending.markers_written.wait(0.05):
            if pending.future is not None and pending.future.done():
                pending.future.result()  # raises the failure
                if not pending.markers_written.is_set():  # pragma: no cover - the phase always sets it
                    raise TxnLogError(f"transaction {pending.txn}: markers not written")

    def shutdown(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
