"""The producer: idempotent by default, transactional with a transactional id (PROTOCOL.md "Producing").

Idempotence: every producer has a unique producer id; each entry it appends carries ``(producer id,
epoch, base sequence)`` with a sequence per partition. An append whose outcome is unknown stays pending
with its writer id and payload; the next :meth:`Producer.flush` retries exactly that append, which the
partition log resolves to the same slot if it had landed. A duplicate that lands anyway is skipped by
readers (same producer, epoch and sequence).

Transactions: ``init_transactions`` fences older instances; ``begin_transaction`` is local; the first
flush to a partition registers it with the coordinator before writing (``begin``/``add`` record);
``commit_transaction`` flushes and persists PrepareCommit (the commit point: from here the transaction
is visible to read_committed readers on every partition at once) and returns; the markers and
CompleteCommit are written by a background thread while the application prepares the next transaction,
whose first coordinator request waits for them. ``close()`` and ``wait_for_completion()`` wait too; if
the process dies first, the next participant completes the transaction (PROTOCOL.md "Recovery").
The epoch is bumped by every completion (KIP-890), so a delayed write or end request of a finished
transaction cannot touch the next one.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from txn_core import offsets_fence, paths
from txn_core.coordinator.states import ClientState, CoordinatorState, check_client_transition
from txn_core.coordinator.txnlog import TidState
from txn_core.entry import EntryKind, crc32, encode_arrow
from txn_core.errors import (
    ConfigurationError,
    InvalidTxnStateError,
    ProducerClosedError,
    ProducerFencedError,
    StorageError,
    TxnLogError,
)
from txn_core.ids import TopicPartition, TxnId, validate_name
from txn_core.parallel import submit
from txn_core.partition import AppendResult
from txn_core.routing import split_by_key
from txn_core.schema import conform
from txn_core.staging import StagedRef, reference_payload
from txn_core.topics import TopicMeta

if TYPE_CHECKING:
    from txn_core.log import Log

_S = ClientState
DEFAULT_BATCH_BYTES = 4 << 20
MAX_ENTRY_BYTES = 64 << 20


@dataclass
class _Pending:
    """Data buffered for one partition log, and an append whose outcome is not known yet."""

    tables: list[pa.Table] = field(default_factory=list)
    nbytes: int = 0
    rows: int = 0
    inflight: tuple[bytes, pa.Buffer, int, int] | None = None  # writer id, payload, rows, sequence


#: How long a decided transaction waits for the next one to carry its Complete record.
COMPLETE_LINGER_S = 0.2


@dataclass
class _PendingCompletion:
    """The second phase of a decided transaction, run by the producer's background thread."""

    prepared: TidState
    future: Future[None] | None = None
    claimed: threading.Event = field(default_factory=threading.Event)
    markers_written: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    completed: TidState | None = None
    folded: bool = False


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
        if not isinstance(transaction_timeout_ms, int) or transaction_timeout_ms <= 0:
            raise ConfigurationError(
                f"transaction_timeout_ms must be a positive integer, got {transaction_timeout_ms!r}"
            )
        if batch_bytes <= 0:
            raise ConfigurationError(f"batch_bytes must be positive, got {batch_bytes}")
        self.log = log
        self.transactional_id = transactional_id
        self.transaction_timeout_ms = transaction_timeout_ms
        self.batch_bytes = min(batch_bytes, MAX_ENTRY_BYTES)
        self._lock = threading.RLock()
        self._pending: dict[str, _Pending] = {}
        self._schemas: dict[str, pa.Schema] = {}
        self._sequences: dict[str, int] = {}
        self._rr = itertools.count()
        self._pool: ThreadPoolExecutor | None = None
        self._completer: ThreadPoolExecutor | None = None
        self._pending_completion: _PendingCompletion | None = None
        self._results: list[RecordMetadata] = []
        self.producer_id = -1
        self.epoch = 0
        # transactional state
        self._state = _S.UNINITIALIZED if transactional_id else _S.READY
        self._txn: TxnId | None = None
        self._participants: set[str] = set()
        self._error: BaseException | None = None
        if transactional_id is None:
            from txn_core.pidalloc import allocate_producer_id

            self.producer_id = allocate_producer_id(log.storage)

    # --- state ----------------------------------------------------------------------------------

    @property
    def state(self) -> ClientState:
        return self._state

    @property
    def transaction_id(self) -> TxnId | None:
        """The coordinator's id of the current transaction (None until its first write)."""
        return self._txn

    def _transition(self, target: ClientState) -> None:
        check_client_transition(self.transactional_id, self._state, target)
        self._state = target

    def _require_open(self) -> None:
        if self._state == _S.CLOSED:
            raise ProducerClosedError(f"producer {self.transactional_id or self.producer_id} is closed")
        if self._state == _S.FATAL_ERROR:
            raise ProducerFencedError(
                f"producer {self.transactional_id!r} is in a fatal state ({self._error}); close it and create a new one"
            ) from self._error

    def _fatal(self, exc: BaseException) -> None:
        self._error = exc
        self._state = _S.FATAL_ERROR

    # --- transactions ---------------------------------------------------------------------------

    def init_transactions(self) -> None:
        """Register this instance: fence older ones and finish the transaction they left open."""
        with self._lock:
            self._require_transactional("init_transactions")
            self._require_open()
            self._transition(_S.INITIALIZING)
            with contextlib.suppress(TxnLogError):
                self._await_completion()  # init_producer below finishes whatever is left
            state = self.log.coordinator.init_producer(self.transactional_id or "", self.transaction_timeout_ms)
            self.producer_id, self.epoch = state.producer_id, state.epoch
            self._sequences.clear()
            self._transition(_S.READY)

    def begin_transaction(self) -> None:
        with self._lock:
            self._require_transactional("begin_transaction")
            self._require_open()
            self._transition(_S.IN_TRANSACTION)
            self._txn = None
            self._participants = set()
            self._pending.clear()

    def send_offsets_to_transaction(
        self,
        offsets: dict[tuple[str, int] | TopicPartition, int],
        group_id: str,
        *,
        start_offsets: dict[tuple[str, int] | TopicPartition, int] | None = None,
    ) -> None:
        """Commit consumer-group offsets atomically with this transaction (visible only if it commits).

        ``start_offsets`` (where this transaction's input for the group started: the group's committed
        offsets the consumer resumed from, or the previous transaction's ``offsets``) fences every other
        writer from the same start (PROTOCOL.md "Offsets fence"): if another transaction claimed it and did
        not abort, this raises :class:`GroupFencedError` and the transaction can only be aborted.
        """
        with self._lock:
            self._require_transactional("send_offsets_to_transaction")
            self._require_open()
            if self._state != _S.IN_TRANSACTION:
                raise InvalidTxnStateError(
                    f"transactional id {self.transactional_id!r}: send_offsets_to_transaction needs an open "
                    f"transaction (state {self._state.value}); call begin_transaction() first"
                )
            validate_name("group", group_id)
            table = self.log.groups.offsets_table(offsets)
            path = paths.group_log_path(group_id)
            self._ensure_registered([path])
            self._write_offsets(group_id, table, offsets, start_offsets)

    def _write_offsets(
        self,
        group_id: str,
        table: pa.Table,
        offsets: dict[tuple[str, int] | TopicPartition, int],
        start_offsets: dict[tuple[str, int] | TopicPartition, int] | None,
    ) -> None:
        """Append the group's offsets entry (its log registered already) and, with ``start_offsets``, claim
        the start in parallel (PROTOCOL.md "Offsets fence"). May run on a pool thread: takes no lock."""
        path = paths.group_log_path(group_id)
        if start_offsets is None:
            self._append_data(path, table, sequence=False)
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
            self._append_data(path, table, sequence=False)
        finally:
            try:
                fence.result()
            except TxnLogError as exc:
                self._state = _S.ABORTABLE_ERROR
                self._error = exc
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
        acknowledgements (``txn_core.subscriptions``; PROTOCOL.md "Subscriptions"). ``check`` runs under the
        producer's lock once the entry is durable; if it (or the append) raises a :class:`TxnLogError`, the
        transaction becomes abortable (``commit_transaction`` refuses; call ``abort_transaction``) and the
        error is re-raised.
        """
        with self._lock:
            self._require_transactional("append_to_transaction")
            self._require_open()
            if self._state != _S.IN_TRANSACTION:
                raise InvalidTxnStateError(
                    f"transactional id {self.transactional_id!r}: append_to_transaction needs an open "
                    f"transaction (state {self._state.value}); call begin_transaction() first"
                )
            self._ensure_registered([path])
            try:
                result = self.log.partition_log(path).append(
                    EntryKind.DATA,
                    payload,
                    len(payload),
                    crc32(payload),
                    record_count,
                    producer_id=self.producer_id,
                    producer_epoch=self.epoch,
                    txn=self._txn,
                )
                if check is not None:
                    check(self._txn, result)
            except TxnLogError as exc:
                self._state = _S.ABORTABLE_ERROR
                self._error = exc
                raise
            return result

    def commit_transaction(self, metadata: dict[str, Any] | None = None) -> None:
        """Commit: flush, persist PrepareCommit (the commit point), write markers, persist CompleteCommit.

        ``metadata`` (JSON) is stored with the decision and readable afterwards as
        ``Log.transaction_metadata(transactional_id)``: the Spark sink keeps its batch id there.
        """
        with self._lock:
            self._require_transactional("commit_transaction")
            self._require_open()
            if self._state == _S.ABORTABLE_ERROR:
                raise InvalidTxnStateError(
                    f"transactional id {self.transactional_id!r}: the transaction failed ({self._error}); "
                    "call abort_transaction()"
                ) from self._error
            self._transition(_S.COMMITTING)
            try:
                self._flush_locked()
                if self._txn is None and metadata is not None:
                    self._begin_remote([])
                if self._txn is not None:
                    state = self.log.coordinator.end(
                        self.transactional_id or "",
                        self.producer_id,
                        self.epoch,
                        self._txn,
                        True,
                        metadata,
                        complete=False,
                    )
                    self._after_decision(state)
            except ProducerFencedError as exc:
                self._fatal(exc)
                raise
            except StorageError:
                raise  # outcome unknown: commit_transaction() may be retried, or the transaction aborted
            except TxnLogError as exc:
                self._state = _S.ABORTABLE_ERROR
                self._error = exc
                raise
            self._transition(_S.READY)

    def abort_transaction(self) -> None:
        """Abort: drop buffered data; if anything reached the coordinator, persist PrepareAbort, markers,
        CompleteAbort."""
        with self._lock:
            self._require_transactional("abort_transaction")
            self._require_open()
            self._transition(_S.ABORTING)
            self._pending.clear()
            try:
                if self._txn is not None:
                    state = self.log.coordinator.end(
                        self.transactional_id or "", self.producer_id, self.epoch, self._txn, False, complete=False
                    )
                    self._after_decision(state)
            except ProducerFencedError as exc:
                self._fatal(exc)
                raise
            self._transition(_S.READY)

    def _after_decision(self, state: TidState) -> None:
        """The decision is durable: write the markers in the background (second phase).

        The Complete* record is deferred: the next transaction's ``begin`` carries it (one record for
        both, :meth:`TransactionCoordinator.complete_and_begin`), or, if no transaction begins within
        :data:`COMPLETE_LINGER_S`, the background thread writes it alone. ``close()`` and
        ``wait_for_completion()`` finish it at once.
        """
        if state.state.is_prepared:
            if self._completer is None:
                self._completer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="txnlog-completer")
            pending = _PendingCompletion(state)
            pending.future = self._completer.submit(self._second_phase, pending)
            self._pending_completion = pending
            self._txn = None
            self._participants = set()
        else:
            self._after_end(state)

    def _second_phase(self, pending: _PendingCompletion) -> None:
        self.log.coordinator.write_markers(pending.prepared)
        pending.markers_written.set()
        if pending.claimed.wait(COMPLETE_LINGER_S):
            return  # the next begin (or close) completes it
        with pending.lock:
            if pending.completed is None and not pending.folded:
                pending.completed = self.log.coordinator.complete(pending.prepared, markers_written=True)

    def _take_completion(self, begin_participants: list[str] | None = None) -> TidState | None:
        """Finish the previous transaction's second phase; with ``begin_participants``, begin the next
        transaction in the same record. Returns the begun state (or None)."""
        pending = self._pending_completion
        if pending is None:
            return None
        pending.claimed.set()
        try:
            if pending.future is not None:
                pending.future.result()  # the markers are written (or this raises)
            with pending.lock:
                if pending.completed is None and begin_participants is not None:
                    pending.folded = True
                    begun = self.log.coordinator.complete_and_begin(
                        pending.prepared, self.transaction_timeout_ms, begin_participants
                    )
                    self._pending_completion = None
                    self._sequences.clear()
                    self.epoch = begun.epoch
                    return begun
                if pending.completed is None:
                    pending.completed = self.log.coordinator.complete(pending.prepared, markers_written=True)
                done = pending.completed
        except TxnLogError:
            done = self.log.coordinator.complete(pending.prepared)  # retry the whole second phase once
        self._pending_completion = None
        self._after_end(done)
        return None

    def _await_completion(self) -> None:
        """Wait for the previous transaction's markers and Complete record; adopt the bumped epoch."""
        self._take_completion()

    def wait_for_markers(self) -> None:
        """Block until the last decided transaction's markers are in every partition it wrote. Its
        Complete record may still be pending: the next ``begin`` carries it, or ``close()`` writes it."""
        with self._lock:
            pending = self._pending_completion
            if pending is None or pending.future is None:
                return
            while not pending.markers_written.wait(0.05):
                if pending.future.done():
                    if pending.future.exception() is not None:
                        self._take_completion()  # retries the whole second phase once, or raises
                    return

    def wait_for_completion(self) -> None:
        """Block until every decided transaction of this producer has all its markers written."""
        with self._lock:
            self._await_completion()

    def _after_end(self, state: TidState) -> None:
        if state.producer_id != self.producer_id:
            raise ProducerFencedError(f"transactional id {self.transactional_id!r}: fenced")
        if state.state in (CoordinatorState.COMPLETE_COMMIT, CoordinatorState.COMPLETE_ABORT):
            self.epoch = state.epoch
            self._sequences.clear()
        self._txn = None
        self._participants = set()

    def _require_transactional(self, what: str) -> None:
        if self.transactional_id is None:
            raise InvalidTxnStateError(f"{what}() needs a transactional producer: Log.producer(transactional_id='...')")

    def _begin_remote(self, participants: list[str]) -> None:
        state = self._take_completion(begin_participants=participants)
        if state is None:
            state = self.log.coordinator.begin(
                self.transactional_id or "", self.producer_id, self.epoch, self.transaction_timeout_ms, participants
            )
        self._txn = state.txn
        self._participants.update(participants)

    def _ensure_registered(self, logs: list[str]) -> None:
        """Persist participants with the coordinator before the first write to each (AddPartitionsToTxn)."""
        if self.transactional_id is None:
            return
        new = [p for p in dict.fromkeys(logs) if p not in self._participants]
        if not new:
            return
        try:
            if self._txn is None:
                self._begin_remote(new)
            else:
                self.log.coordinator.add(self.transactional_id, self.producer_id, self.epoch, self._txn, new)
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
            if self.transactional_id is not None and self._state != _S.IN_TRANSACTION:
                if self._state == _S.UNINITIALIZED:
                    raise InvalidTxnStateError(
                        f"transactional id {self.transactional_id!r}: call init_transactions() before send()"
                    )
                raise InvalidTxnStateError(
                    f"transactional id {self.transactional_id!r}: send() needs an open transaction "
                    f"(state {self._state.value}); call begin_transaction() first"
                )
            meta = self.log.topics.get(topic, refresh=topic not in self._schemas)
            self._schemas[topic] = meta.schema
            table = conform(data, meta.schema, topic=topic)
            if table.num_rows == 0:
                return
            for p, part in self._route(meta, table, partition, key_column).items():
                self._buffer(paths.partition_log_path(topic, p), part)

    def _route(
        self, meta: TopicMeta, table: pa.Table, partition: int | None, key_column: str | None
    ) -> dict[int, pa.Table]:
        if partition is not None:
            if not isinstance(partition, int) or not 0 <= partition < meta.partitions:
                meta = self.log.topics.get(meta.name)
                if not isinstance(partition, int) or not 0 <= partition < meta.partitions:
                    raise ConfigurationError(
                        f"partition {partition!r} does not exist in topic {meta.name!r} "
                        f"(partitions 0..{meta.partitions - 1})"
                    )
            return {partition: table}
        if key_column is not None:
            return split_by_key(table, key_column, meta.partitions)
        return {next(self._rr) % meta.partitions: table}

    def _buffer(self, path: str, table: pa.Table) -> None:
        pending = self._pending.setdefault(path, _Pending())
        pending.tables.append(table)
        pending.nbytes += table.nbytes
        pending.rows += table.num_rows
        if pending.nbytes >= self.batch_bytes:
            self._write_pending({path: pending})

    def send_staged(
        self,
        refs: list[StagedRef],
        *,
        offsets: dict[tuple[str, int] | TopicPartition, int] | None = None,
        group_id: str | None = None,
        start_offsets: dict[tuple[str, int] | TopicPartition, int] | None = None,
    ) -> list[RecordMetadata]:
        """Append one DATA_REF entry per staged object (see :mod:`txn_core.staging`), in this transaction.

        The staged rows become visible exactly when the transaction commits; nothing is re-read or copied.
        Refs are checked against the topics' partition counts; entries go to each partition in list order.

        ``offsets`` for ``group_id`` (with ``start_offsets``, fenced) are what
        :meth:`send_offsets_to_transaction` sends, written here together with the references: one
        coordinator record registers every log the transaction writes, and the references, the offsets
        entry and its fence claim are written at once (one round trip instead of three).
        """
        with self._lock:
            self._require_open()
            if self.transactional_id is not None and self._state != _S.IN_TRANSACTION:
                raise InvalidTxnStateError(
                    f"transactional id {self.transactional_id!r}: send_staged() needs an open transaction "
                    f"(state {self._state.value}); call begin_transaction() first"
                )
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
            self._ensure_registered(list(by_path) + ([group_path] if group_path else []))
            results: list[RecordMetadata] = []

            def one(path: str, items: list[StagedRef]) -> list[RecordMetadata]:
                out = []
                plog = self.log.partition_log(path)
                for ref in items:
                    payload = reference_payload(ref)
                    seq = self._sequences.get(path, 0)
                    r = plog.append(
                        EntryKind.DATA_REF,
                        payload,
                        len(payload),
                        crc32(payload),
                        ref.rows,
                        producer_id=self.producer_id,
                        producer_epoch=self.epoch,
                        base_sequence=seq,
                        txn=self._txn,
                    )
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
            if len(work) == 1:
                return work[0]()
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="txnlog-producer")
            futures = [self._pool.submit(w) for w in work]
            first: BaseException | None = None
            for f in futures:  # every write finishes before this returns or raises
                try:
                    results.extend(f.result())
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
        todo = {p: pend for p, pend in self._pending.items() if pend.tables or pend.inflight}
        if todo:
            self._write_pending(todo)

    def _write_pending(self, todo: dict[str, _Pending]) -> None:
        self._ensure_registered(list(todo))
        if len(todo) == 1:
            for path, pend in todo.items():
                self._write_one(path, pend)
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="txnlog-producer")
        futures = [self._pool.submit(self._write_one, path, pend) for path, pend in todo.items()]
        errors = []
        for f in futures:
            try:
                f.result()
            except BaseException as exc:
                errors.append(exc)
        if errors:
            raise errors[0]

    def _write_one(self, path: str, pending: _Pending) -> None:
        """Append ``pending``'s in-flight entry (if any), then its buffered tables as entries."""
        if pending.inflight is not None:
            self._append_inflight(path, pending)
        while pending.tables:
            tables: list[pa.Table] = []
            nbytes = 0
            while pending.tables and (not tables or nbytes + pending.tables[0].nbytes <= MAX_ENTRY_BYTES):
                t = pending.tables.pop(0)
                tables.append(t)
                nbytes += t.nbytes
            pending.nbytes -= nbytes
            rows = sum(t.num_rows for t in tables)
            pending.rows -= rows
            batches = [b for t in tables for b in t.to_batches() if b.num_rows]
            payload = encode_arrow(batches, tables[0].schema)
            seq = self._sequences.get(path, 0)
            pending.inflight = (uuid.uuid4().bytes, payload, rows, seq)
            self._append_inflight(path, pending)

    def _append_inflight(self, path: str, pending: _Pending) -> None:
        if pending.inflight is None:  # pragma: no cover
            return
        writer_id, payload, rows, seq = pending.inflight
        view = memoryview(payload)
        result = self.log.partition_log(path).append(
            EntryKind.DATA,
            [view],
            len(view),
            crc32(view),
            rows,
            producer_id=self.producer_id,
            producer_epoch=self.epoch,
            base_sequence=seq,
            txn=self._txn,
            writer_id=writer_id,
        )
        pending.inflight = None
        self._sequences[path] = seq + rows
        topic, partition = _split_path(path)
        self._results.append(RecordMetadata(topic, partition, result.base_offset, rows, result.timestamp_ms))

    def _append_data(self, path: str, table: pa.Table, *, sequence: bool) -> None:
        batches = table.to_batches()
        payload = encode_arrow(batches, table.schema)
        view = memoryview(payload)
        seq = self._sequences.get(path, 0) if sequence else -1
        self.log.partition_log(path).append(
            EntryKind.DATA,
            [view],
            len(view),
            crc32(view),
            table.num_rows,
            producer_id=self.producer_id,
            producer_epoch=self.epoch,
            base_sequence=seq,
            txn=self._txn,
        )
        if sequence:
            self._sequences[path] = seq + table.num_rows

    # --- lifecycle ------------------------------------------------------------------------------

    def close(self, *, flush: bool = True) -> None:
        """Flush (idempotent producer) and release resources. An open transaction is left to its timeout
        unless aborted first."""
        with self._lock:
            if self._state == _S.CLOSED:
                return
            try:
                if flush and self.transactional_id is None and self._state != _S.FATAL_ERROR:
                    self._flush_locked()
                if self._state != _S.FATAL_ERROR:
                    self._await_completion()
            finally:
                if self._completer is not None:
                    self._completer.shutdown(wait=True)
                    self._completer = None
                if self._pool is not None:
                    self._pool.shutdown(wait=True)
                    self._pool = None
                self._state = _S.CLOSED

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(flush=exc[0] is None)


def _split_path(path: str) -> tuple[str, int]:
    """(topic, partition) of a partition log path; groups map to ('__group:<id>', 0)."""
    parts = path.split("/")
    if parts[0] == "topics" and len(parts) == 3:
        return parts[1], int(parts[2])
    return f"__{parts[0]}:{parts[1]}", 0
