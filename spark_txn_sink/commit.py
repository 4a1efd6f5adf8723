"""The commit side, run by Spark on the driver: one txnlog transaction per micro-batch (PROTOCOL.md here).

``commit_batch`` for batch ``N`` of query ``Q`` with transactional id ``T`` (all steps idempotent or
guarded, every crash window listed in PROTOCOL.md "Crash windows"):

1. With ``consumerGroup``: read ``<checkpoint>/offsets/N`` and compute the group offsets (fails, with
   nothing written, if they cannot be paired: :mod:`spark_txn_sink.pairing`).
2. ``init_transactions(T)``: fences every older instance (a zombie driver of an earlier run, an earlier
   commit attempt) and finishes what it left: a prepared transaction is rolled forward, an ongoing one
   aborted. From here on no other process can commit for ``T`` without fencing this one first.
3. Read ``T``'s progress, stored with its last committed transaction (``transaction_metadata``). If it
   says ``Q`` committed batch ``N`` or later, this is a replay: commit nothing, delete only this run's
   staged objects (and finish an interrupted cleanup from the batch's manifest), return.
4. Write the batch's manifest (the keys about to be committed) under the batch's staging prefix.
5. ``begin``; ``send_staged(refs)`` (one small reference entry per staged object); with a group,
   ``send_offsets_to_transaction``; ``commit_transaction(metadata=progress)``: PrepareCommit carries the
   progress ``{query_id: Q, batch_id: N, manifest: ...}``, so output, offsets and progress are one
   atomic decision; then wait until every participant has its marker (``wait_for_completion``).
6. Delete the batch's other staged objects (failed and duplicate attempts, earlier crashed runs), then
   the manifest. Failures here are only logged: the batch is committed.

``abort_batch``: ``init_transactions`` (which settles any transaction the failed commit left), then, only
if the batch is not committed, delete this run's staged objects. A committed batch is left alone: its
objects are data.

Steady state: the producer of this process's last committed batch is kept with its progress, so the next
commit skips steps 2-3 (PROTOCOL.md here, "State in memory is only a cache"); a kept producer that another
committer fenced fails at its begin, before anything is decided, and the commit starts over at step 2.

Batch writes (``df.write``) use the same steps with a unique write id in place of ``(Q, N)`` and no
manifest (a batch write is never replayed).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from spark_txn_sink.faults import CountingStorage, Faults
from spark_txn_sink.options import SinkOptions
from txn_core import (
    GroupFencedError,
    ObjectNotFoundError,
    Producer,
    ProducerFencedError,
    StorageError,
    TopicPartition,
    TxnLogError,
    open_log,
)
from txn_core.log import Log
from txn_core.logs import get_logger
from txn_core.parallel import parallel_map, submit
from txn_core.staging import StagedRef, delete_keys, delete_unreferenced, staging_prefix
from txn_core.storage import open_storage
from txn_core.storage.base import Storage, create_resolving

logger = get_logger(__name__)

SINK_MARK = "txnlog-spark-sink"
PROGRESS_VERSION = 1
MANIFEST_PREFIX = "_manifest-"


@dataclass(frozen=True, slots=True)
class BatchIdentity:
    """Who commits what: a transactional id and either a streaming (query id, batch id) or a write id."""

    transactional_id: str
    query_id: str | None = None
    batch_id: int | None = None
    write_id: str | None = None

    @property
    def staging_batch(self) -> str:
        """The staging batch name: unique per (query, batch) or per batch write."""
        if self.write_id is not None:
            return self.write_id
        return f"{self.query_id}.{self.batch_id}"

    @property
    def prefix(self) -> str:
        return staging_prefix(self.transactional_id, self.staging_batch)

    def committed_by(self, progress: dict[str, Any] | None) -> bool:
        """Whether ``progress`` (``T``'s last committed metadata) shows this batch committed."""
        if not progress or progress.get("sink") != SINK_MARK:
            return False
        if self.write_id is not None:
            return progress.get("write_id") == self.write_id
        if progress.get("query_id") != self.query_id:
            return False  # another query used this transactional id last: its batch ids are not ours
        return int(progress.get("batch_id", -1)) >= int(self.batch_id or 0)

    def progress(self, topic: str, refs: list[StagedRef], manifest: str | None) -> dict[str, Any]:
        value: dict[str, Any] = {
            "sink": SINK_MARK,
            "version": PROGRESS_VERSION,
            "topic": topic,
            "rows": sum(r.rows for r in refs),
            "objects": len(refs),
        }
        if self.write_id is not None:
            value["write_id"] = self.write_id
            value["ephemeral"] = True  # a batch write is never replayed: its id may expire (PROTOCOL.md)
        else:
            value.update(query_id=self.query_id, batch_id=self.batch_id, manifest=manifest)
        return value


@dataclass(frozen=True, slots=True)
class GroupPosition:
    """A batch's input for its consumer group: ``end`` offsets to commit, and the ``start`` the input began
    at (the offsets fence claims it; None: the query's first batch did not start from the group)."""

    end: dict[tuple[str, int], int]
    start: dict[tuple[str, int], int] | None


@dataclass(frozen=True, slots=True)
class CommitResult:
    """What a commit did: ``committed`` (a new transaction) or ``replayed`` (already committed: no-op)."""

    outcome: str
    rows: int
    objects: int
    deleted: int


#: Logs of this process, reused by later commits: Spark runs every commit of a query run in one long-lived
#: Python worker, and a reused log skips replaying the transaction log from its snapshot and re-discovering
#: partition tails (hundreds of GETs per commit on a busy log). Only a cost: a fresh log is as correct.
_LOGS: dict[tuple[str, str, bool], tuple[Log, Storage, CountingStorage | None]] = {}
_LOGS_LOCK = threading.Lock()


def _open(opts: SinkOptions) -> tuple[Log, Storage, CountingStorage | None]:
    """The log, the storage every step uses (counting requests with ``testing.stats``), the counter.

    Reused across the commits of this process (see :data:`_LOGS`); a commit that fails calls :func:`_forget`
    so that the next one starts from storage alone.
    """
    key = _log_key(opts)
    with _LOGS_LOCK:
        cached = _LOGS.get(key)
        if cached is None:
            storage: Storage = open_storage(opts.url, opts.storage_options)
            counting = CountingStorage(storage) if opts.stats_dir else None
            if counting is not None:
                storage = counting
            cached = _LOGS[key] = (Log(storage), storage, counting)
    if cached[2] is not None:
        cached[2].counts.clear()  # counts are per commit
    return cached


def _log_key(opts: SinkOptions) -> tuple[str, str, bool]:
    return opts.url, json.dumps(opts.storage_options, sort_keys=True, default=str), bool(opts.stats_dir)


#: Producers of this process's last committed batch per (log, transactional id), with the progress that
#: batch committed. A kept producer skips ``init_transactions`` and the progress read: as long as no other
#: committer initialised the id, nothing else was committed for it, so its progress is the one kept; if
#: one did, the kept producer is fenced, its first coordinator request (the begin) fails before anything
#: of the batch is decided, and the commit starts again from storage alone.
_PRODUCERS: dict[tuple[tuple[str, str, bool], str], tuple[Producer, dict[str, Any]]] = {}


def _take_producer(opts: SinkOptions, tid: str) -> tuple[Producer, dict[str, Any]] | None:
    with _LOGS_LOCK:
        return _PRODUCERS.pop((_log_key(opts), tid), None)


def _keep_producer(opts: SinkOptions, tid: str, producer: Producer, progress: dict[str, Any]) -> None:
    with _LOGS_LOCK:
        old = _PRODUCERS.pop((_log_key(opts), tid), None)
        _PRODUCERS[(_log_key(opts), tid)] = (producer, progress)
    if old is not None:
        old[0].close()


def _forget(opts: SinkOptions) -> None:
    key = _log_key(opts)
    with _LOGS_LOCK:
        _LOGS.pop(key, None)
        dropped = [k for k in _PRODUCERS if k[0] == key]
        producers = [_PRODUCERS.pop(k)[0] for k in dropped]
    for producer in producers:
        with contextlib.suppress(TxnLogError):
            producer.close()


def commit_batch(
    opts: SinkOptions,
    ident: BatchIdentity,
    refs: list[StagedRef],
    group_offsets: Callable[[str], GroupPosition | dict[tuple[str, int], int]] | None = None,
    *,
    before_begin: Callable[[Log], None] | None = None,
) -> CommitResult:
    """Commit one batch exactly once (module doc, steps 1-6). ``group_offsets(log_url)`` gives step 1: a
    :class:`GroupPosition` (fenced), or bare end offsets (committed unfenced, for callers that own the
    group alone); ``before_begin(log)`` runs right before a new transaction begins (the sink creates a
    planned topic)."""
    faults = Faults(opts.fault, ident.batch_id)
    started = time.perf_counter()
    log, storage, counting = _open(opts)
    try:
        offsets = group_offsets(log.url) if group_offsets is not None and opts.consumer_group else None
        faults.hit("before_init")
        kept = _take_producer(opts, ident.transactional_id)
        result: CommitResult | None = None
        if kept is not None:
            try:
                result = _commit(opts, ident, refs, offsets, before_begin, log, storage, faults, *kept)
            except ProducerFencedError:  # another committer of the id ran since: start from storage alone
                result = None
        if result is None:
            producer = log.producer(ident.transactional_id, transaction_timeout_ms=opts.transaction_timeout_ms)
            try:
                producer.init_transactions()
                previous = log.transaction_metadata(ident.transactional_id)
            except BaseException:
                producer.close()
                raise
            result = _commit(opts, ident, refs, offsets, before_begin, log, storage, faults, producer, previous)
        logger.info(
            "batch %s of %s %s: %d rows in %d objects to %s (%.0f ms)",
            ident.staging_batch,
            ident.transactional_id,
            result.outcome,
            result.rows,
            result.objects,
            opts.topic,
            (time.perf_counter() - started) * 1000,
        )
        if counting is not None and opts.stats_dir:
            counting.write_stats(
                opts.stats_dir,
                ident.staging_batch,
                {
                    "outcome": result.outcome,
                    "objects": result.objects,
                    "rows": result.rows,
                    "seconds": round(time.perf_counter() - started, 4),
                },
            )
        return result
    except ProducerFencedError as exc:
        _forget(opts)
        if opts.consumer_group is None:
            raise
        raise ProducerFencedError(
            f"consumer group {opts.consumer_group!r}: batch {ident.batch_id} was not committed: {exc}. Its "
            f"transactional id {ident.transactional_id!r} was taken over by another committer (a second "
            "query on this group, or a newer run of this one); one query may commit to a group at a time. "
            "Stop the other query, or give each query its own consumerGroup."
        ) from exc
    except BaseException:
        _forget(opts)
        raise


def _commit(
    opts: SinkOptions,
    ident: BatchIdentity,
    refs: list[StagedRef],
    offsets: GroupPosition | dict[tuple[str, int], int] | None,
    before_begin: Callable[[Log], None] | None,
    log: Log,
    storage: Storage,
    faults: Faults,
    producer: Producer,
    previous: dict[str, Any] | None,
) -> CommitResult:
    """Steps 3-6 with ``producer`` (initialised for ``T``, or kept from this process's last commit of ``T``,
    see :data:`_PRODUCERS`) and ``previous``, ``T``'s progress. Keeps the producer when the batch commits;
    closes it otherwise. Raises :class:`ProducerFencedError` before anything of the batch is durable but
    its manifest when a kept producer was fenced meanwhile."""
    keep = False
    try:
        if ident.committed_by(previous):
            deleted = _cleanup_replay(storage, ident, previous, refs)
            return CommitResult("replayed", 0, 0, deleted)
        if before_begin is not None:
            before_begin(log)
        manifest_key = _manifest_key(ident) if ident.write_id is None else None
        # the manifest's create overlaps the transaction's first requests; it is durable before the commit point
        written = submit(_write_manifest, storage, ident, refs, manifest_key) if manifest_key else None
        try:
            if refs and max(r.partition for r in refs) >= log.topics.get(opts.topic, refresh=False).partitions:
                log.topics.get(opts.topic)  # the tasks saw partitions added since this process last looked
            producer.begin_transaction()
            if offsets is not None and opts.consumer_group is not None:
                # One begin record registers every partition and the group's log; the references, the
                # offsets and the offsets fence's claim are then written at once.
                end, start = _offsets_to_send(log, opts.consumer_group, offsets)
                producer.send_staged(refs, offsets=end, group_id=opts.consumer_group, start_offsets=start)
            else:
                producer.send_staged(refs)
        finally:
            if written is not None:
                written.result()
        faults.hit("before_commit")
        progress = ident.progress(opts.topic, refs, manifest_key)
        producer.commit_transaction(metadata=progress)
        faults.hit("after_prepare")
        listing = submit(storage.list, ident.prefix)  # for the cleanup, overlapping the markers
        # Markers in every partition before the batch returns (readers need not ask the transaction log);
        # the Complete record rides on the next batch's begin record (or close() writes it).
        producer.wait_for_markers()
        faults.hit("after_commit")
        deleted = _cleanup_committed(storage, ident, refs, manifest_key, listing)
        keep = ident.write_id is None
        if keep:
            _keep_producer(opts, ident.transactional_id, producer, progress)
        return CommitResult("committed", sum(r.rows for r in refs), len(refs), deleted)
    finally:
        if not keep:
            producer.close()


def _offsets_to_send(
    log: Log, group: str, position: GroupPosition | dict[tuple[str, int], int]
) -> tuple[dict[tuple[str, int] | TopicPartition, int], dict[tuple[str, int] | TopicPartition, int] | None]:
    """The batch's group offsets and the start that fences them (PROTOCOL.md "Offsets fence"), or no start
    for plain offsets. A first batch that did not start from the group may commit only to a group that
    has no offsets for its partitions yet (its start is then the group's origin, -1)."""
    if not isinstance(position, GroupPosition):
        return _as_offsets(position), None
    start = position.start
    if start is None:
        committed = log.groups.committed(group, require_stable=True)
        held = sorted(str(tp) for tp in committed if (tp.topic, tp.partition) in position.end)
        if held:
            raise GroupFencedError(
                f"consumer group {group!r} already has committed offsets for {', '.join(held[:4])}"
                f"{' ...' if len(held) > 4 else ''}, but this query's first batch did not start from them "
                "(startingOffsets is not 'group'), so committing its offsets could commit input twice. Start "
                "the query with startingOffsets=group (and consumerGroup on the reader), or use a new "
                "consumerGroup.",
                group,
            )
        start = {tp: -1 for tp in position.end}
    return _as_offsets(position.end), _as_offsets(start)


def _as_offsets(offsets: dict[tuple[str, int], int]) -> dict[tuple[str, int] | TopicPartition, int]:
    out: dict[tuple[str, int] | TopicPartition, int] = {}
    for tp, offset in offsets.items():
        out[tp] = offset
    return out


def abort_batch(opts: SinkOptions, ident: BatchIdentity, refs: list[StagedRef]) -> int:
    """Spark aborted the batch: settle the transaction state, then delete this run's staged objects unless
    the batch turned out committed (a commit that raised after its commit point). Returns objects deleted."""
    Faults(opts.fault, ident.batch_id).hit("abort")
    log, storage, _ = _open(opts)
    try:
        kept = _take_producer(opts, ident.transactional_id)
        if kept is not None:
            kept[0].close()
        producer = log.producer(ident.transactional_id, transaction_timeout_ms=opts.transaction_timeout_ms)
        try:
            producer.init_transactions()
            if ident.committed_by(log.transaction_metadata(ident.transactional_id)):
                return 0
        finally:
            producer.close()
        return _quiet_delete(storage, [r.key for r in refs] + _manifests(storage, ident))
    except BaseException:
        _forget(opts)
        raise


# --- staged object cleanup ---------------------------------------------------------------------


def _manifest_key(ident: BatchIdentity) -> str:
    return f"{ident.prefix}{MANIFEST_PREFIX}{uuid.uuid4().hex}.json"


def _write_manifest(storage: Storage, ident: BatchIdentity, refs: list[StagedRef], key: str) -> str:
    """Record the keys this batch is about to commit, so that a replay can finish an interrupted cleanup.

    Written before the commit point; its key is part of the committed progress, so a manifest named by
    committed progress lists exactly the committed keys of that batch.
    """
    body = json.dumps(
        {
            "transactional_id": ident.transactional_id,
            "query_id": ident.query_id,
            "batch_id": ident.batch_id,
            "keys": [r.key for r in refs],
        }
    ).encode()
    create_resolving(storage, key, [body], body)
    return key


def _manifests(storage: Storage, ident: BatchIdentity) -> list[str]:
    """Manifests under the batch's prefix. Called only once the batch is known uncommitted (after fencing):
    such a manifest names nothing committed; deleting one at worst leaves garbage for a later cleanup."""
    try:
        return [ident.prefix + n for n in storage.list(ident.prefix) if n.startswith(MANIFEST_PREFIX)]
    except StorageError:
        return []


def _read_manifest(storage: Storage, key: str) -> list[str] | None:
    try:
        value = json.loads(storage.read(key))
    except ObjectNotFoundError:
        return None
    return [str(k) for k in value["keys"]]


def _cleanup_committed(
    storage: Storage,
    ident: BatchIdentity,
    refs: list[StagedRef],
    manifest: str | None,
    listing: Future[list[str]] | None = None,
) -> int:
    """After this process's commit of the batch: delete every unreferenced object of its prefix.

    ``listing`` is the prefix's listing taken after the commit point (overlapping the markers); the
    objects it shows that the batch did not commit are failed or duplicate attempts, deleted in parallel,
    then the manifest. Without it the prefix is listed here.
    """
    keep = {r.key for r in refs}
    if manifest is not None:
        keep.add(manifest)
    try:
        if listing is None:
            n = delete_unreferenced(storage, ident.prefix, keep)
        else:
            names = [ident.prefix + name for name in listing.result() if not name.endswith("/")]
            n = len(parallel_map(storage.delete, [k for k in names if k not in keep]))
        if manifest is not None:
            storage.delete(manifest)
        return n
    except StorageError as exc:  # the batch is committed; leftovers are garbage a replay or sweep removes
        logger.warning("txnlog sink: cleanup of %s failed after commit: %s", ident.prefix, exc)
        return 0


def _cleanup_replay(
    storage: Storage, ident: BatchIdentity, progress: dict[str, Any] | None, refs: list[StagedRef]
) -> int:
    """A replayed batch that is already committed: delete this run's objects (never committed); if the
    committed run's cleanup was interrupted (its manifest still exists), finish it from the manifest."""
    own = [r.key for r in refs]
    manifest = progress.get("manifest") if progress and progress.get("batch_id") == ident.batch_id else None
    if isinstance(manifest, str) and manifest.startswith(ident.prefix):
        try:
            committed = _read_manifest(storage, manifest)
            if committed is not None:
                n = delete_unreferenced(storage, ident.prefix, {*committed, manifest})
                storage.delete(manifest)
                return n
        except StorageError as exc:
            logger.warning("txnlog sink: cleanup of replayed batch %s failed: %s", ident.prefix, exc)
            return 0
    return _quiet_delete(storage, own)


def _quiet_delete(storage: Storage, keys: list[str]) -> int:
    try:
        return delete_keys(storage, keys)
    except StorageError as exc:
        logger.warning("txnlog sink: could not delete %d uncommitted staged objects: %s", len(keys), exc)
        return 0


def open_sink_log(opts: SinkOptions) -> Log:
    """A :class:`Log` for the sink's URL (used on the driver for topic checks)."""
    return open_log(opts.url, opts.storage_options)
