"""Application transactions: staged data committed exactly once per (application, version) (PROTOCOL.md
"Application transactions").

Delta Lake's ``txn`` action, delta-rs's application transactions: an application that writes in numbered
units (a stream's micro-batches, a nightly load's dates) commits unit ``N`` of run ``R`` at most once,
however often it is retried or replayed. Distributed writers stage rows as objects
(:mod:`txn_core.partition.staging`); one committer per unit then calls :func:`commit_staged`:

1. With a kept producer (this process committed the application's previous unit) skip to 3; else
   ``init_transactions(T)`` for the application's transactional id ``T``: it fences every older committer
   (a zombie, an earlier attempt) and finishes what it left; then read ``T``'s **progress**, the metadata
   of its last committed transaction.
2. If the progress shows this unit committed (same application mark; the same write id, or the same run
   with a version at or above this one) it is a **replay**: nothing is committed, only this attempt's own
   staged objects are deleted, and an interrupted cleanup of the committed attempt is finished from its
   manifest.
3. Write the unit's **manifest** (the staged keys about to be committed) under the unit's staging prefix,
   overlapping the transaction's first requests; it is durable before the commit point.
4. ``begin``; one ``DATA_REF`` entry per staged object, and with a consumer group its offsets (fenced by
   their start position, PROTOCOL.md "Offsets fence"), all at once; ``commit_transaction(progress)``: the
   progress rides on the PrepareCommit record, so output, offsets and progress are one decision.
5. Delete the unit's staged objects the commit does not name (failed or duplicate attempts), then the
   manifest; before returning (local disk, one-shot writes) wait for the markers first, while behind the
   commit the next unit's entries carry them (PROTOCOL.md "Carried markers"). Failures here are logged:
   the unit is committed. A unit whose producer is
   kept, on a store whose requests are round trips (``Storage.overlap_reads``: not local disk), returns at
   its commit point and finishes step 5 behind (:class:`Kept`), as Kafka's
   ``commitTransaction`` returns once PrepareCommit is durable while the coordinator writes the markers:
   the unit is visible from the commit point on (PROTOCOL.md "Read bound"), and every state a process
   that dies meanwhile leaves is a state a crash after the commit point leaves anyway. The application's
   next unit waits for it before it begins.

Only staged objects the committed transaction lists become visible; a staged object is deleted only by a
committer that knows it uncommitted (fenced first) or unreferenced by the committed unit (PROTOCOL.md
"Staged data"). One-shot writes (a ``write_id`` instead of run and version) keep no manifest and mark
their progress ``ephemeral``, so their transactional ids expire.

:class:`AppCommitter` keeps a log's producers between units (the steady state skips step 1: a kept
producer that another committer fenced fails at its begin, before anything is decided, and the unit
starts over from storage alone). The Spark sink (``spark_txn_sink.commit``) is a translation onto
:func:`commit_staged`; ``AppCommitter.write_once`` and ``txnlog produce --app-id`` use it for whole tables.

Units are scoped to the topic they write, as Delta scopes ``(appId, version)`` to a table: an application
id commits to each topic under a transactional id of its own (:func:`scoped_transactional_id`), so writing
version ``N`` to two topics commits it once to each (:class:`AppVersion`, scope).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Generic, NamedTuple, TypeVar

from txn_core.clients import appmanifest
from txn_core.clients.appunit import AppVersion
from txn_core.clients.producer import DEFAULT_BATCH_BYTES, Producer
from txn_core.clients.progress import Progress
from txn_core.errors import (
    AppScopeError,
    ConfigurationError,
    GroupFencedError,
    ProducerFencedError,
    TransactionalIdTakenOverError,
    TxnLogError,
)
from txn_core.format.ids import TopicPartition, validate_name
from txn_core.logs import get_logger
from txn_core.partition.staging import StagedRef
from txn_core.storage.base import Storage
from txn_core.storage.parallel import submit

if TYPE_CHECKING:
    from txn_core.clients.context import LogContext, SupportsContext

#: what :func:`commit_staged` is given (a ``Log`` or its context), handed back to its ``before_begin``
Given = TypeVar("Given", bound="SupportsContext")

logger = get_logger("txnlog.apptxn")

Offsets = dict[tuple[str, int] | TopicPartition, int]


@dataclass(frozen=True, slots=True)
class GroupPosition:
    """A unit's input for its consumer group: ``end`` offsets to commit, and the ``start`` the input began
    at (the offsets fence claims it; None: the run's first unit did not start from the group)."""

    end: dict[tuple[str, int], int]
    start: dict[tuple[str, int], int] | None


@dataclass(frozen=True, slots=True)
class CommitResult:
    """What a commit did: ``committed`` (a new transaction) or ``replayed`` (already committed: no-op).
    ``cleanup``: the staged objects deleted after it, or the cleanup still running behind the commit."""

    outcome: str
    rows: int
    objects: int
    cleanup: int | Future[int] = 0

    @property
    def deleted(self) -> int:
        """Staged objects the cleanup deleted (waits for a cleanup running behind the commit; raises what
        it raised)."""
        return self.cleanup if isinstance(self.cleanup, int) else self.cleanup.result()


class Kept(NamedTuple):
    """A producer kept from the application's previous committed unit, the progress it committed, and that
    unit's step 5 running behind it (None: finished before the commit returned)."""

    producer: Producer
    progress: Progress
    finishing: Future[int] | None = None

    def settle(self) -> bool:
        """Wait for the previous unit's step 5; False if it failed (the producer is not reused: closing it
        writes the markers, and the next unit starts from storage alone)."""
        if self.finishing is None:
            return True
        try:
            self.finishing.result()
        except Exception as exc:  # already logged by _finish; InjectedFaultError and the like included
            logger.info("the previous unit of %s did not finish cleanly: %s", self.producer.transactional_id, exc)
            return False
        return True


def _no_fault(point: str) -> None:
    return None


def commit_staged(
    log: Given,
    unit: AppVersion,
    refs: list[StagedRef],
    *,
    topic: str,
    group: str | None = None,
    offsets: GroupPosition | dict[tuple[str, int], int] | None = None,
    storage: Storage | None = None,
    kept: Kept | None = None,
    transaction_timeout_ms: int = 60_000,
    before_begin: Callable[[Given], None] | None = None,
    hit: Callable[[str], None] = _no_fault,
) -> tuple[CommitResult, Kept | None]:
    """Commit ``refs`` (objects staged for ``topic``) as ``unit``, exactly once (module doc, steps 1-5).

    ``offsets`` for ``group``: a :class:`GroupPosition` (fenced) or bare end offsets (unfenced, for a
    writer that owns the group alone). ``storage``: the storage for manifests and cleanup (default: the
    log's). ``kept``: the producer this process kept from the application's previous unit. ``before_begin``
    runs right before a new transaction begins; ``hit`` names the protocol's steps for fault injection
    (``before_commit``, ``after_prepare``, ``after_commit``). Returns the result and the producer to keep
    for the next unit (None: nothing to keep)."""
    ctx = log.context
    storage = storage or ctx.storage
    unit = unit.for_topic(topic)
    begin_hook = (lambda: before_begin(log)) if before_begin is not None else None
    if kept is not None and not kept.settle():
        _close_kept(kept)
        kept = None
    if kept is not None:
        try:
            return _commit(ctx, storage, unit, refs, topic, group, offsets, begin_hook, hit, *kept[:2])
        except ProducerFencedError:  # another committer of the id ran since: start from storage alone
            pass
    refused = _refusal(unit, offsets, *_progress(ctx, unit))
    if refused is not None:
        raise refused  # before fencing the run that owns the id now
    producer = _producer(ctx, unit.transactional_id, transaction_timeout_ms=transaction_timeout_ms)
    try:
        producer.init_transactions()
        previous, source = _progress(ctx, unit, fence_timeout_ms=transaction_timeout_ms)
    except BaseException:
        producer.close()
        raise
    if not unit.committed_by(previous):  # a replay finishes that cleanup itself (appmanifest.cleanup_replay)
        submit(appmanifest.heal_previous, storage, previous)
    return _commit(ctx, storage, unit, refs, topic, group, offsets, begin_hook, hit, producer, previous, source)


#: How long a unit's markers wait for the next unit's entries to carry them (PROTOCOL.md "Carried markers"):
#: an application's units come a micro-batch apart (hundreds of milliseconds for Spark), so the producer's
#: default of 200 ms would leave most of them alone. Well below the 5 s after which anyone completes a
#: prepared transaction.
APP_MARKER_LINGER_MS = 1000


def _producer(ctx: LogContext, transactional_id: str, *, transaction_timeout_ms: int) -> Producer:
    return Producer(
        ctx,
        transactional_id,
        transaction_timeout_ms=transaction_timeout_ms,
        batch_bytes=DEFAULT_BATCH_BYTES,
        marker_linger_ms=APP_MARKER_LINGER_MS,
    )


def _commit(
    ctx: LogContext,
    storage: Storage,
    unit: AppVersion,
    refs: list[StagedRef],
    topic: str,
    group: str | None,
    offsets: GroupPosition | dict[tuple[str, int], int] | None,
    before_begin: Callable[[], None] | None,
    hit: Callable[[str], None],
    producer: Producer,
    previous: Progress | None,
    source: str | None = None,
) -> tuple[CommitResult, Kept | None]:
    """Steps 2-5 with ``producer`` (initialised, or kept) and ``previous``, the id's progress (``source``: the
    id it is of, when the unit's scoped id fell back to its application id's, see :func:`_progress`). Keeps the
    producer when the unit commits; closes it otherwise. Raises :class:`ProducerFencedError` before
    anything of the unit is durable but its manifest when a kept producer was fenced meanwhile."""
    keep: Kept | None = None
    try:
        refused = _refusal(unit, offsets, previous, source)
        if refused is not None:
            raise refused  # another run committed between the check before fencing and the fencing
        if unit.committed_by(previous):
            return CommitResult("replayed", 0, 0, appmanifest.cleanup_replay(storage, unit, previous, refs)), None
        if before_begin is not None:
            before_begin()
        manifest_key = appmanifest.manifest_key(unit) if unit.write_id is None else None
        # the manifest's create overlaps the transaction's first requests; it is durable before the commit point
        written = submit(appmanifest.write_manifest, storage, unit, refs, manifest_key) if manifest_key else None
        try:
            try:
                if refs and max(r.partition for r in refs) >= ctx.topics.get(topic, refresh=False).partitions:
                    ctx.topics.get(topic)  # the writers saw partitions added since this process last looked
                producer.begin_transaction()
                if offsets is not None and group is not None:
                    # One begin record registers every partition and the group's log; the references, the
                    # offsets and the offsets fence's claim are then written at once.
                    end, start = _offsets_to_send(ctx, group, offsets)
                    producer.send_staged(refs, offsets=end, group_id=group, start_offsets=start)
                else:
                    producer.send_staged(refs)
            finally:
                if written is not None:
                    written.result()
            hit("before_commit")
            progress = unit.progress(topic, refs, manifest_key, previous)
            producer.commit_transaction(metadata=progress.to_json())
        except ProducerFencedError:
            # Fenced before its commit point (the coordinator refused this producer's request): this attempt
            # decided nothing, and its manifest names nothing committed. The caller starts over from storage,
            # where the unit may turn out replayed, which would never delete this attempt's manifest.
            if manifest_key is not None:
                appmanifest.quiet_delete(storage, [manifest_key])
            raise
        hit("after_prepare")
        listing = submit(storage.list, unit.prefix)  # for the cleanup, overlapping the markers
        rows, objects = sum(r.rows for r in refs), len(refs)
        if unit.write_id is not None or not storage.overlap_reads:
            # Step 5 before returning: a one-shot write closes its producer (the markers land before it
            # returns, so readers of the topic need not ask the transaction log; close() writes the
            # Complete), and on a store whose requests are no round trips (local disk) step 5 costs less
            # than a hand-off.
            finished = _finish(producer, storage, unit, refs, manifest_key, listing, hit)
            if unit.write_id is None:
                keep = Kept(producer, progress)
            return CommitResult("committed", rows, objects, finished), keep
        # Kept: the cleanup runs behind; the markers ride in the next unit's entries (or follow their linger).
        finishing = submit(partial(_finish, behind=True), producer, storage, unit, refs, manifest_key, listing, hit)
        keep = Kept(producer, progress, finishing)
        return CommitResult("committed", rows, objects, finishing), keep
    finally:
        if keep is None:
            producer.close()


def _close_kept(kept: Kept) -> None:
    """Close a kept producer after its last unit finished; a failure to close is logged (the units are
    committed; the id's next ``init_transactions`` finishes what is left)."""
    kept.settle()
    try:
        kept.producer.close()
    except TxnLogError as exc:
        logger.info("kept producer of %s not closed cleanly: %s", kept.producer.transactional_id, exc)


def _finish(
    producer: Producer,
    storage: Storage,
    unit: AppVersion,
    refs: list[StagedRef],
    manifest_key: str | None,
    listing: Future[list[str]],
    hit: Callable[[str], None],
    *,
    behind: bool = False,
) -> int:
    """Step 5 of a committed unit: its markers unless they may travel, then its cleanup (objects deleted).
    ``behind``: run behind the returned commit, on a store whose requests are round trips.

    Behind the commit the markers are not waited for: the kept producer's next unit carries them in its
    entries (PROTOCOL.md "Carried markers"), or the producer writes them alone after their linger. Before
    returning (local disk, where writing them costs less than a hand-off, and one-shot writes) they are
    written first, so that a unit returned there leaves nothing for anyone to complete. The cleanup needs
    none of them: the unit was decided at its commit point.

    Crash windows: before the markers land, readers decide the unit through the transaction log and the
    id's next ``init_transactions`` (or the coordinator's recovery) writes them; before the manifest is
    deleted, a replay of the unit finishes the cleanup from it (PROTOCOL.md "Application transactions")."""
    if not behind:
        try:
            producer.wait_for_markers()
        except Exception as exc:
            logger.warning("%s: committed; its markers are not all written yet: %s", unit.prefix, exc)
            raise
    hit("after_commit")
    return appmanifest.cleanup_committed(storage, unit, refs, manifest_key, listing)


def _refusal(
    unit: AppVersion,
    offsets: GroupPosition | dict[tuple[str, int], int] | None,
    progress: Progress | None,
    source: str | None = None,
) -> AppScopeError | TransactionalIdTakenOverError | None:
    """Why ``unit`` may not commit after ``progress`` (of transactional id ``source``):
    :meth:`AppVersion.out_of_scope`, then :meth:`AppVersion.taken_over` unless the unit's group offsets are
    fenced (a :class:`GroupPosition`): the offsets fence already refuses a run that another run overtook on
    its group, naming the offsets."""
    scope = unit.out_of_scope(progress, source)
    if scope is not None or isinstance(offsets, GroupPosition):
        return scope
    return unit.taken_over(progress)


def _progress(ctx: LogContext, unit: AppVersion, *, fence_timeout_ms: int | None = None) -> tuple[Progress | None, str]:
    """The progress of ``unit``'s transactional id, and the id it is of.

    A scoped id with none yet takes that of the application id it was scoped from (PROTOCOL.md "Application
    transactions", scope): units were committed under the bare application id before units were scoped per
    topic, and the last of them must still be recognised (a query restarted across the change replays it),
    whatever topic it names (:meth:`AppVersion.committed_by` and :meth:`AppVersion.out_of_scope` judge it).
    An application id whose last commit carries another mark is another application's, and is left alone.
    With ``fence_timeout_ms`` (after the scoped id's own fencing), the application id is fenced too before
    its progress is read: a committer of the older kind still in the middle of a unit under it (a zombie)
    could otherwise commit that unit after this one did."""
    tid = unit.transactional_id
    metadata = ctx.transaction_metadata(tid)
    if metadata is not None or unit.scoped_from is None:
        return unit.read_progress(metadata), tid
    state = ctx.coordinator.state(unit.scoped_from)
    if state is None or (state.last_committed is not None and state.last_committed.get("sink") != unit.app):
        return None, tid
    if fence_timeout_ms is not None:
        producer = _producer(ctx, unit.scoped_from, transaction_timeout_ms=fence_timeout_ms)
        try:
            producer.init_transactions()
        finally:
            producer.close()
    earlier = unit.read_progress(ctx.transaction_metadata(unit.scoped_from), unit.scoped_from)
    if earlier is None:
        return None, tid
    return earlier, unit.scoped_from


def _aborted_topic(unit: AppVersion, refs: list[StagedRef], topic: str | None) -> str | None:
    """The topic an aborted unit was committing to: the one given, the unit's own, else that of ``refs``."""
    return topic or unit.topic or next((r.topic for r in refs), None)


def abort_staged(
    log: SupportsContext,
    unit: AppVersion,
    refs: list[StagedRef],
    *,
    storage: Storage | None = None,
    transaction_timeout_ms: int = 60_000,
    group_fenced: bool = False,
    topic: str | None = None,
) -> int:
    """The unit failed: settle the transaction state (``init_transactions`` fences and finishes whatever a
    failed commit left), then delete this attempt's staged objects unless the unit turned out committed (a
    commit that raised after its commit point). Returns objects deleted.

    A unit whose fate the progress cannot tell (:meth:`AppVersion.out_of_scope`: the same run's version at
    or above it committed to another topic) is settled but deletes nothing: it may have committed before
    that commit, and the staged-data sweep removes its objects if it did not.

    A run whose id another run took over (:meth:`AppVersion.taken_over`) does neither, unless
    ``group_fenced`` (its commits sent fenced group offsets, so the offsets fence refused it, possibly with
    its transaction open: that one is settled as always). ``topic``: the topic the unit wrote, for a unit
    not bound to one (default: that of ``refs``)."""
    ctx = log.context
    storage = storage or ctx.storage
    bound = _aborted_topic(unit, refs, topic)
    if bound is None:
        raise ConfigurationError(
            f"abort_staged: unit {unit.staging_batch} of application {unit.transactional_id!r} is bound to no "
            "topic and has no staged objects to tell it: pass topic=, the topic the unit was committing to"
        )
    unit = unit.for_topic(bound)
    if not group_fenced and unit.taken_over(_progress(ctx, unit)[0]) is not None:
        # Another run owns the id: it fenced this run (settling what it left) before committing, and fencing
        # it back would abort its open transaction. Whether this attempt got past its commit point before
        # the other run committed is no longer known, so nothing is deleted: the staged-data sweep removes
        # what no committed transaction references.
        return 0
    producer = _producer(ctx, unit.transactional_id, transaction_timeout_ms=transaction_timeout_ms)
    try:
        producer.init_transactions()
        progress, source = _progress(ctx, unit, fence_timeout_ms=transaction_timeout_ms)
        if unit.committed_by(progress) or unit.out_of_scope(progress, source) is not None:
            return 0  # committed, or not known to be uncommitted: its objects may be data
    finally:
        producer.close()
    return appmanifest.quiet_delete(storage, [r.key for r in refs] + appmanifest.manifests(storage, unit))


def _offsets_to_send(
    ctx: LogContext, group: str, position: GroupPosition | dict[tuple[str, int], int]
) -> tuple[Offsets, Offsets | None]:
    """The unit's group offsets and the start that fences them (PROTOCOL.md "Offsets fence"), or no start
    for plain offsets. A first unit that did not start from the group may commit only to a group that has
    no offsets for its partitions yet (its start is then the group's origin, -1)."""
    if not isinstance(position, GroupPosition):
        return dict(position.items()), None
    start = position.start
    if start is None:
        committed = ctx.groups.committed(group, require_stable=True)
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
    return dict(position.end.items()), dict(start.items())


# --- a committer that keeps its producers ---------------------------------------------------------


class AppCommitter(Generic[Given]):
    """Commits units of one or more applications to one log exactly once, keeping each application's
    producer between units (its steady state skips ``init_transactions`` and the progress read). One per
    process and log; thread-safe across applications, one unit at a time per application. ``log``: a
    :class:`txn_core.Log` (or its context), handed to the ``before_begin`` of :meth:`commit`."""

    def __init__(self, log: Given, *, transaction_timeout_ms: int = 60_000) -> None:
        self.log = log
        self.ctx = log.context
        self.transaction_timeout_ms = transaction_timeout_ms
        self._kept: dict[str, Kept] = {}
        self._lock = threading.Lock()

    def commit(
        self,
        unit: AppVersion,
        refs: list[StagedRef],
        *,
        topic: str,
        group: str | None = None,
        offsets: GroupPosition | dict[tuple[str, int], int] | None = None,
        storage: Storage | None = None,
        transaction_timeout_ms: int | None = None,
        before_begin: Callable[[Given], None] | None = None,
        hit: Callable[[str], None] = _no_fault,
    ) -> CommitResult:
        """:func:`commit_staged` with this committer's kept producer for ``unit``'s transactional id (the
        arguments are :func:`commit_staged`'s; ``transaction_timeout_ms`` defaults to the committer's). A
        commit that raises keeps no producer: the next unit starts from storage alone."""
        unit = unit.for_topic(topic)
        with self._lock:
            kept = self._kept.pop(unit.transactional_id, None)
        result, keep = commit_staged(
            self.log,
            unit,
            refs,
            topic=topic,
            group=group,
            offsets=offsets,
            storage=storage,
            kept=kept,
            transaction_timeout_ms=transaction_timeout_ms or self.transaction_timeout_ms,
            before_begin=before_begin,
            hit=hit,
        )
        if keep is not None:
            with self._lock:
                old = self._kept.pop(unit.transactional_id, None)
                self._kept[unit.transactional_id] = keep
            if old is not None and old.producer is not keep.producer:
                _close_kept(old)
        return result

    def abort(
        self,
        unit: AppVersion,
        refs: list[StagedRef],
        *,
        storage: Storage | None = None,
        topic: str | None = None,
        transaction_timeout_ms: int | None = None,
        group_fenced: bool = False,
    ) -> int:
        """:func:`abort_staged`, after closing the producer kept for ``unit``'s transactional id (the abort
        fences it); returns the staged objects deleted."""
        bound = _aborted_topic(unit, refs, topic)
        if bound is not None:
            self._drop(unit.for_topic(bound).transactional_id)
        return abort_staged(
            self.log,
            unit,
            refs,
            storage=storage,
            topic=topic,
            transaction_timeout_ms=transaction_timeout_ms or self.transaction_timeout_ms,
            group_fenced=group_fenced,
        )

    def write_once(
        self, unit: AppVersion, topic: str, data: object, *, partition: int | None = None, key_column: str | None = None
    ) -> CommitResult:
        """Stage ``data`` (anything ``Producer.send`` takes) for ``topic`` and commit it as ``unit``: a
        replay of the same unit commits nothing and leaves nothing staged."""
        return self.commit(
            unit, stage_table(self.ctx, unit, topic, data, partition=partition, key_column=key_column), topic=topic
        )

    def _drop(self, tid: str) -> None:
        with self._lock:
            kept = self._kept.pop(tid, None)
        if kept is not None:
            _close_kept(kept)

    def close(self) -> None:
        """Close the kept producers once their last units finished (their last Complete records are
        written)."""
        with self._lock:
            kept, self._kept = list(self._kept.values()), {}
        for k in kept:
            _close_kept(k)

    def __enter__(self) -> AppCommitter[Given]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def stage_table(
    log: SupportsContext,
    unit: AppVersion,
    topic: str,
    data: object,
    *,
    partition: int | None = None,
    key_column: str | None = None,
) -> list[StagedRef]:
    """Conform ``data`` to ``topic``'s schema, route it (a partition, a key column's hash, else partition
    0) and stage one object per partition under ``unit``'s prefix."""
    from txn_core.clients.routing import split_by_key
    from txn_core.format.schema import conform
    from txn_core.partition.staging import write_staged

    ctx = log.context
    unit = unit.for_topic(topic)
    validate_name("transactional id", unit.transactional_id)
    meta = ctx.topics.get(topic)
    if partition is not None and not (isinstance(partition, int) and 0 <= partition < meta.partitions):
        raise ConfigurationError(
            f"partition {partition!r} does not exist in topic {topic!r} (partitions 0..{meta.partitions - 1})"
        )
    table = conform(data, meta.schema, topic=topic)
    parts = split_by_key(table, key_column, meta.partitions) if key_column is not None else {partition or 0: table}
    refs = []
    for p, part in sorted(parts.items()):
        ref = write_staged(
            ctx.storage, unit.prefix, topic, p, part.to_batches(), meta.schema, tag=unit.staging_batch, clock=ctx.clock
        )
        if ref is not None:
            refs.append(ref)
    return refs
