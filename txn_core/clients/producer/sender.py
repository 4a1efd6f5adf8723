"""Writing a producer's entries to partition logs (Kafka's Sender): buffered data, staged references and
group offsets (PROTOCOL.md "Idempotence", "Transactions", "Staged data", "Offsets fence").

:class:`Sender` turns the :class:`~txn_core.clients.producer.accumulator.RecordAccumulator`'s buffers into
entries and appends them, one partition log per pool thread, each entry carrying the producer id, epoch and
base sequence (:class:`~txn_core.clients.producer.sequences.ProducerSequences`) and the current transaction
(:class:`~txn_core.clients.producer.transactions.TransactionManager`); before a transaction's first write to
a log, it has the manager register that log. It appends one ``DATA_REF`` entry per staged reference, and
a group's offsets entry together with the claim of its offsets fence.

Invariants:

* an append whose outcome is unknown stays in flight with its writer id and payload, and is retried before
  anything else of its partition log (:meth:`Sender._write_one`); an idempotent producer's ``send_staged``
  append that failed marks its log unsure (:attr:`Sender._unsure`) until an append there succeeds;
* the sequences of one epoch end at :data:`SEQUENCE_LIMIT` in every partition log: an idempotent producer
  about to pass it writes its appends in flight, then moves to the next epoch; a transaction fails with
  :class:`TransactionTooLargeError` before writing past it (:meth:`Sender.make_sequence_room`);
* no entry is visible before its participant is registered: on a store that stages creates, the first
  entries of a transaction are written behind a gate that opens only once the begin is durable under the
  transaction id they carry (:meth:`Sender._write_with_begin`).

Crash windows: dying mid-append leaves the entry or nothing, and the retry of the append in flight resolves
it (PROTOCOL.md "Recovery"); dying while entries wait behind an overlapped begin leaves unlinked files
nobody lists; dying between an offsets entry and its fence claim leaves an ``Ongoing`` transaction, aborted
as any (PROTOCOL.md "Offsets fence", "Crash windows").

Locking: no lock of its own. Its methods run on the thread holding the producer's lock (``Producer._lock``),
which, while it waits in :meth:`Sender.run_all`, lends the work to the pool: one partition log per thread,
so each buffer and each log's sequence is touched by one thread at a time. The overlapped begin runs on a
pool thread too, and a fence claim on the storage's parallel pool, both while the holder waits for them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import pyarrow as pa

from txn_core.clients.producer.accumulator import MAX_ENTRY_BYTES, PartitionBuffer, RecordAccumulator
from txn_core.clients.producer.sequences import SEQUENCE_LIMIT, ProducerSequences
from txn_core.clients.producer.transactions import TransactionManager
from txn_core.errors import InvalidTxnStateError, StorageError, TransactionTooLargeError, TxnLogError
from txn_core.format import paths
from txn_core.format.entry import CarriedMarker, EntryKind, Payload
from txn_core.format.ids import TopicPartition, TxnId
from txn_core.logs import get_logger
from txn_core.partition.partition import AppendResult
from txn_core.partition.staging import StagedRef, reference_payload
from txn_core.storage.base import GateClosedError
from txn_core.storage.parallel import submit

if TYPE_CHECKING:
    from txn_core.clients.producer.carried import MarkerOffers, Offer
    from txn_core.partition.partition import PartitionLog

logger = get_logger("txnlog.producer")

#: Partition logs written at once: on a store whose requests are round trips, enough for a transaction over
#: 64 partitions to write its data in one round; on local disk, where a write is the writing thread's own
#: work, a few (more threads there only contend for the interpreter).
WRITERS_REMOTE = 64
WRITERS_LOCAL = 8

Offsets = dict[tuple[str, int] | TopicPartition, int]


@dataclass(frozen=True, slots=True)
class RecordMetadata:
    """Where an entry landed."""

    topic: str
    partition: int
    base_offset: int
    record_count: int
    timestamp_ms: int


@dataclass(frozen=True, slots=True)
class OffsetsEntry:
    """A group's offsets to write in the current transaction, and where its input started, to claim
    (``start_offsets``: PROTOCOL.md "Offsets fence"; None: unfenced)."""

    group_id: str
    table: pa.Table
    offsets: Offsets
    start_offsets: Offsets | None


class FenceClaim(Protocol):
    """Claims a group's start position for a transaction (:func:`txn_core.clients.offsets_fence.claim`)."""

    def __call__(
        self, group: str, start: Offsets, end: Offsets, *, tid: str, producer_id: int, epoch: int, txn: TxnId
    ) -> int: ...


