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

A failed ``commit_transaction`` says what is known: :class:`CommitFailedError` (certainly not committed:
call it again, it resumes, or abort) or :class:`CommitStateUnknownError` (the decision may be durable:
call it again to learn; never treat the transaction as aborted).

:class:`Producer` is the public API and only composes, as Kafka's ``KafkaProducer`` does: the
:class:`~txn_core.clients.producer.states.ClientStateMachine` (client states, errors, the checks each call
makes first), the :class:`~txn_core.clients.producer.transactions.TransactionManager` (init, begin, commit,
abort and every coordinator request), the :class:`~txn_core.clients.producer.sequences.ProducerSequences`
(producer id, epoch, sequences), the :class:`~txn_core.clients.producer.accumulator.RecordAccumulator`
(routing, buffers per partition log), the :class:`~txn_core.clients.producer.sender.Sender` (writing
entries) and the :class:`~txn_core.clients.producer.completion.Completions` (the second phase of decided
transactions). Each is given what it uses, not the :class:`~txn_core.Log`.

Locking: every public method holds the producer's lock (``_lock``, reentrant) throughout; the components
take no lock of their own (their module docs say which of their work the Sender's pool threads do while
the lock's holder waits). :class:`Completions` has locks of its own for its background thread.
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from txn_core.clients import offsets_fence
from txn_core.clients.groups import offset_items
from txn_core.clients.producer import carried
from txn_core.clients.producer.accumulator import DEFAULT_BATCH_BYTES, MAX_ENTRY_BYTES, RecordAccumulator
from txn_core.clients.producer.carried import MarkerOffers
from txn_core.clients.producer.completion import Completions
from txn_core.clients.producer.sender import Offsets, OffsetsEntry, RecordMetadata, Sender
from txn_core.clients.producer.sequences import SEQUENCE_LIMIT, ProducerSequences
from txn_core.clients.producer.states import ClientStateMachine
from txn_core.clients.producer.transactions import TransactionManager
from txn_core.errors import ConfigurationError, TxnLogError
from txn_core.format import paths
from txn_core.format.entry import Payload
from txn_core.format.ids import TxnId, is_int, validate_name
from txn_core.format.schema import conform
from txn_core.format.states import ClientState
from txn_core.partition.partition import AppendResult
from txn_core.partition.staging import StagedRef

if TYPE_CHECKING:
    from txn_core.clients.context import SupportsContext

__all__ = [
    "BEGIN_AHEAD",
    "DEFAULT_BATCH_BYTES",
    "MAX_ENTRY_BYTES",
    "SEQUENCE_LIMIT",
    "Offsets",
    "Producer",
    "RecordMetadata",
]

_S = ClientState
#: Whether a transactional producer begins its next transaction ahead, in the record that decides the current
#: one (PROTOCOL.md "Begin ahead"): one coordinator record per transaction instead of two. Off only where a
#: test or benchmark needs a transaction's own begin record. Read at each decision.
BEGIN_AHEAD = True

#: The longest ``marker_linger_ms``: well below the 5 s after which anyone completes a prepared transaction.
MAX_MARKER_LINGER_MS = 1000


class Producer:
    """Sends Arrow data to topics; see module doc. Thread-safe."""

    def __init__(
        self,
        log: SupportsContext,
        transactional_id: str | None = None,
        *,
        transaction_timeout_ms: int = 60000,
        batch_bytes: int = DEFAULT_BATCH_BYTES,
        marker_linger_ms: int | None = None,
    ) -> None:
        ctx = log.context
        if marker_linger_ms is None:
            marker_linger_ms = round(carried.MARKER_LINGER_S * 1000)
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
        if not is_int(marker_linger_ms) or not 0 <= marker_linger_ms <= MAX_MARKER_LINGER_MS:
            raise ConfigurationError(
                f"marker_linger_ms must be a whole number of milliseconds in [0, {MAX_MARKER_LINGER_MS}] (how long a "
                "decided transaction's markers wait to travel in the producer's next entries; 0 writes them at "
                f"once), got {marker_linger_ms!r}"
            )
        self.ctx = ctx
        self.transactional_id = transactional_id
        self.transaction_timeout_ms = transaction_timeout_ms
        self._lock = threading.RLock()
        #: decided transactions' markers waiting for this producer's next entries (PROTOCOL.md "Carried markers")
        self._offers = (
            MarkerOffers(marker_linger_ms / 1000) if transactional_id is not None and marker_linger_ms else None
        )
        self._completions = Completions(lambda: self.ctx.coordinator, self._offers)
        self._ids = ProducerSequences()
        if transactional_id is None:
            from txn_core.coordinator.pidalloc import allocate_producer_id

            self._ids.producer_id = allocate_producer_id(ctx.storage, clock=ctx.clock)
        self._states = ClientStateMachine(transactional_id, self._ids)
        self._txns = TransactionManager(
            transactional_id,
            transaction_timeout_ms,
            states=self._states,
            ids=self._ids,
            coordinator=ctx.coordinator,
            completions=self._completions,
            clock=ctx.clock,
        )
        self._accumulator = RecordAccumulator(ctx.topics, min(batch_bytes, MAX_ENTRY_BYTES))
        self._sender = Sender(
            self._txns,
            self._ids,
            self._accumulator,
            partition_log=ctx.partition_log,
            claim_fence=functools.partial(offsets_fence.claim, ctx),
            stages_creates=ctx.storage.stages_creates,
            remote=ctx.storage.overlap_reads,
            offers=self._offers,
        )

    # --- state ----------------------------------------------------------------------------------

    @property
    def state(self) -> ClientState:
        return self._states.state

    @property
    def transaction_id(self) -> TxnId | None:
        """The coordinator's id of the current transaction (None until its first write)."""
        return self._txns.txn

    @property
    def producer_id(self) -> int:
        return self._ids.producer_id

    @property
    def epoch(self) -> int:
        """The epoch this producer's entries carry now."""
        return self._ids.epoch

    @property
    def batch_bytes(self) -> int:
        """A partition's buffered bytes that make it write (at most :data:`MAX_ENTRY_BYTES`)."""
        return self._accumulator.batch_bytes

    @property
    def _sequences(self) -> dict[str, int]:
        """The next base sequence per partition log in the current epoch (tests set it near the limit)."""
        return self._ids.sequences

    # --- transactions ---------------------------------------------------------------------------

    def init_transactions(self) -> None:
        """Register this instance: fence older ones and finish the transaction they left open."""
        with self._lock:
            self._states.require_transactional("init_transactions")
            self._states.require_open()
            self._txns.init()

    def begin_transaction(self) -> None:
        with self._lock:
            self._states.require_transactional("begin_transaction")
            self._states.require_open()
            self._txns.begin()
            self._accumulator.clear()

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
            self._states.require_transactional("send_offsets_to_transaction")
            self._states.require_open()
            self._states.require_in_transaction("send_offsets_to_transaction")
            validate_name("group", group_id)
            table = self.ctx.groups.offsets_table(offsets)
            if start_offsets is not None:
                offset_items(start_offsets, what="start_offsets", least=-1)  # -1: no position yet
            self._txns.ensure_registered([paths.group_log_path(group_id)])
            self._sender.write_offsets(OffsetsEntry(group_id, table, offsets, start_offsets))

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
            self._states.require_transactional("append_to_transaction")
            self._states.require_open()
            self._states.require_in_transaction("append_to_transaction")
            self._txns.ensure_registered([path])
            try:
                result = self._sender.append(path, Payload.of(payload), record_count)
                if check is not None:
                    check(self._txns.txn, result)
            except TxnLogError as exc:
                self._txns.abortable(exc)
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
        _check_metadata(metadata)  # before anything moves: a refused commit leaves the transaction as it was
        with self._lock:
            self._states.require_transactional("commit_transaction")
            self._states.require_open()
            flush = functools.partial(self._sender.flush, final=True)
            second_phase = self._txns.commit(flush, metadata, begin_ahead=BEGIN_AHEAD)
            if second_phase is not None:  # the producer is Ready: an interrupt here leaves a decided transaction
                second_phase()

    def abort_transaction(self) -> None:
        """Abort: drop buffered data; if anything reached the coordinator, persist PrepareAbort (markers and
        CompleteAbort follow in the background)."""
        with self._lock:
            self._states.require_transactional("abort_transaction")
            self._states.require_open()
            second_phase = self._txns.abort(self._accumulator.clear, begin_ahead=BEGIN_AHEAD)
            if second_phase is not None:
                second_phase()

    def wait_for_markers(self) -> None:
        """Block until the last decided transaction's markers are in every partition it wrote. Its
        Complete record may still be pending: the producer's next record carries it, or ``close()`` writes it."""
        with self._lock:
            self._completions.wait_markers()

    def wait_for_completion(self) -> None:
        """Block until every decided transaction of this producer has all its markers and its Complete
        record written."""
        with self._lock:
            self._txns.finish_completions()

    # --- sending --------------------------------------------------------------------------------

    def send(self, topic: str, data: object, *, partition: int | None = None, key_column: str | None = None) -> None:
        """Buffer ``data`` for ``topic``; written when a partition's buffer fills or on flush/commit.

        Routing: ``partition`` if given, else a stable hash of ``key_column``, else one partition per call
        in round-robin. Data is checked against the topic schema first (:class:`SchemaMismatchError`).
        """
        with self._lock:
            self._states.require_open()
            self._states.require_in_transaction("send")
            meta = self._accumulator.topic(topic)
            table = conform(data, meta.schema, topic=topic)
            if table.num_rows == 0:
                return
            for path, part in self._accumulator.route(meta, table, partition, key_column).items():
                full = self._accumulator.add(path, part)
                if full is not None:
                    self._sender.write_buffers({path: full})

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
            self._states.require_open()
            self._states.require_in_transaction("send_staged")
            entry: OffsetsEntry | None = None
            if offsets is not None:
                self._states.require_transactional("send_staged(offsets=...)")
                if group_id is None:
                    raise ConfigurationError("send_staged(offsets=...) needs the group_id the offsets belong to")
                validate_name("group", group_id)
                if start_offsets is not None:
                    offset_items(start_offsets, what="start_offsets", least=-1)  # -1: no position yet
                entry = OffsetsEntry(group_id, self.ctx.groups.offsets_table(offsets), offsets, start_offsets)
            return self._sender.send_staged(self._accumulator.staged(refs), entry)

    def flush(self) -> list[RecordMetadata]:
        """Write everything buffered; returns where each entry landed since the last flush."""
        with self._lock:
            self._states.require_open()
            self._sender.flush()
            return self._sender.take_results()

    # --- lifecycle ------------------------------------------------------------------------------

    def close(self, *, flush: bool = True) -> None:
        """Flush (idempotent producer), finish decided transactions and release resources. An open
        transaction is left to its timeout unless aborted first."""
        with self._lock:
            if self._states.state == _S.CLOSED:
                return
            try:
                if flush and self.transactional_id is None and self._states.state != _S.FATAL_ERROR:
                    self._sender.flush()
                if self._states.state != _S.FATAL_ERROR:
                    self._txns.void_ahead()
                    self._txns.finish_completions()
            finally:
                self._completions.shutdown()
                self._sender.shutdown()
                self._states.transition(_S.CLOSED)

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(flush=exc[0] is None)


def _check_metadata(metadata: object) -> None:
    """Refuse commit metadata that cannot be stored as JSON, naming the key that holds the value."""
    if metadata is None:
        return
    if not isinstance(metadata, dict):
        raise ConfigurationError(
            f"commit_transaction(metadata=...) takes a dict of JSON values, got {type(metadata).__name__}"
        )
    for key, value in metadata.items():
        if not isinstance(key, str):
            raise ConfigurationError(f"commit_transaction metadata keys must be strings, got {key!r}")
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(
                f"commit_transaction metadata {key!r} cannot be stored as JSON ({exc}): pass plain values "
                "(str, int, float, bool, None, lists and dicts of them), e.g. a datetime as its isoformat()"
            ) from None
