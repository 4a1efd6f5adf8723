"""The producer: idempotent by default, transactional with a transactional id (PROTOCOL.md "Transactions").

Idempotence: every producer has a unique producer id; each entry it appends carries ``(producer id,
epoch, base sequence)`` with a sequence per partition. An append whose outcome is unknown stays in flight
with its writer id and payload (:mod:`txn_core.clients.producer.accumulator`); the next :meth:`Producer.flush`
retries exactly that append, which the partition log resolves to the same slot if it had landed. A
duplicate that lands anyway is skipped by readers (same producer, epoch and sequence).

Transactions: ``init_transactions`` fences older instances; ``begin_transaction`` is local; the first
flush to a partition registers it with the coordinator before writing (``begin``/``add`` record);
``commit_transaction`` flushes and persists PrepareCommit (the commit point: from here the transaction
is visible to read_committed readers on every partition at once) and returns. The markers and the
Complete record follow off the critical path (:mod:`txn_core.clients.producer.completion`): the Complete rides on
the producer's next record once the markers are durable, and the next ``begin`` never waits for them.
Every transaction runs at a fresh epoch (KIP-890), so a delayed write or end request of a finished
transaction cannot touch the next one.

Client states change only through :meth:`Producer._transition` (the table in
``txn_core/format/states.py``), errors included: an abortable error (``commit_transaction`` refuses,
``abort_transaction`` works) or a fatal one (fenced: close the producer).

A failed ``commit_transaction`` says what is known: :class:`CommitFailedError` (certainly not committed:
call it again, it resumes, or abort) or :class:`CommitStateUnknownError` (the decision may be durable:
call it again to learn; never treat the transaction as aborted).
"""

from __future__ import annotations

import functools
import itertools
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from txn_core.clients import offsets_fence
from txn_core.clients.producer.accumulator import PartitionBuffer
from txn_core.clients.producer.completion import Completions, PendingCompletion
from txn_core.clients.routing import split_by_key
from txn_core.clients.topics import TopicMeta
from txn_core.coordinator.tidstate import Ahead
from txn_core.coordinator.txnlog import TidState
from txn_core.errors import (
    CommitFailedError,
    CommitStateUnknownError,
    CompletionFailedError,
    ConfigurationError,
    InvalidTxnStateError,
    ObjectExistsError,
    ProducerClosedError,
    ProducerFencedError,
    StorageError,
    TransactionTooLargeError,
    TxnLogError,
    UnknownOutcomeError,
)
from txn_core.format import paths
from txn_core.format.entry import EntryKind, Payload
from txn_core.format.ids import TopicPartition, TxnId, is_int, validate_name
from txn_core.format.schema import conform
from txn_core.format.states import ClientState, check_client_transition
from txn_core.logs import get_logger
from txn_core.partition.partition import AppendResult
from txn_core.partition.staging import StagedRef, reference_payload
from txn_core.storage.base import GateClosedError
from txn_core.storage.parallel import submit

if TYPE_CHECKING:
    from txn_core.log import Log

_S = ClientState
DEFAULT_BATCH_BYTES = 4 << 20
MAX_ENTRY_BYTES = 64 << 20
#: Whether a transactional producer begins its next transaction ahead, in the record that decides the current
#: one (PROTOCOL.md "Begin ahead"): one coordinator record per transaction instead of two. Off only where a
#: test or benchmark needs a transaction's own begin record.
BEGIN_AHEAD = True
#: Records one epoch can write to one partition: the header's base sequence is a signed 32-bit number.
SEQUENCE_LIMIT = 2**31 - 1
logger = get_logger("txnlog.producer")

Offsets = dict[tuple[str, int] | TopicPartition, int]


@dataclass(frozen=True, slots=True)
class RecordMetadata:
    """Where an entry landed."""

    topic: str
    partition: int
    base_offset: int
    record_count: int
    timestamp_ms: int