class Sender:
    """Writes a producer's entries to partition logs; see module doc."""

    def __init__(
        self,
        txns: TransactionManager,
        ids: ProducerSequences,
        accumulator: RecordAccumulator,
        *,
        partition_log: Callable[[str], PartitionLog],
        claim_fence: FenceClaim,
        stages_creates: bool,
        remote: bool = True,
        offers: MarkerOffers | None = None,
    ) -> None:
        self._txns = txns
        self._ids = ids
        self._accumulator = accumulator
        self._partition_log = partition_log
        self._claim_fence = claim_fence
        #: whether the store stages creates (local disk): a begin may then overlap the first entries
        self._stages_creates = stages_creates
        #: partition logs where a send_staged append of this idempotent producer failed, not retried since
        self._unsure: set[str] = set()
        #: where each entry written since the last :meth:`take_results` landed
        self._results: list[RecordMetadata] = []
        self._pool: ThreadPoolExecutor | None = None
        #: partition logs written at once (:data:`WRITERS_REMOTE`, :data:`WRITERS_LOCAL`)
        self._writers = WRITERS_REMOTE if remote else WRITERS_LOCAL
        #: decided transactions' markers this producer's next entries may carry (PROTOCOL.md "Carried markers")
        self._offers = offers

    def take_results(self) -> list[RecordMetadata]:
        """Where each entry landed since the last call."""
        results, self._results = self._results, []
        return results

    def flush(self, *, final: bool = False) -> None:
        """Write everything buffered, and every append in flight. ``final`` (a commit's flush): also write
        alone, at the same time, the offered markers no entry of this flush will carry, so that the decision
        that follows never waits for their linger."""
        todo = self._accumulator.pending()
        offers = self._offers
        lone: Callable[[], list[Offer]] | None = None
        if final and offers is not None:
            carrying = {path for path, b in todo.items() if b.tables}  # new entries: they take their offers
            lone = functools.partial(offers.take_all, exclude=carrying)
        if todo:
            self.write_buffers(todo, lone)
        elif lone is not None:
            self._run_with_lone([], lone)

    def write_buffers(self, todo: dict[str, PartitionBuffer], lone: Callable[[], list[Offer]] | None = None) -> None:
        """Write ``todo``'s buffers, registering their logs first (or overlapping the begin that does), and
        the markers ``lone()`` takes alone beside them. They are taken only once the logs are registered: a
        record's claim may write every marker of an earlier transaction alone, and must not find some held
        by this thread for later."""
        txns = self._txns
        txns.adopt_ahead()  # its epoch, and so the sequences, apply from here
        self.make_sequence_room({path: b.rows + (b.inflight.rows if b.inflight else 0) for path, b in todo.items()})
        predicted = txns.overlapped_begin() if self._stages_creates else None
        if predicted is not None:
            self._write_with_begin(todo, predicted, lone)
            return
        txns.ensure_registered(list(todo))
        self._run_with_lone([functools.partial(self._write_one, path, buffer) for path, buffer in todo.items()], lone)

    def _run_with_lone(
        self, work: list[Callable[[], list[RecordMetadata]]], lone: Callable[[], list[Offer]] | None
    ) -> list[list[RecordMetadata]]:
        """:meth:`run_all` of ``work`` and, beside it, a lone write of each marker ``lone()`` takes."""
        taken = lone() if lone is not None else []
        try:
            return self.run_all(work + [functools.partial(_write_alone, o) for o in taken])
        finally:
            for offer in taken:
                offer.release_alone()  # those written are landed already; the rest are free again

    def make_sequence_room(self, rows: dict[str, int]) -> None:
        """Make sure ``rows`` more records per partition log fit in the current epoch's sequences (PROTOCOL.md
        "Idempotence"). An idempotent producer that would pass :data:`SEQUENCE_LIMIT` in a partition first
        writes every append in flight (their outcome unknown: they are resolved at the epoch they were written
        with; sent again at a new epoch, one that had landed would be accepted twice), then moves to the next
        epoch, where every partition's sequence restarts at 0. It refuses while a ``send_staged`` append has an
        unknown outcome (:attr:`_unsure`): only its retry, at this epoch, resolves it. A transaction runs at one
        epoch: it is refused. Nothing is written when it refuses."""
        ids = self._ids
        over = ids.over(rows)
        if not over:
            return
        if self._txns.transactional_id is not None:
            raise self._too_large(f"this write would take {over[0]}", "nothing of it was written")
        if self._unsure:
            raise InvalidTxnStateError(
                f"producer id {ids.producer_id}: {over[0]} has no sequence numbers left in epoch {ids.epoch}, "
                f"and an earlier send_staged to {sorted(self._unsure)[0]} failed with an unknown outcome; retry "
                "that send_staged (the same references) first, so that it resolves at the epoch it was sent in. "
                "Nothing of this write was written"
            )
        inflight = self._accumulator.inflight()
        self.run_all([functools.partial(self._write_one, path, b, only_inflight=True) for path, b in inflight.items()])
        logger.info("producer %d: epoch %d has no sequences left in %s", ids.producer_id, ids.epoch, over[0])
        ids.bump_epoch()

    def _too_large(self, what: str, written: str) -> TransactionTooLargeError:
        return TransactionTooLargeError(
            f"transactional id {self._txns.transactional_id!r}: {what} past {SEQUENCE_LIMIT:,} records in one "
            f"transaction (the sequence numbers of one epoch); {written}. Abort the transaction and commit in "
            "smaller ones"
        )

    def _write_with_begin(
        self,
        todo: dict[str, PartitionBuffer],
        predicted: TxnId,
        lone: Callable[[], list[Offer]] | None = None,
    ) -> None:
        """The transaction's first writes overlap its ``begin`` record, on a store that stages creates
        (local disk): each entry is written and fsynced under the transaction id the begin is expected to
        get, and linked only once the begin is durable with that id (the gate). The rule "a participant is
        registered before any of its data is visible" holds as without the overlap; if the begin landed
        at another slot, the staged entries are dropped unseen and written again under the real id."""
        txns = self._txns
        self._ids.take_next_epoch()  # the begin's epoch: the entries carry it, sequences restart
        begun = self._executor().submit(functools.partial(txns.ensure_registered, list(todo), overlapped=True))

        def gate() -> bool:
            begun.result()
            return txns.txn == predicted

        try:
            # The begin is created on another thread meanwhile; its claim never writes the markers of the
            # newest decided transaction (TransactionManager.overlapped_begin: at most one is pending).
            self._run_with_lone(
                [functools.partial(self._write_one, path, buffer, predicted, gate) for path, buffer in todo.items()],
                lone,
            )
        except GateClosedError:
            logger.debug("producer %s: begin landed at %s, not %s", txns.transactional_id, txns.txn, predicted)
            self.run_all([functools.partial(self._write_one, path, buffer) for path, buffer in todo.items()])
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
        entries (the first one behind ``gate``, under ``txn`` instead of the current transaction id when given).
        A new entry carries the oldest marker offered for ``path``, if any."""
        ids = self._ids
        while True:
            if buffer.inflight is None:
                if only_inflight or not buffer.tables:
                    return []
                buffer.next_entry(MAX_ENTRY_BYTES, ids.next(path), functools.partial(self._take_offer, path))
            inflight = buffer.inflight
            if inflight is None:  # pragma: no cover
                return []
            result = self._append_carrying(
                inflight.carried,
                path,
                inflight.payload,
                inflight.rows,
                EntryKind.DATA,
                inflight.sequence,
                inflight.writer_id,
                txn,
                gate,
            )
            gate = None  # open: later entries follow it
            buffer.inflight = None
            ids.advance(path, inflight.sequence + inflight.rows)
            topic, partition = _split_path(path)
            self._results.append(
                RecordMetadata(topic, partition, result.base_offset, inflight.rows, result.timestamp_ms)
            )

    def _take_offer(self, path: str) -> Offer | None:
        """The oldest marker offered for ``path`` that this producer's next entry there may carry."""
        if self._offers is None or self._txns.transactional_id is None:
            return None
        return self._offers.take(path, self._ids.producer_id)

    def _append_carrying(
        self,
        offer: Offer | None,
        path: str,
        payload: Payload,
        record_count: int,
        kind: EntryKind,
        sequence: int,
        writer_id: bytes | None = None,
        txn: TxnId | None = None,
        gate: Callable[[], bool] | None = None,
    ) -> AppendResult:
        """:meth:`append` of an entry carrying ``offer``'s marker (if any): landed when the entry is, freed for
        a lone write when the append fails."""
        carried = offer.marker if offer is not None else None
        try:
            result = self.append(path, payload, record_count, kind, sequence, writer_id, txn, gate, carried)
        except BaseException:
            if offer is not None:
                offer.release()
            raise
        if offer is not None:
            offer.landed()
        return result

    def append(
        self,
        path: str,
        payload: Payload,
        record_count: int,
        kind: EntryKind = EntryKind.DATA,
        sequence: int = -1,
        writer_id: bytes | None = None,
        txn: TxnId | None = None,
        gate: Callable[[], bool] | None = None,
        carried: CarriedMarker | None = None,
    ) -> AppendResult:
        """One entry of this producer (its id, epoch and current transaction, or ``txn``) into ``path``."""
        if sequence + record_count > SEQUENCE_LIMIT:  # make_sequence_room is asked first where it can help
            raise self._too_large(
                f"an entry of {record_count:,} records would take {path}", "this entry was not written"
            )
        self._txns.note_write(path)  # before the attempt: one whose outcome is unknown may have landed
        return self._partition_log(path).append_payload(
            kind,
            payload,
            record_count,
            producer_id=self._ids.producer_id,
            producer_epoch=self._ids.epoch,
            base_sequence=sequence,
            txn=txn or self._txns.txn,
            writer_id=writer_id,
            gate=gate,
            carried=carried,
        )

    def write_offsets(self, entry: OffsetsEntry) -> None:
        """Append the group's offsets entry (its log registered already) and, with ``start_offsets``, claim
        the start in parallel (PROTOCOL.md "Offsets fence"). May run on a pool thread."""
        path = paths.group_log_path(entry.group_id)
        table, start_offsets = entry.table, entry.start_offsets
        payload = Payload.of_arrow(table.to_batches(), table.schema)
        if start_offsets is None:
            self.append(path, payload, table.num_rows)
            return
        txns = self._txns
        txn = txns.txn
        if txn is None:  # pragma: no cover - registration always yields a transaction id
            raise InvalidTxnStateError(f"transactional id {txns.transactional_id!r}: no transaction id")
        tid, pid, epoch = txns.transactional_id or "", self._ids.producer_id, self._ids.epoch
        fence = submit(
            lambda: self._claim_fence(
                entry.group_id, start_offsets, entry.offsets, tid=tid, producer_id=pid, epoch=epoch, txn=txn
            )
        )
        try:
            self.append(path, payload, table.num_rows)
        finally:
            try:
                fence.result()
            except TxnLogError as exc:
                txns.abortable(exc)
                raise

    def send_staged(self, by_path: dict[str, list[StagedRef]], offsets: OffsetsEntry | None) -> list[RecordMetadata]:
        """Append one DATA_REF entry per staged reference (by partition log, in list order) and ``offsets``,
        all at once, after one coordinator record registers every log they go to."""
        group_path = paths.group_log_path(offsets.group_id) if offsets is not None else None
        if not by_path and group_path is None:
            return []
        self._txns.adopt_ahead()  # its epoch, and so the sequences, apply from here
        self.make_sequence_room({path: sum(ref.rows for ref in items) for path, items in by_path.items()})
        self._txns.ensure_registered(list(by_path) + ([group_path] if group_path else []))
        work: list[Callable[[], list[RecordMetadata]]] = [
            functools.partial(self._write_staged, path, items) for path, items in by_path.items()
        ]
        if offsets is not None:

            def write_offsets() -> list[RecordMetadata]:
                self.write_offsets(offsets)
                return []

            work.append(write_offsets)
        return [r for rs in self.run_all(work) for r in rs]

    def _write_staged(self, path: str, items: list[StagedRef]) -> list[RecordMetadata]:
        """One DATA_REF entry per reference into ``path``, in order."""
        out = []
        for n, ref in enumerate(items):
            seq = self._ids.next(path)
            payload = Payload.of(reference_payload(ref))
            offer = self._take_offer(path) if n == 0 else None
            try:
                r = self._append_carrying(offer, path, payload, ref.rows, EntryKind.DATA_REF, seq)
            except BaseException:
                if self._txns.transactional_id is None:
                    self._unsure.add(path)  # it may have landed with ``seq``; see make_sequence_room
                raise
            self._unsure.discard(path)  # an append at ``seq`` is in the log now: the failed one's retry
            self._ids.advance(path, seq + ref.rows)
            out.append(RecordMetadata(ref.topic, ref.partition, r.base_offset, ref.rows, r.timestamp_ms))
        return out

    def run_all(self, work: list[Callable[[], list[RecordMetadata]]]) -> list[list[RecordMetadata]]:
        """Run independent writes at once (one partition log each); every one finishes before this returns
        or raises (the first error)."""
        if len(work) == 1:
            return [work[0]()]
        futures = [self._executor().submit(w) for w in work]
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

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self._writers, thread_name_prefix="txnlog-producer")
        return self._pool

    def shutdown(self) -> None:
        """Stop the pool (waiting for its threads)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


def _write_alone(offer: Offer) -> list[RecordMetadata]:
    """Write ``offer``'s marker as an entry of its own (a pool task of :meth:`Sender.run_all`). A failure is
    not this flush's: the marker stays free, and the decision that follows writes it or fails naming the
    earlier transaction (:class:`~txn_core.errors.CompletionFailedError`)."""
    try:
        offer.write_alone()
    except StorageError as exc:
        logger.debug("marker of %s in %s not written alone: %s", offer.marker.txn, offer.path, exc)
    return []


def _split_path(path: str) -> tuple[str, int]:
    """(topic, partition) of a partition log path; groups map to ('__group:<id>', 0)."""
    parts = path.split("/")
    if parts[0] == "topics" and len(parts) == 3:
        return parts[1], int(parts[2])
    return f"__{parts[0]}:{parts[1]}", 0
