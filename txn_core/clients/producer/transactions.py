"""A producer's transaction manager (Kafka's TransactionManager): the transactions of its client state
machine and everything it says to the coordinator (PROTOCOL.md "Transactions", "Begin ahead", "Fencing").

:class:`TransactionManager` drives the client state (:mod:`txn_core.clients.producer.states`) through
init, begin, commit and abort, and holds the current transaction: its id, its participants, the
participants it wrote to, its start, and the transaction begun ahead; it moves the producer's id and epoch
(:mod:`txn_core.clients.producer.sequences`) as the coordinator says. It makes the coordinator's records:
``init`` (fencing), ``begin``, ``add`` (registering participants), the decision (``end``), and ``withdraw``
of an unused transaction begun ahead; each record carries the Complete of every decided transaction whose
markers are durable (:mod:`txn_core.clients.producer.completion`), and a state it returns that names
another producer fences this one (a fatal error).

Invariants:

* a participant is registered (``begin``/``add``, or the transaction begun ahead with it) before any entry
  of the transaction is written to it (:meth:`TransactionManager.ensure_registered`); the overlapped begin
  keeps this, since its entries stay invisible until the begin is durable (PROTOCOL.md "Transactions");
* every transaction runs at one epoch, a fresh one (KIP-890): the epoch moves only between transactions
  (``init``, a ``begin``, adopting a transaction begun ahead, a finished completion), never within one;
* at most one transaction is begun ahead, and only between transactions: the next write adopts it, with no
  record (:meth:`TransactionManager.adopt_ahead`); a closing producer withdraws it unused;
* the decision is durable before the state is Ready, and the second phase starts only after that: an
  interrupt there leaves a decided transaction, never an undecided one.

Crash windows (PROTOCOL.md "Recovery"): dying after ``begin``/``add`` but before the decision leaves an
``Ongoing`` transaction that the id's next ``init_transactions`` (or a reader after its timeout) aborts;
after the decision (the commit point) the transaction is decided, and whoever meets it writes the missing
markers and Complete; a transaction begun ahead and never written under is aborted by the next
``init_transactions`` (a failed ``withdraw`` leaves it to that too).

Locking: the manager takes no lock. Its callers hold the producer's lock (``Producer._lock``), or are a
pool thread of the :class:`~txn_core.clients.producer.sender.Sender` working for that holder while it waits
(the overlapped begin's :meth:`~TransactionManager.ensure_registered`, an offsets fence's
:meth:`~TransactionManager.abortable`, appends calling :meth:`~TransactionManager.note_write`: a set
addition, atomic under the GIL). :class:`Completions` has locks of its own.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from txn_core.clients.producer.completion import Completions, PendingCompletion
from txn_core.clients.producer.sequences import ProducerSequences
from txn_core.clients.producer.states import ClientStateMachine
from txn_core.coordinator.tidstate import Ahead
from txn_core.coordinator.txnlog import TidState
from txn_core.errors import (
    CommitFailedError,
    CommitStateUnknownError,
    CompletionFailedError,
    ObjectExistsError,
    ProducerFencedError,
    StorageError,
    TxnLogError,
    UnknownOutcomeError,
)
from txn_core.format.ids import TxnId
from txn_core.format.states import ClientState
from txn_core.logs import get_logger

if TYPE_CHECKING:
    from txn_core.clock import Clock
    from txn_core.coordinator.service import TransactionCoordinator

_S = ClientState
logger = get_logger("txnlog.producer")


class TransactionManager:
    """The transactions and the coordinator requests of one producer; see module doc."""

    def __init__(
        self,
        transactional_id: str | None,
        transaction_timeout_ms: int,
        *,
        states: ClientStateMachine,
        ids: ProducerSequences,
        coordinator: TransactionCoordinator,
        completions: Completions,
        clock: Clock,
    ) -> None:
        self.transactional_id = transactional_id
        self.transaction_timeout_ms = transaction_timeout_ms
        #: the client state, which this manager moves through init, begin, commit and abort
        self.states = states
        #: the producer id and epoch (which ``init`` and the transactions move), with the sequences
        self._ids = ids
        self._coordinator = coordinator
        self._completions = completions
        self._clock = clock
        #: the coordinator's id of the current transaction (None until its first write)
        self.txn: TxnId | None = None
        self.participants: set[str] = set()
        #: participants the current transaction wrote to (or tried to): only they get its markers
        self.written: set[str] = set()
        #: when the current transaction started (its begin record, or its first write if begun ahead)
        self.started_ms: int | None = None
        #: the next transaction, begun ahead by the record that decided the last one (PROTOCOL.md "Begin ahead")
        self.ahead: Ahead | None = None

    # --- errors ---------------------------------------------------------------------------------

    def fatal(self, exc: BaseException) -> None:
        """Fenced or failed for good: every later call but ``close`` raises; nothing is begun ahead any more."""
        self.ahead = None
        self.states.fatal(exc)

    def abortable(self, exc: BaseException) -> None:
        """The current transaction failed: ``commit_transaction`` refuses, ``abort_transaction`` works."""
        self.states.abortable(exc, self.txn)

    def note_write(self, path: str) -> None:
        """Before an attempt to write to ``path`` in the current transaction (one whose outcome is unknown
        may have landed): ``path`` gets the transaction's marker."""
        if self.transactional_id is not None:
            self.written.add(path)

    # --- transactions ---------------------------------------------------------------------------

    def init(self) -> None:
        """Register this instance: fence older ones and finish the transaction they left open."""
        self.states.transition(_S.INITIALIZING)
        try:
            self._completions.finish()
        except TxnLogError as exc:  # init_producer below finishes whatever is left
            logger.info("producer %s: previous transaction left to init: %s", self.transactional_id, exc)
        self.ahead = None  # fenced with the instance it belonged to: init aborts it
        state = self._coordinator.init_producer(self.transactional_id or "", self.transaction_timeout_ms)
        self._ids.producer_id = state.producer_id
        self._ids.move_to(state.epoch, restart=True)
        self.states.transition(_S.READY)

    def begin(self) -> None:
        """Begin a transaction, locally: the coordinator hears of it at its first write."""
        self.states.transition(_S.IN_TRANSACTION)
        self._no_transaction()

    def commit(
        self, flush: Callable[[], None], metadata: dict[str, Any] | None, *, begin_ahead: bool
    ) -> Callable[[], None] | None:
        """Commit: ``flush`` every buffered write, then persist PrepareCommit (the commit point). Returns what
        starts the second phase, to run once the producer is Ready (see ``Producer.commit_transaction``)."""
        self.states.require_not_failed()
        self.states.transition(_S.COMMITTING)
        try:
            try:
                flush()
                if self.txn is None and metadata is not None and not self.adopt_ahead():
                    self._begin_remote([])
            except ObjectExistsError:
                raise
            except (UnknownOutcomeError, StorageError) as exc:
                raise CommitFailedError(
                    f"transactional id {self.transactional_id!r}: the transaction was not committed: "
                    f"{_why(exc, 'its writes did not all complete')}. Call commit_transaction() again (it "
                    "resumes the writes) or abort_transaction().",
                    transactional_id=self.transactional_id,
                ) from exc
            second_phase = self._decide(True, metadata, begin_ahead) if self.txn is not None else None
        except ProducerFencedError as exc:
            self.fatal(exc)
            raise
        except StorageError:
            raise  # state stays Committing: commit_transaction() may be called again, or abort
        except TxnLogError as exc:
            self.abortable(exc)
            raise
        self.states.transition(_S.READY)  # before the second phase: an interrupt there leaves a decided transaction
        return second_phase

    def abort(self, drop: Callable[[], None], *, begin_ahead: bool) -> Callable[[], None] | None:
        """Abort: ``drop`` the buffered data; if anything reached the coordinator, persist PrepareAbort. Returns
        what starts the second phase, to run once the producer is Ready."""
        self.states.transition(_S.ABORTING)
        drop()
        try:
            second_phase = self._decide(False, None, begin_ahead) if self.txn is not None else None
        except ProducerFencedError as exc:
            self.fatal(exc)
            raise
        self.states.transition(_S.READY)
        return second_phase

    def _decide(self, commit: bool, metadata: dict[str, Any] | None, begin_ahead: bool) -> Callable[[], None] | None:
        """Persist the decision on the current transaction (folding completed predecessors into the same
        record; with ``begin_ahead``, beginning the next transaction in it). Returns what starts its second
        phase (markers here or in the background), for the caller to run once the producer is Ready: the
        transaction is decided even if that is interrupted."""
        txn = self.txn
        if txn is None:  # pragma: no cover
            return None
        started = time.perf_counter()
        epoch = self._ids.epoch
        try:
            state = self._with_completions(
                lambda done: self._coordinator.end(
                    self.transactional_id or "",
                    self._ids.producer_id,
                    epoch,
                    txn,
                    commit,
                    metadata,
                    complete=False,
                    completed=done,
                    started_ms=self.started_ms,
                    written=sorted(self.written),
                    ahead=(self.transaction_timeout_ms, sorted(self.participants)) if begin_ahead else None,
                ),
                wait_all=begin_ahead,
            )
        except UnknownOutcomeError as exc:
            raise CommitStateUnknownError(
                f"transactional id {self.transactional_id!r}: the decision on transaction {txn} may or may not "
                f"be durable ({exc}). Call {'commit' if commit else 'abort'}_transaction() again to learn it "
                "(it is idempotent); do not assume either outcome.",
                transactional_id=self.transactional_id,
            ) from exc
        except StorageError as exc:
            if commit and not isinstance(exc, ObjectExistsError):
                raise CommitFailedError(
                    f"transactional id {self.transactional_id!r}: transaction {txn} was not committed: "
                    f"{_why(exc, 'the store refused its decision')}. Call commit_transaction() again or "
                    "abort_transaction().",
                    transactional_id=self.transactional_id,
                ) from exc
            raise
        record_s = time.perf_counter() - started
        self._check_not_fenced(state)
        decided = state if state.state.is_prepared and state.txn == txn else None
        if decided is not None:
            self._ids.next_epoch = state.epoch + 1
        elif state.state.is_complete and state.txn == txn:
            self._ids.next_epoch = state.epoch
        ahead = state.ahead if state.txn == txn else None
        if ahead is not None and ahead.epoch == epoch + 1:
            self.ahead = ahead  # the next transaction, begun in the same record
            self._ids.next_epoch = ahead.epoch
        self._no_transaction()
        return functools.partial(self._completions.start, decided, record_s) if decided is not None else None

    def _no_transaction(self) -> None:
        """No current transaction: none begun, no participant registered or written, no start."""
        self.txn = None
        self.participants = set()
        self.written = set()
        self.started_ms = None

    def _check_not_fenced(self, state: TidState) -> None:
        """A state the coordinator returned for this producer's id names another producer: fenced."""
        if state.producer_id != self._ids.producer_id:
            raise ProducerFencedError(
                f"transactional id {self.transactional_id!r}: fenced by producer id {state.producer_id}",
                transactional_id=self.transactional_id,
                producer_id=self._ids.producer_id,
                epoch=self._ids.epoch,
                current_producer_id=state.producer_id,
                current_epoch=state.epoch,
            )

    # --- coordinator records and completions ----------------------------------------------------

    def _with_completions(
        self,
        record: Callable[[list[TxnId]], TidState],
        *,
        for_begin: bool = False,
        overlapped: bool = False,
        wait_all: bool = False,
    ) -> TidState:
        """Create a coordinator record of this producer, carrying the Complete of every decided transaction
        whose markers are durable (:mod:`txn_core.clients.producer.completion`). ``overlapped``: entries of the
        producer wait for this record (the overlapped begin), so it writes no markers itself. ``wait_all``:
        wait for every pending transaction's markers first, so the record carries all their Completes."""
        claimed: list[PendingCompletion] = self._completions.claim(
            for_begin=for_begin, finish_failed=not overlapped, wait_all=wait_all
        )
        try:
            state = record([c.txn for c in claimed])
        except BaseException:
            self._completions.release(claimed)
            raise
        self._completions.landed(claimed, state)
        return state

    def finish_completions(self) -> None:
        """Write every pending completion now (markers and Complete records)."""
        done = self._completions.finish()
        if done is None:
            return
        self._check_not_fenced(done)
        if self.txn is None and done.state.is_complete:
            self._ids.move_to(done.epoch, restart=True)

    def _begin_remote(self, participants: list[str], *, overlapped: bool = False) -> None:
        """Persist the ``begin`` of the current transaction with its first participants, at the epoch that
        follows the last decided transaction (whose Complete this record carries if its markers landed)."""
        epoch = self._ids.next_epoch
        state = self._with_completions(
            lambda done: self._coordinator.begin(
                self.transactional_id or "",
                self._ids.producer_id,
                epoch,
                self.transaction_timeout_ms,
                participants,
                completed=done,
            ),
            for_begin=True,
            overlapped=overlapped,
        )
        self._ids.move_to(state.epoch)
        self.txn = state.txn
        self.started_ms = state.start_ms
        self.participants.update(participants)

    def adopt_ahead(self) -> bool:
        """Make the transaction begun ahead, in the record that decided the last one, the current one: its
        participants are registered already, and no record is written (PROTOCOL.md "Begin ahead"). Its
        timeout runs from now, its first write. False if there is none to adopt (never any for an idempotent
        producer)."""
        ahead = self.ahead
        if ahead is None or self.txn is not None:
            return False
        self.ahead = None
        self._ids.move_to(ahead.epoch)
        self.txn = ahead.txn
        self.participants = set(ahead.participants)
        self.started_ms = self._clock()
        return True

    def void_ahead(self) -> None:
        """A closing producer withdraws its transaction begun ahead, never written to, in one record with the
        Complete of the one before it (no marker is due; PROTOCOL.md "Begin ahead"). A failure leaves it to
        the id's next ``init_transactions``, which aborts it."""
        ahead = self.ahead
        self.ahead = None
        if ahead is None or self.txn is not None:
            return
        txn, tid = ahead.txn, self.transactional_id or ""
        try:
            self._with_completions(  # waiting for the markers of the one before, so that its Complete rides along
                lambda done: self._coordinator.withdraw(tid, self._ids.producer_id, ahead.epoch, txn, completed=done),
                wait_all=True,
            )
        except TxnLogError as exc:
            logger.info("producer %s: transaction %s begun ahead left to the next init: %s", tid, txn, exc)

    def ensure_registered(self, logs: list[str], *, overlapped: bool = False) -> None:
        """Persist participants with the coordinator before the first write to each (AddPartitionsToTxn).
        ``overlapped``: the transaction's first entries are in flight behind this begin (the Sender's
        ``_write_with_begin``, on one of its pool threads). A transaction begun ahead is adopted first: only
        participants it did not register need a record."""
        if self.transactional_id is None:
            return
        self.adopt_ahead()
        new = [p for p in dict.fromkeys(logs) if p not in self.participants]
        if not new:
            return
        try:
            if self.txn is None:
                self._begin_remote(new, overlapped=overlapped)
            else:
                txn = self.txn
                self._with_completions(
                    lambda done: self._coordinator.add(
                        self.transactional_id or "", self._ids.producer_id, self._ids.epoch, txn, new, completed=done
                    )
                )
                self.participants.update(new)
        except ProducerFencedError as exc:
            self.fatal(exc)
            raise

    def overlapped_begin(self) -> TxnId | None:
        """The id the current transaction's ``begin`` is expected to get, if its first entries may be written
        while the begin is created (PROTOCOL.md "Transactions", step 3); None if not (one begun already, an
        idempotent producer, or a begin that would write or wait for markers: see below)."""
        if self.txn is not None or self.transactional_id is None:
            return None
        predicted = self._coordinator.predict_txn(self.transactional_id)
        # Overlap only a begin that waits for no older markers (at most one completion pending, which it
        # leaves completing); it writes none either (``overlapped``): either would queue marker writes
        # behind the gated entries, which wait for the begin.
        # Where records are faster than a hand-off to the thread that would write the begin, the begin is
        # written before the entries.
        if predicted is None or self._completions.begin_waits() or self._completions.fast_records():
            return None
        return predicted


def _why(exc: StorageError, reason: str) -> str:
    """Why a commit did not happen: ``reason`` and the store's error, or, when completing an earlier
    transaction failed first, that (nothing of this one was written past it)."""
    return str(exc) if isinstance(exc, CompletionFailedError) else f"{reason} ({exc})"