class Producer:
    """Sends Arrow data to topics; see module doc. Thread-safe."""

    def __init__(
        self,
        log: Log,
        transactional_id: str | None = None,
        *,
        transaction_timeout_ms: int = 60000,
        batch_bytes: int = DEFAULT_BATCH_BYTES,
    ) -> None:
        if transactional_id is not None:
            validate_name("transactional id", transactional_id)
        from txn_core.coordinator.service import MAX_TIMEOUT_MS

        if not is_int(transaction_timeout_ms) or not 0 < transaction_timeout_ms <= MAX_TIMEOUT_MS:
            raise ConfigurationError(
                f"transaction_timeout_ms must be a whole number of milliseconds in [1, {MAX_TIMEOUT_MS}] (15 minutes, "
                f"Kafka's transaction.max.timeout.ms), got {transaction_timeout_ms!r}"
            )
        if batch_bytes <= 0:
            raise ConfigurationError(f"batch_bytes must be positive, got {batch_bytes}")
        self.log = log
        self.transactional_id = transactional_id
        self.transaction_timeout_ms = transaction_timeout_ms
        self.batch_bytes = min(batch_bytes, MAX_ENTRY_BYTES)
        self._lock = threading.RLock()
        self._buffers: dict[str, PartitionBuffer] = {}
        self._schemas: dict[str, pa.Schema] = {}
        self._sequences: dict[str, int] = {}
        #: partition logs where a send_staged append of this idempotent producer failed, not retried since
        self._unsure: set[str] = set()
        self._rr = itertools.count()
        self._pool: ThreadPoolExecutor | None = None
        self._completions = Completions(lambda: self.log.coordinator)
        self._results: list[RecordMetadata] = []
        self.producer_id = -1
        self.epoch = 0
        #: the epoch the next transaction begins at: the current epoch, or a decided one's plus one
        self._next_epoch = 0
        self._state = _S.UNINITIALIZED if transactional_id else _S.READY
        self._txn: TxnId | None = None
        self._participants: set[str] = set()
        #: participants the current transaction wrote to (or tried to): only they get its markers
        self._written: set[str] = set()
        #: when the current transaction started (its begin record, or its first write if begun ahead)
        self._started_ms: int | None = None
        #: the next transaction, begun ahead by the record that decided the last one (PROTOCOL.md "Begin ahead")
        self._ahead: Ahead | None = None
        self._error: BaseException | None = None
        if transactional_id is None:
            from txn_core.coordinator.pidalloc import allocate_producer_id

            self.producer_id = allocate_producer_id(log.storage, clock=log.clock)

    # --- state ----------------------------------------------------------------------------------

    @property
    def state(self) -> ClientState:
        return self._state

    @property
    def transaction_id(self) -> TxnId | None:
        """The coordinator's id of the current transaction (None until its first write)."""
        return self._txn

    def _transition(self, target: ClientState) -> None:
        """The one way the client state changes (the table in ``states.py``). Called by the thread that
        holds the producer's lock, or by a pool thread working for it while it waits (no lock taken)."""
        check_client_transition(self.transactional_id, self._state, target)
        self._state = target

    def _fatal(self, exc: BaseException) -> None:
        """Fenced or failed for good: every later call but ``close`` raises."""
        self._error = exc
        self._ahead = None
        logger.warning("producer %s: fatal error, close it: %s", self.transactional_id, exc)
        self._transition(_S.FATAL_ERROR)

    def _abortable(self, exc: BaseException) -> None:
        """The transaction failed: ``commit_transaction`` refuses, ``abort_transaction`` works."""
        self._error = exc
        logger.info("producer %s: transaction %s must be aborted: %s", self.transactional_id, self._txn, exc)
        self._transition(_S.ABORTABLE_ERROR)

    def _require_open(self) -> None:
        if self._state == _S.CLOSED:
            raise ProducerClosedError(f"producer {self.transactional_id or self.producer_id} is closed")
        if self._state == _S.FATAL_ERROR:
            raise ProducerFencedError(
                f"producer {self.transactional_id!r} is in a fatal state ({self._error}); close it and create "
                "a new one",
                transactional_id=self.transactional_id,
                producer_id=self.producer_id,
                epoch=self.epoch,
            ) from self._error

    def _require_transactional(self, what: str) -> None:
        if self.transactional_id is None:
            raise InvalidTxnStateError(f"{what}() needs a transactional producer: Log.producer(transactional_id='...')")

    def _require_in_transaction(self, what: str) -> None:
        if self.transactional_id is not None and self._state != _S.IN_TRANSACTION:
            if self._state == _S.UNINITIALIZED:
                raise InvalidTxnStateError(
                    f"transactional id {self.transactional_id!r}: call init_transactions() before {what}()",
                    transactional_id=self.transactional_id,
                    current=self._state.value,
                )
            raise InvalidTxnStateError(
                f"transactional id {self.transactional_id!r}: {what}() needs an open transaction "
                f"(state {self._state.value}); call begin_transaction() first",
                transactional_id=self.transactional_id,
                current=self._state.value,
            )

    # --- transactions ---------------------------------------------------------------------------

    def init_transactions(self) -> None:
        """Register this instance: fence older ones and finish the transaction they left open."""
        with self._lock:
            self._require_transactional("init_transactions")
            self._require_open()
            self._transition(_S.INITIALIZING)
            try:
                self._completions.finish()
            except TxnLogError as exc:  # init_producer below finishes whatever is left
                logger.info("producer %s: previous transaction left to init: %s", self.transactional_id, exc)
            self._ahead = None  # fenced with the instance it belonged to: init aborts it
            state = self.log.coordinator.init_producer(self.transactional_id or "", self.transaction_timeout_ms)
            self.producer_id, self.epoch = state.producer_id, state.epoch
            self._next_epoch = state.epoch
            self._sequences.clear()
            self._transition(_S.READY)

    def begin_transaction(self) -> None:
        with self._lock:
            self._require_transactional("begin_transaction")
            self._require_open()
            self._transition(_S.IN_TRANSACTION)
            self._no_transaction()
            self._buffers.clear()

    def send_offsets_to_transaction(
        self, offsets: Offsets, group_id: str, *, start_offsets: Offsets | None = None
    ) -> None:
        """Commit consumer-group offsets atomically with this transaction (visible only if it commits).

        ``start_offsets`` (where this transaction's input for the group started: the group's committed
        offsets the consumer resumed from, or the previous transaction's ``offsets``) fences every other
        writer from the same start (PROTOCOL.md "Offsets fence"): if another transaction claimed it and did
        not abort, this raises :class:`GroupFencedError` and the transaction can only be aborted.

        The offsets may name inputs that are not topics of this log (another log, files, an external
        source: the group keeps an application's position in them), so, unlike ``Consumer.commit``, their
        topics and partitions are not checked against this log.
        """
        with self._lock:
            self._require_transactional("send_offsets_to_transaction")
            self._require_open()
            self._require_in_transaction("send_offsets_to_transaction")
            validate_name("group", group_id)
            table = self.log.groups.offsets_table(offsets)
            self._ensure_registered([paths.group_log_path(group_id)])
            self._write_offsets(group_id, table, offsets, start_offsets)

    def _write_offsets(self, group_id: str, table: pa.Table, offsets: Offsets, start_offsets: Offsets | None) -> None:
        """Append the group's offsets entry (its log registered already) and, with ``start_offsets``, claim
        the start in parallel (PROTOCOL.md "Offsets fence"). May run on a pool thread: takes no lock."""
        path = paths.group_log_path(group_id)
        payload = Payload.of_arrow(table.to_batches(), table.schema)
        if start_offsets is None:
            self._append(path, payload, table.num_rows)
            return
        txn = self._txn
        if txn is None:  # pragma: no cover - registration always yields a transaction id
            raise InvalidTxnStateError(f"transactional id {self.transactional_id!r}: no transaction id")
        tid, pid, epoch = self.transactional_id or "", self.producer_id, self.epoch
        fence = submit(
            lambda: offsets_fence.claim(
                self.log, group_id, start_offsets, offsets, tid=tid, producer_id=pid, epoch=epoch, txn=txn
            )
        )
        try:
            self._append(path, payload, table.num_rows)
        finally:
            try:
                fence.result()
            except TxnLogError as exc:
                self._abortable(exc)
                raise

    def append_to_transaction(
        self,
        path: str,
        payload: bytes,
        *,
        record_count: int = 1,
        check: Callable[[TxnId | None, AppendResult], None] | None = None,
    ) -> AppendResult:
        """Append one transactional DATA entry with an opaque ``payload`` to the internal log ``path``.

        ``path`` is registered as a participant first (like AddPartitionsToTxn), so it gets this
        transaction's COMMIT / ABORT marker in the two-phase end. Used by subscriptions for transactional
        acknowledgements (``txn_core.clients.subscriptions``; PROTOCOL.md "Subscriptions"). ``check`` runs under the
        producer's lock once the entry is durable; if it (or the append) raises a :class:`TxnLogError`, the
        transaction becomes abortable (``commit_transaction`` refuses; call ``abort_transaction``) and the
        error is re-raised.
        """
        with self._lock:
            self._require_transactional("append_to_transaction")
            self._require_open()
            self._require_in_transaction("append_to_transaction")
            self._ensure_registered([path])
            try:
                result = self._append(path, Payload.of(payload), record_count)
                if check is not None:
                    check(self._txn, result)
            except TxnLogError as exc:
                self._abortable(exc)
                raise
            return result

    def commit_transaction(self, metadata: dict[str, Any] | None = None) -> None:
        """Commit: flush, persist PrepareCommit (the commit point) and return; markers and CompleteCommit
        follow in the background (the markers before it returns where records are faster than a hand-off to
        a thread: :data:`~txn_core.clients.producer.completion.FAST_RECORD_S`).

        ``metadata`` (JSON) is stored with the decision and readable afterwards as
        ``Log.transaction_metadata(transactional_id)``: the Spark sink keeps its batch id there. Storage
        failures raise :class:`CommitFailedError` (not committed; call again to resume, or abort) or
        :class:`CommitStateUnknownError` (the decision may be durable; call again to learn it).
        """
        with self._lock:
            self._require_transactional("commit_transaction")
            self._require_open()
            if self._state == _S.ABORTABLE_ERROR:
                raise InvalidTxnStateError(
                    f"transactional id {self.transactional_id!r}: the transaction failed ({self._error}); "
                    "call abort_transaction()",
                    transactional_id=self.transactional_id,
                    current=self._state.value,
                ) from self._error
            self._transition(_S.COMMITTING)
            try:
                try:
                    self._flush_locked()
                    if self._txn is None and metadata is not None and not self._adopt_ahead():
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
                second_phase = self._decide(True, metadata) if self._txn is not None else None
            except ProducerFencedError as exc:
                self._fatal(exc)
                raise
            except StorageError:
                raise  # state stays Committing: commit_transaction() may be called again, or abort
            except TxnLogError as exc:
                self._abortable(exc)
                raise
            self._transition(_S.READY)  # before the second phase: an interrupt there leaves a decided transaction
            if second_phase is not None:
                second_phase()

    def abort_transaction(self) -> None:
        """Abort: drop buffered data; if anything reached the coordinator, persist PrepareAbort (markers and
        CompleteAbort follow in the background)."""
        with self._lock:
            self._require_transactional("abort_transaction")
            self._require_open()
            self._transition(_S.ABORTING)
            self._buffers.clear()
            try:
                second_phase = self._decide(False, None) if self._txn is not None else None
            except ProducerFencedError as exc:
                self._fatal(exc)
                raise
            self._transition(_S.READY)
            if second_phase is not None:
                second_phase()

    def _decide(self, commit: bool, metadata: dict[str, Any] | None) -> Callable[[], None] | None:
        """Persist the decision on the current transaction (folding completed predecessors into the same
        record). Returns what starts its second phase (markers here or in the background), for the caller to
        run once the producer is Ready: the transaction is decided even if that is interrupted."""
        txn = self._txn
        if txn is None:  # pragma: no cover
            return None
        started = time.perf_counter()
        epoch = self.epoch
        try:
            state = self._with_completions(
                lambda done: self.log.coordinator.end(
                    self.transactional_id or "",
                    self.producer_id,
                    epoch,
                    txn,
                    commit,
                    metadata,
                    complete=False,
                    completed=done,
                    started_ms=self._started_ms,
                    written=sorted(self._written),
                    ahead=(self.transaction_timeout_ms, sorted(self._participants)) if BEGIN_AHEAD else None,
                ),
                wait_all=BEGIN_AHEAD,
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
            self._next_epoch = state.epoch + 1
        elif state.state.is_complete and state.txn == txn:
            self._next_epoch = state.epoch
        ahead = state.ahead if state.txn == txn else None
        if ahead is not None and ahead.epoch == epoch + 1:
            self._ahead = ahead  # the next transaction, begun in the same record
            self._next_epoch = ahead.epoch
        self._no_transaction()
        return functools.partial(self._completions.start, decided, record_s) if decided is not None else None

    def _no_transaction(self) -> None:
        """No current transaction: none begun, no participant registered or written, no start."""
        self._txn = None
        self._participants = set()
        self._written = set()
        self._started_ms = None

    def _check_not_fenced(self, state: TidState) -> None:
        """A state the coordinator returned for this producer's id names another producer: fenced."""
        if state.producer_id != self.producer_id:
            raise ProducerFencedError(
                f"transactional id {self.transactional_id!r}: fenced by producer id {state.producer_id}",
                transactional_id=self.transactional_id,
                producer_id=self.producer_id,
                epoch=self.epoch,
                current_producer_id=state.producer_id,
                current_epoch=state.epoch,
            )

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

    def wait_for_markers(self) -> None:
        """Block until the last decided transaction's markers are in every partition it wrote. Its
        Complete record may still be pending: the producer's next record carries it, or ``close()`` writes it."""
        with self._lock:
            self._completions.wait_markers()

    def wait_for_completion(self) -> None:
        """Block until every decided transaction of this producer has all its markers and its Complete
        record written."""
        with self._lock:
            self._finish_completions()

    def _finish_completions(self) -> None:
        done = self._completions.finish()
        if done is None:
            return
        self._check_not_fenced(done)
        if self._txn is None and done.state.is_complete:
            self.epoch = self._next_epoch = done.epoch
            self._sequences.clear()

    def _begin_remote(self, participants: list[str], *, overlapped: bool = False) -> None:
        """Persist the ``begin`` of the current transaction with its first participants, at the epoch that
        follows the last decided transaction (whose Complete this record carries if its markers landed)."""
        epoch = self._next_epoch
        state = self._with_completions(
            lambda done: self.log.coordinator.begin(
                self.transactional_id or "",
                self.producer_id,
                epoch,
                self.transaction_timeout_ms,
                participants,
                completed=done,
            ),
            for_begin=True,
            overlapped=overlapped,
        )
        if state.epoch != self.epoch:
            self._sequences.clear()
        self.epoch = self._next_epoch = state.epoch
        self._txn = state.txn
        self._started_ms = state.start_ms
        self._participants.update(participants)

    def _adopt_ahead(self) -> bool:
        """Make the transaction begun ahead, in the record that decided the last one, the current one: its
        participants are registered already, and no record is written (PROTOCOL.md "Begin ahead"). Its
        timeout runs from now, its first write. False if there is none to adopt (never any for an idempotent
        producer)."""
        ahead = self._ahead
        if ahead is None or self._txn is not None:
            return False
        self._ahead = None
        if ahead.epoch != self.epoch:
            self._sequences.clear()
        self.epoch = self._next_epoch = ahead.epoch
        self._txn = ahead.txn
        self._participants = set(ahead.participants)
        self._started_ms = self.log.clock()
        return True

    def _void_ahead(self) -> None:
        """A closing producer withdraws its transaction begun ahead, never written to, in one record with the
        Complete of the one before it (no marker is due; PROTOCOL.md "Begin ahead"). A failure leaves it to
        the id's next ``init_transactions``, which aborts it."""
        ahead = self._ahead
        self._ahead = None
        if ahead is None or self._txn is not None:
            return
        txn, tid = ahead.txn, self.transactional_id or ""
        try:
            self._with_completions(  # waiting for the markers of the one before, so that its Complete rides along
                lambda done: self.log.coordinator.withdraw(tid, self.producer_id, ahead.epoch, txn, completed=done),
                wait_all=True,
            )
        except TxnLogError as exc:
            logger.info("producer %s: transaction %s begun ahead left to the next init: %s", tid, txn, exc)

    def _ensure_registered(self, logs: list[str], *, overlapped: bool = False) -> None:
        """Persist participants with the coordinator before the first write to each (AddPartitionsToTxn).
        ``overlapped``: the transaction's first entries are in flight behind this begin (``_write_with_begin``).
        A transaction begun ahead is adopted first: only participants it did not register need a record."""
        if self.transactional_id is None:
            return
        self._adopt_ahead()
        new = [p for p in dict.fromkeys(logs) if p not in self._participants]
        if not new:
            return
        try:
            if self._txn is None:
                self._begin_remote(new, overlapped=overlapped)
            else:
                txn = self._txn
                self._with_completions(
                    lambda done: self.log.coordinator.add(
                        self.transactional_id or "", self.producer_id, self.epoch, txn, new, completed=done
                    )
                )
                self._participants.update(new)
        except ProducerFencedError as exc:
            self._fatal(exc)
            raise

    # --- sending --------------------------------------------------------------------------------

    def send(self, topic: str, data: object, *, partition: int | None = None, key_column: str | None = None) -> None:
        """Buffer ``data`` for ``topic``; written when a partition's buffer fills or on flush/commit.

        Routing: ``partition`` if given, else a stable hash of ``key_column``, else one partition per call
        in round-robin. Data is checked against the topic schema first (:class:`SchemaMismatchError`).
        """
        with self._lock:
            self._require_open()
            self._require_in_transaction("send")
            meta = self.log.topics.get(topic, refresh=topic not in self._schemas)
            self._schemas[topic] = meta.schema
            table = conform(data, meta.schema, topic=topic)
            if table.num_rows == 0:
                return
            for p, part in self._route(meta, table, partition, key_column).items():
                path = paths.partition_log_path(topic, p)
                buffer = self._buffers.setdefault(path, PartitionBuffer())
                buffer.add(part)
                if buffer.nbytes >= self.batch_bytes:
                    self._write_buffers({path: buffer})

    def _route(
        self, meta: TopicMeta, table: pa.Table, partition: int | None, key_column: str | None
    ) -> dict[int, pa.Table]:
        if partition is not None:
            if not is_int(partition):
                raise ConfigurationError(
                    f"partition must be an int, got {partition!r} ({type(partition).__name__}): pass e.g. "
                    f"partition=0 (topic {meta.name!r} has partitions 0..{meta.partitions - 1})"
                )
            if not 0 <= partition < meta.partitions:
                meta = self.log.topics.get(meta.name)
                if not 0 <= partition < meta.partitions:
                    raise ConfigurationError(
                        f"partition {partition!r} does not exist in topic {meta.name!r} "
                        f"(partitions 0..{meta.partitions - 1})"
                    )
            return {partition: table}
        if key_column is not None:
            return split_by_key(table, key_column, meta.partitions)
        return {next(self._rr) % meta.partitions: table}

    def send_staged(
        self,
        refs: list[StagedRef],
        *,
        offsets: Offsets | None = None,
        group_id: str | None = None,
        start_offsets: Offsets | None = None,
    ) -> list[RecordMetadata]:
        """Append one DATA_REF entry per staged object (see :mod:`txn_core.partition.staging`), in this transaction.

        The staged rows become visible exactly when the transaction commits; nothing is re-read or copied.
        Refs are checked against the topics' partition counts; entries go to each partition in list order.

        ``offsets`` for ``group_id`` (with ``start_offsets``, fenced) are what
        :meth:`send_offsets_to_transaction` sends, written here together with the references: one
        coordinator record registers every log the transaction writes, and the references, the offsets
        entry and its fence claim are written at once (one round trip instead of three).
        """
        with self._lock:
            self._require_open()
            self._require_in_transaction("send_staged")
            offsets_table: pa.Table | None = None
            if offsets is not None:
                self._require_transactional("send_staged(offsets=...)")
                if group_id is None:
                    raise ConfigurationError("send_staged(offsets=...) needs the group_id the offsets belong to")
                validate_name("group", group_id)
                offsets_table = self.log.groups.offsets_table(offsets)
            by_path: dict[str, list[StagedRef]] = {}
            for ref in refs:
                meta = self.log.topics.get(ref.topic, refresh=ref.topic not in self._schemas)
                self._schemas[ref.topic] = meta.schema
                if not 0 <= ref.partition < meta.partitions:
                    raise ConfigurationError(
                        f"staged data for partition {ref.partition} of topic {ref.topic!r}, "
                        f"which has {meta.partitions} partitions"
                    )
                by_path.setdefault(paths.partition_log_path(ref.topic, ref.partition), []).append(ref)
            group_path = paths.group_log_path(group_id) if offsets_table is not None and group_id else None
            if not by_path and group_path is None:
                return []
            self._adopt_ahead()  # its epoch, and so the sequences, apply from here
            self._make_sequence_room({path: sum(ref.rows for ref in items) for path, items in by_path.items()})
            self._ensure_registered(list(by_path) + ([group_path] if group_path else []))

            def one(path: str, items: list[StagedRef]) -> list[RecordMetadata]:
                out = []
                for ref in items:
                    seq = self._sequences.get(path, 0)
                    try:
                        r = self._append(path, Payload.of(reference_payload(ref)), ref.rows, EntryKind.DATA_REF, seq)
                    except BaseException:
                        if self.transactional_id is None:
                            self._unsure.add(path)  # it may have landed with ``seq``; see _make_sequence_room
                        raise
                    self._unsure.discard(path)  # an append at ``seq`` is in the log now: the failed one's retry
                    self._sequences[path] = seq + ref.rows
                    out.append(RecordMetadata(ref.topic, ref.partition, r.base_offset, ref.rows, r.timestamp_ms))
                return out

            work: list[Callable[[], list[RecordMetadata]]] = [
                functools.partial(one, path, items) for path, items in by_path.items()
            ]
            if offsets_table is not None and group_id is not None and offsets is not None:
                table, group = offsets_table, group_id

                def write_offsets() -> list[RecordMetadata]:
                    self._write_offsets(group, table, offsets, start_offsets)
                    return []

                work.append(write_offsets)
            return [r for rs in self._run_all(work) for r in rs]

    def _run_all(self, work: list[Callable[[], list[RecordMetadata]]]) -> list[list[RecordMetadata]]:
        """Run independent writes at once (one partition log each); every one finishes before this returns
        or raises (the first error)."""
        if len(work) == 1:
            return [work[0]()]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="txnlog-producer")
        futures = [self._pool.submit(w) for w in work]
        results: list[list[RecordMetadata]] = []
        first: BaseException | None = None
        for f in futures:
            try:
                results.append(f.result())
            except BaseException as exc:
                first = first or exc
        if first is not None:
            raise first
        return results

    def flush(self) -> list[RecordMetadata]:
        """Write everything buffered; returns where each entry landed since the last flush."""
        with self._lock:
            self._require_open()
            self._flush_locked()
            results, self._results = self._results, []
            return results

    def _flush_locked(self) -> None:
        todo = {p: b for p, b in self._buffers.items() if b.pending}
        if todo:
            self._write_buffers(todo)

    def _write_buffers(self, todo: dict[str, PartitionBuffer]) -> None:
        self._adopt_ahead()  # its epoch, and so the sequences, apply from here
        self._make_sequence_room({path: b.rows + (b.inflight.rows if b.inflight else 0) for path, b in todo.items()})
        if self._txn is None and self.transactional_id is not None and self.log.storage.stages_creates:
            predicted = self.log.coordinator.predict_txn(self.transactional_id)
            # Overlap only a begin that waits for no older markers (at most one completion pending, which it
            # leaves completing); it writes none either (``overlapped``): either would queue marker writes
            # behind the gated entries, which wait for the begin.
            # Where records are faster than a hand-off to the thread that would write the begin, the begin is
            # written here, before the entries.
            if predicted is not None and not self._completions.begin_waits() and not self._completions.fast_records():
                self._write_with_begin(todo, predicted)
                return
        self._ensure_registered(list(todo))
        self._run_all([functools.partial(self._write_one, path, buffer) for path, buffer in todo.items()])

    def _make_sequence_room(self, rows: dict[str, int]) -> None:
        """Make sure ``rows`` more records per partition log fit in the current epoch's sequences (PROTOCOL.md
        "Idempotence"). An idempotent producer that would pass :data:`SEQUENCE_LIMIT` in a partition first
        writes every append in flight (their outcome unknown: they are resolved at the epoch they were written
        with; sent again at a new epoch, one that had landed would be accepted twice), then moves to the next
        epoch, where every partition's sequence restarts at 0. It refuses while a ``send_staged`` append has an
        unknown outcome (:attr:`_unsure`): only its retry, at this epoch, resolves it. A transaction runs at one
        epoch: it is refused. Nothing is written when it refuses."""
        over = [path for path, n in rows.items() if self._sequences.get(path, 0) + n > SEQUENCE_LIMIT]
        if not over:
            return
        if self.transactional_id is not None:
            raise self._too_large(f"this write would take {over[0]}", "nothing of it was written")
        if self._unsure:
            raise InvalidTxnStateError(
                f"producer id {self.producer_id}: {over[0]} has no sequence numbers left in epoch {self.epoch}, "
                f"and an earlier send_staged to {sorted(self._unsure)[0]} failed with an unknown outcome; retry "
                "that send_staged (the same references) first, so that it resolves at the epoch it was sent in. "
                "Nothing of this write was written"
            )
        inflight = [(path, b) for path, b in self._buffers.items() if b.inflight is not None]
        self._run_all([functools.partial(self._write_one, path, b, only_inflight=True) for path, b in inflight])
        logger.info("producer %d: epoch %d has no sequences left in %s", self.producer_id, self.epoch, over[0])
        self.epoch = self._next_epoch = self.epoch + 1
        self._sequences.clear()

    def _too_large(self, what: str, written: str) -> TransactionTooLargeError:
        return TransactionTooLargeError(
            f"transactional id {self.transactional_id!r}: {what} past {SEQUENCE_LIMIT:,} records in one "
            f"transaction (the sequence numbers of one epoch); {written}. Abort the transaction and commit in "
            "smaller ones"
        )

    def _write_with_begin(self, todo: dict[str, PartitionBuffer], predicted: TxnId) -> None:
        """The transaction's first writes overlap its ``begin`` record, on a store that stages creates
        (local disk): each entry is written and fsynced under the transaction id the begin is expected to
        get, and linked only once the begin is durable with that id (the gate). The rule "a participant is
        registered before any of its data is visible" holds as without the overlap; if the begin landed
        at another slot, the staged entries are dropped unseen and written again under the real id."""
        if self._next_epoch != self.epoch:  # the begin's epoch: the entries carry it, sequences restart
            self.epoch = self._next_epoch
            self._sequences.clear()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="txnlog-producer")
        begun = self._pool.submit(functools.partial(self._ensure_registered, list(todo), overlapped=True))

        def gate() -> bool:
            begun.result()
            return self._txn == predicted

        try:
            self._run_all(
                [functools.partial(self._write_one, path, buffer, predicted, gate) for path, buffer in todo.items()]
            )
        except GateClosedError:
            logger.debug("producer %s: begin landed at %s, not %s", self.transactional_id, self._txn, predicted)
            self._run_all([functools.partial(self._write_one, path, buffer) for path, buffer in todo.items()])
        finally:
            wait([begun])  # the begin's own error, if any, was raised through the gate

    def _write_one(
        self,
        path: str,
        buffer: PartitionBuffer,
        txn: TxnId | None = None,
        gate: Callable[[], bool] | None = None,
        *,
        only_inflight: bool = False,
    ) -> list[RecordMetadata]:
        """Append ``buffer``'s in-flight entry (if any), then (unless ``only_inflight``) its buffered tables as
        entries (the first one behind ``gate``, under ``txn`` instead of the current transaction id when given)."""
        while True:
            if buffer.inflight is None:
                if only_inflight or not buffer.tables:
                    return []
                buffer.next_entry(MAX_ENTRY_BYTES, self._sequences.get(path, 0))
            inflight = buffer.inflight
            if inflight is None:  # pragma: no cover
                return []
            result = self._append(
                path, inflight.payload, inflight.rows, EntryKind.DATA, inflight.sequence, inflight.writer_id, txn, gate
            )
            gate = None  # open: later entries follow it
            buffer.inflight = None
            self._sequences[path] = inflight.sequence + inflight.rows
            topic, partition = _split_path(path)
            self._results.append(
                RecordMetadata(topic, partition, result.base_offset, inflight.rows, result.timestamp_ms)
            )

    def _append(
        self,
        path: str,
        payload: Payload,
        record_count: int,
        kind: EntryKind = EntryKind.DATA,
        sequence: int = -1,
        writer_id: bytes | None = None,
        txn: TxnId | None = None,
        gate: Callable[[], bool] | None = None,
    ) -> AppendResult:
        """One entry of this producer (its id, epoch and current transaction, or ``txn``) into ``path``."""
        if sequence + record_count > SEQUENCE_LIMIT:  # _make_sequence_room is asked first where it can help
            raise self._too_large(
                f"an entry of {record_count:,} records would take {path}", "this entry was not written"
            )
        if self.transactional_id is not None:
            self._written.add(path)  # before the attempt: one whose outcome is unknown may have landed
        return self.log.partition_log(path).append_payload(
            kind,
            payload,
            record_count,
            producer_id=self.producer_id,
            producer_epoch=self.epoch,
            base_sequence=sequence,
            txn=txn or self._txn,
            writer_id=writer_id,
            gate=gate,
        )

    # --- lifecycle ------------------------------------------------------------------------------

    def close(self, *, flush: bool = True) -> None:
        """Flush (idempotent producer), finish decided transactions and release resources. An open
        transaction is left to its timeout unless aborted first."""
        with self._lock:
            if self._state == _S.CLOSED:
                return
            try:
                if flush and self.transactional_id is None and self._state != _S.FATAL_ERROR:
                    self._flush_locked()
                if self._state != _S.FATAL_ERROR:
                    self._void_ahead()
                    self._finish_completions()
            finally:
                self._completions.shutdown()
                if self._pool is not None:
                    self._pool.shutdown(wait=True)
                    self._pool = None
                self._transition(_S.CLOSED)

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(flush=exc[0] is None)


def _why(exc: StorageError, reason: str) -> str:
    """Why a commit did not happen: ``reason`` and the store's error, or, when completing an earlier
    transaction failed first, that (nothing of this one was written past it)."""
    return str(exc) if isinstance(exc, CompletionFailedError) else f"{reason} ({exc})"


def _split_path(path: str) -> tuple[str, int]:
    """(topic, partition) of a partition log path; groups map to ('__group:<id>', 0)."""
    parts = path.split("/")
    if parts[0] == "topics" and len(parts) == 3:
        return parts[1], int(parts[2])
    return f"__{parts[0]}:{parts[1]}", 0
