"""The commit side, run by Spark on the driver: one txnlog transaction per micro-batch (PROTOCOL.md here).

A thin translation onto the core's application transactions (``txn_core.clients.apptxn``, txn_core/PROTOCOL.md
"Application transactions"): a streaming query's batch ``N`` is unit ``(query id, N)`` of the sink's
transactional id ``T``; a batch write (``df.write``) is a one-shot unit with a unique write id; the
progress carries the sink's mark (:data:`SINK_MARK`). What is Spark's own:

* step 0, with ``consumerGroup``: read ``<checkpoint>/offsets/N`` and compute the group offsets (fails,
  with nothing written, if they cannot be paired: :mod:`spark_txn_sink.pairing`);
* the process-wide cache: Spark runs every commit of a query run in one long-lived Python worker, so the
  sink keeps each log with its :class:`~txn_core.clients.apptxn.AppCommitter` (:data:`_LOGS`), which keeps
  the producer of the last committed batch per transactional id; a commit that fails forgets them
  (:func:`_forget`), and the next one starts from storage alone (PROTOCOL.md here, "State in memory is
  only a cache");
* fault injection for tests (``testing.fault``), request counting (``testing.stats``), the log line;
* after a committed batch, the worker's background roller is asked to roll the partitions the batch wrote
  into segments when the policy (``rollEntries``/``rollBytes``) is met (txn_core/PROTOCOL.md "Segments";
  PROTOCOL.md here, "Rolling history into segments"): on a thread of its own, off the commit's path; its
  failures are only logged.

``abort_batch``: ``init_transactions`` (which settles any transaction the failed commit left), then, only
if the batch is not committed, delete this run's staged objects. A committed batch is left alone: its
objects are data.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from spark_txn_sink.faults import CountingStorage, Faults
from spark_txn_sink.options import SinkOptions
from txn_core import (
    ProducerFencedError,
    TransactionalIdTakenOverError,
    TransactionTimedOutError,
    TxnLogError,
    open_log,
)
from txn_core.clients.apptxn import AppCommitter, CommitResult, GroupPosition
from txn_core.clients.appunit import AppVersion
from txn_core.log import Log
from txn_core.logs import get_logger
from txn_core.ops.rolling import BackgroundRoller, RollPolicy
from txn_core.partition.staging import StagedRef
from txn_core.storage import open_storage
from txn_core.storage.base import Storage

__all__ = ["SINK_MARK", "BatchIdentity", "CommitResult", "GroupPosition", "abort_batch", "commit_batch"]

logger = get_logger(__name__)

#: The progress mark of the Spark sink's units.
SINK_MARK = "txnlog-spark-sink"


@dataclass(frozen=True, slots=True, init=False)
class BatchIdentity(AppVersion):
    """Who commits what: a transactional id, the topic it writes, and either a streaming (query id, batch id)
    or a write id. ``scoped_from``: the application id ``transactional_id`` was scoped from
    (``txn_core.clients.apptxn.scoped_transactional_id``), for ``txnAppId`` writes."""

    def __init__(
        self,
        transactional_id: str,
        query_id: str | None = None,
        batch_id: int | None = None,
        write_id: str | None = None,
        *,
        topic: str,
        scoped_from: str | None = None,
    ) -> None:
        AppVersion.__init__(self, transactional_id, SINK_MARK, query_id, batch_id, write_id, topic, scoped_from)

    @property
    def query_id(self) -> str | None:
        return self.run_id

    @property
    def batch_id(self) -> int | None:
        return self.version


class _Session(NamedTuple):
    """A log of this process with what its commits share: the storage every step uses (counting requests
    with ``testing.stats``), the counter, and the committer that keeps each transactional id's producer."""

    log: Log
    storage: Storage
    counting: CountingStorage | None
    #: A kept producer skips ``init_transactions`` and the progress read: as long as no other committer
    #: initialised the id, nothing else was committed for it, so its progress is the one kept; if one did,
    #: the kept producer is fenced, its first coordinator request (the PrepareCommit of the transaction the
    #: previous batch began ahead, or a begin or add) fails before anything of the batch is decided, and the
    #: commit starts again from storage alone.
    committer: AppCommitter[Log]


#: Logs of this process, reused by later commits: Spark runs every commit of a query run in one long-lived
#: Python worker, and a reused log skips replaying the transaction log from its snapshot and re-discovering
#: partition tails (hundreds of GETs per commit on a busy log). Only a cost: a fresh log is as correct.
_LOGS: dict[tuple[str, str, bool], _Session] = {}
_LOGS_LOCK = threading.Lock()


def _open(opts: SinkOptions) -> _Session:
    """The session of the sink's log, reused across the commits of this process (see :data:`_LOGS`); a
    commit that fails calls :func:`_forget` so that the next one starts from storage alone."""
    key = _log_key(opts)
    with _LOGS_LOCK:
        cached = _LOGS.get(key)
        if cached is None:
            storage: Storage = open_storage(opts.url, opts.storage_options)
            counting = CountingStorage(storage) if opts.stats_dir else None
            if counting is not None:
                storage = counting
            log = Log(storage)
            cached = _LOGS[key] = _Session(log, storage, counting, AppCommitter(log))
    if cached.counting is not None:
        cached.counting.counts.clear()  # counts are per commit
    return cached


def _log_key(opts: SinkOptions) -> tuple[str, str, bool]:
    return opts.url, json.dumps(opts.storage_options, sort_keys=True, default=str), bool(opts.stats_dir)


#: The background roller of each log of this process (see the module doc).
_ROLLERS: dict[tuple[str, str, bool], BackgroundRoller] = {}


def _request_roll(opts: SinkOptions, refs: list[StagedRef]) -> None:
    """Roll the partitions a committed batch wrote, in the background, when the policy is met. The roller
    has a log of its own: its requests are never counted as the commits' (``testing.stats``), and it shares
    no state with them."""
    if opts.roll_entries == 0 or not refs:
        return
    key = _log_key(opts)
    with _LOGS_LOCK:
        roller = _ROLLERS.get(key)
        if roller is None:
            policy = RollPolicy(entries=opts.roll_entries, bytes=opts.roll_bytes)
            log = Log(open_storage(opts.url, opts.storage_options))
            roller = _ROLLERS[key] = BackgroundRoller(log, policy, opts.roll_min_age_ms, check_min_age=False)
    appended = Counter(r.partition for r in refs)  # its references, and a marker, in each partition
    roller.appended(opts.topic, {p: n + 1 for p, n in appended.items()})


def _forget(opts: SinkOptions) -> None:
    with _LOGS_LOCK:
        dropped = _LOGS.pop(_log_key(opts), None)
    if dropped is not None:
        with contextlib.suppress(TxnLogError):
            dropped.committer.close()


def commit_batch(
    opts: SinkOptions,
    unit: BatchIdentity,
    refs: list[StagedRef],
    group_offsets: Callable[[str], GroupPosition | dict[tuple[str, int], int]] | None = None,
    *,
    before_begin: Callable[[Log], None] | None = None,
) -> CommitResult:
    """Commit one batch exactly once (``txn_core.clients.apptxn.commit_staged``). ``group_offsets(log_url)`` gives
    step 0: a :class:`GroupPosition` (fenced), or bare end offsets (committed unfenced, for callers that own
    the group alone); ``before_begin(log)`` runs right before a new transaction begins (the sink creates a
    planned topic)."""
    faults = Faults(opts.fault, unit.batch_id)
    started = time.perf_counter()
    session = _open(opts)
    counting = session.counting
    try:
        offsets = group_offsets(session.log.url) if group_offsets is not None and opts.consumer_group else None
        faults.hit("before_init")
        result = session.committer.commit(
            unit,
            refs,
            topic=opts.topic,
            group=opts.consumer_group,
            offsets=offsets,
            storage=session.storage,
            transaction_timeout_ms=opts.transaction_timeout_ms,
            before_begin=before_begin,
            hit=faults.hit,
        )
        if result.outcome == "committed":
            _request_roll(opts, refs)
        logger.info(
            "batch %s of %s %s: %d rows in %d objects to %s (%.0f ms)",
            unit.staging_batch,
            unit.transactional_id,
            result.outcome,
            result.rows,
            result.objects,
            opts.topic,
            (time.perf_counter() - started) * 1000,
        )
        if counting is not None and opts.stats_dir:
            if result.outcome == "committed":
                result.deleted  # noqa: B018 (the markers and cleanup running behind: counted with the commit)
            counting.write_stats(
                opts.stats_dir,
                unit.staging_batch,
                {
                    "outcome": result.outcome,
                    "objects": result.objects,
                    "rows": result.rows,
                    "seconds": round(time.perf_counter() - started, 4),
                },
            )
        return result
    except TransactionalIdTakenOverError as exc:
        _forget(opts)
        raise TransactionalIdTakenOverError(
            f"batch {unit.batch_id} of {unit.query_id}: this attempt committed nothing: its transactionalId "
            f"{unit.transactional_id!r} was taken over by {exc.other_run} (batch {exc.other_version} is the "
            "id's last commit), so a replay could no longer be recognised. A transactionalId belongs to one "
            "query at a time: stop the other query, or give each query its own transactionalId (without the "
            "option, each query derives its own).",
            transactional_id=unit.transactional_id,
            other_run=exc.other_run,
            other_version=exc.other_version,
        ) from exc
    except TransactionTimedOutError:
        _forget(opts)
        raise  # the batch's own transaction ran past transactionTimeoutMs: no other committer is involved
    except ProducerFencedError as exc:
        _forget(opts)
        if opts.consumer_group is None:
            raise
        raise ProducerFencedError(
            f"consumer group {opts.consumer_group!r}: batch {unit.batch_id} was not committed: {exc}. Its "
            f"transactional id {unit.transactional_id!r} was taken over by another committer (a second "
            "query on this group, or a newer run of this one); one query may commit to a group at a time. "
            "Stop the other query, or give each query its own consumerGroup.",
            transactional_id=unit.transactional_id,
        ) from exc
    except BaseException:
        _forget(opts)
        raise


def abort_batch(opts: SinkOptions, unit: BatchIdentity, refs: list[StagedRef]) -> int:
    """Spark aborted the batch: settle the transaction state, then delete this run's staged objects unless
    the batch turned out committed (a commit that raised after its commit point). Returns objects deleted."""
    Faults(opts.fault, unit.batch_id).hit("abort")
    session = _open(opts)
    try:
        return session.committer.abort(
            unit,
            refs,
            storage=session.storage,
            transaction_timeout_ms=opts.transaction_timeout_ms,
            group_fenced=opts.consumer_group is not None,
        )
    except BaseException:
        _forget(opts)
        raise


def open_sink_log(opts: SinkOptions) -> Log:
    """A :class:`Log` for the sink's URL (used on the driver for topic checks)."""
    return open_log(opts.url, opts.storage_options)
