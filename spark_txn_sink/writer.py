"""Spark's writer classes for ``df.writeStream.format("txnlog")`` and ``df.write.format("txnlog")``.

Thin by design: options are parsed once (:mod:`spark_txn_sink.options`), the topic and schema are
checked while Spark plans the write (:mod:`spark_txn_sink.topic`), tasks stage data
(:mod:`spark_txn_sink.stager`) and the driver commits references (:mod:`spark_txn_sink.commit`); all
transactional logic is txn_core's. See PROTOCOL.md in this package for the protocol and its crash
windows.

Where things run (pyspark 4.x): ``make_stream_writer`` runs in a driver-side Python worker once per
micro-batch to plan the write, and that instance is pickled to the tasks (``write``); ``commit`` and
``abort`` run on a *fresh* instance built by another ``make_stream_writer`` call. Nothing is carried in
memory between them: the batch identity is recomputed from the checkpoint and Spark's batch id.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage

from spark_txn_sink.checkpoint import (
    SESSION_ROOT_PROPERTY,
    SessionCheckpoint,
    locate,
    read_batch_offsets,
    read_query_id,
)
from spark_txn_sink.commit import BatchIdentity, GroupPosition, abort_batch, commit_batch
from spark_txn_sink.faults import Faults
from spark_txn_sink.messages import CommitMessageError, SinkCommitMessage, message_session, staged_refs
from spark_txn_sink.options import SinkOptions, parse_sink_options
from spark_txn_sink.pairing import group_offsets, group_start
from spark_txn_sink.stager import PartitionStager, TopicTarget
from spark_txn_sink.topic import PlannedTopic, create_planned_topic, frame_arrow_schema, ignored_columns, plan_topic
from spark_txn_source import catalog
from txn_core import ConfigurationError, open_log
from txn_core.clients.appunit import scoped_transactional_id

TRANSACTIONAL_ID_PREFIX = "spark-sink-"
GROUP_TRANSACTIONAL_ID_PREFIX = "spark-sink-group-"


def default_transactional_id(query_id: str, consumer_group: str | None = None) -> str:
    """The transactional id of a streaming query that sets none; stable across restarts on one checkpoint.

    Without ``consumerGroup``: derived from the query id. With it: derived from the group, so that a new
    query started from the group's offsets (new checkpoint, new query id) fences the query that wrote the
    group before and settles its open transaction at its first commit. Otherwise a transaction left
    open by a crash would keep every later offset commit to the group unreadable until its timeout, and a
    third query started from the group in that window would re-read output already written.
    """
    if consumer_group is None:
        return f"{TRANSACTIONAL_ID_PREFIX}{query_id}"
    tid = f"{GROUP_TRANSACTIONAL_ID_PREFIX}{consumer_group}"
    if len(tid) > 200:
        tid = f"{GROUP_TRANSACTIONAL_ID_PREFIX}{hashlib.sha256(consumer_group.encode()).hexdigest()[:40]}"
    return tid


def _plan(options: Mapping[str, str], schema: Any, *, streaming: bool) -> tuple[SinkOptions, TopicTarget, PlannedTopic]:
    opts = parse_sink_options(options, streaming=streaming)
    frame = frame_arrow_schema(schema)
    log = open_log(opts.url, opts.storage_options, allow_non_empty=opts.allow_non_empty)
    try:
        planned = plan_topic(log, opts, frame)
    finally:
        log.close()
    target = TopicTarget(
        opts.url,
        opts.storage_items,
        planned.name,
        planned.schema,
        planned.partitions,
        opts.key_column,
        ignored_columns=ignored_columns(schema),
    )
    return opts, target, planned


def make_stream_writer(options: Mapping[str, str], schema: Any, overwrite: bool) -> TxnLogStreamWriter:
    """``streamWriter``: validate everything, create the topic if asked, and fix the batch identity."""
    if overwrite:
        raise ConfigurationError(
            "the txnlog sink supports outputMode('append') only: a topic is an append-only log, so "
            "'complete' (rewrite the whole result every batch) cannot be honoured. Use outputMode('append') (with a "
            "watermark for aggregations), or for 'update' semantics foreachBatch with "
            "spark_txn_sink.idempotent_batch_writer(url, topic, app_id), which appends each batch's updated "
            "rows exactly once."
        )
    opts, target, planned = _plan(options, schema, streaming=True)
    if opts.checkpoint_location is None:  # under the session's checkpoint root: only the tasks learn the query
        return TxnLogStreamWriter(opts, target, None, planned)
    query_id = read_query_id(opts.checkpoint_location, opts.url, opts.storage_options)
    return TxnLogStreamWriter(opts, target, query_id, planned)


def make_batch_writer(options: Mapping[str, str], schema: Any, overwrite: bool) -> TxnLogBatchWriter:
    """``writer``: a batch ``df.write.mode("append")``, committed as one transaction."""
    if overwrite:
        raise ConfigurationError(
            "the txnlog sink takes mode('append') only: a topic is an append-only log and cannot be "
            "overwritten (Spark's error for the default mode names Overwrite as an option, but a txnlog "
            "topic refuses it). Use df.write.format('txnlog').mode('append')."
        )
    opts, target, planned = _plan(options, schema, streaming=False)
    if opts.app_id is not None and opts.app_version is not None:  # idempotent: (app, version) commits once
        # per topic, as Delta scopes (appId, version) per table: one application writing version N to two
        # topics commits it to each (a transactionalId given is taken as is, and refused for a second topic)
        app, scoped_from = f"spark-app-{opts.app_id}", None
        if opts.transactional_id is None:
            app, scoped_from = scoped_transactional_id(app, opts.topic), app
        unit = BatchIdentity(
            opts.transactional_id or app,
            query_id=opts.app_id,
            batch_id=opts.app_version,
            topic=opts.topic,
            scoped_from=scoped_from,
        )
        return TxnLogBatchWriter(opts, target, unit, planned)
    write_id = uuid.uuid4().hex
    tid = opts.transactional_id or f"spark-write-{write_id}"
    return TxnLogBatchWriter(opts, target, BatchIdentity(tid, write_id=write_id, topic=opts.topic), planned)


def _task_context() -> Any:
    from pyspark import TaskContext

    tc = TaskContext.get()
    if tc is None:  # pragma: no cover - Spark always runs write() in a task
        raise RuntimeError("write() ran outside a Spark task")
    return tc


def _stage(
    opts: SinkOptions,
    target: TopicTarget,
    unit: BatchIdentity,
    iterator: Iterator[pa.RecordBatch],
    session: SessionCheckpoint | None = None,
) -> SinkCommitMessage:
    """Stage one task's rows; return the references (shared by stream and batch writers).

    Without a key, task ``i`` of micro-batch ``n`` starts at partition ``i + n`` (``n``: a batch write's
    ``txnVersion``, else 0), so that a stream whose micro-batches run as fewer tasks than the topic has
    partitions (a small micro-batch is one task, :func:`spark_txn_source.planning.pack_ranges`) still
    spreads its rows over every partition.
    """
    tc = _task_context()
    partition_id, attempt = tc.partitionId(), tc.attemptNumber()
    start = partition_id + (unit.batch_id or 0)
    stager = PartitionStager(target, target.open_storage(), unit.prefix, f"t{partition_id}a{attempt}", start=start)
    refs = stager.stage_all(iterator)
    if partition_id == 0 and attempt == 0:
        Faults(opts.fault, unit.batch_id).hit("write")
    return SinkCommitMessage(unit.staging_batch, partition_id, attempt, tc.taskAttemptId(), tuple(refs), session)


class TxnLogStreamWriter(DataSourceStreamArrowWriter):
    """One micro-batch epoch = one txnlog transaction, exactly once (see :mod:`spark_txn_sink.commit`).

    ``query_id`` is read from ``checkpointLocation`` while Spark plans; None when the query checkpoints
    under the session's root, which only tasks see: they take the query id from their task context and
    hand it to the commit in their messages (:mod:`spark_txn_sink.checkpoint`).
    """

    def __init__(self, opts: SinkOptions, target: TopicTarget, query_id: str | None, planned: PlannedTopic) -> None:
        self.opts = opts
        self.target = target
        self.query_id = query_id
        self.planned = planned

    def _unit(self, batch_id: int, query_id: str) -> BatchIdentity:
        tid = self.opts.transactional_id or default_transactional_id(query_id, self.opts.consumer_group)
        return BatchIdentity(tid, query_id=query_id, batch_id=int(batch_id), topic=self.opts.topic)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        tc = _task_context()
        batch = tc.getLocalProperty("streaming.sql.batchId")
        task_query = tc.getLocalProperty("sql.streaming.queryId")
        if batch is None:  # pragma: no cover - always set by micro-batch execution
            raise RuntimeError("streaming write task without a batch id (continuous mode is not supported)")
        if self.query_id is not None:
            if task_query is not None and task_query != self.query_id:
                raise RuntimeError(
                    f"task of query {task_query} planned for query {self.query_id}: the checkpoint changed"
                )
            return _stage(self.opts, self.target, self._unit(int(batch), self.query_id), iterator)
        if task_query is None:  # pragma: no cover - always set by micro-batch execution
            raise RuntimeError("streaming write task without a query id")
        root = tc.getLocalProperty(SESSION_ROOT_PROPERTY)
        if not root:  # Spark refuses a query with neither; a defensive check
            raise ConfigurationError(
                "the txnlog sink needs a checkpoint: .option('checkpointLocation', DIR), or the session's "
                "spark.sql.streaming.checkpointLocation with a queryName (exactly-once resumes from it)"
            )
        session = SessionCheckpoint(root, self.opts.query_name, task_query)
        return _stage(self.opts, self.target, self._unit(int(batch), task_query), iterator, session)

    def _query(
        self, messages: list[WriterCommitMessage | None], batch_id: int
    ) -> tuple[str | None, SessionCheckpoint | None]:
        """The batch's query id (None: unknown, every task failed) and, under the session's checkpoint root,
        what the tasks saw of it."""
        if self.query_id is not None:
            return self.query_id, None
        session = message_session(messages, batch_id)
        return (session.query_id if session is not None else None), session

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        opts, n = self.opts, int(batchId)
        query_id, session = self._query(messages, n)
        if query_id is None:
            raise CommitMessageError(f"batch {n}: no task message names the query (Spark runs at least one task)")
        unit = self._unit(n, query_id)
        refs = staged_refs(messages, unit.staging_batch, strict=True)

        def offsets(log_url: str) -> GroupPosition:
            if session is not None:  # Spark's location under the session root, found from what tasks saw
                location = locate(session, opts.url, opts.storage_options)
            else:
                location = opts.checkpoint_location or ""
            batch = read_batch_offsets(location, n, opts.url, opts.storage_options)
            ends = group_offsets(batch.sources, log_url, batch_id=n, group=opts.consumer_group or "")
            start = group_start(batch.sources, None, ends)
            if start is None and n > 0:  # the batch starts where batch n - 1 ended
                previous = read_batch_offsets(location, n - 1, opts.url, opts.storage_options)
                start = group_start(batch.sources, previous.sources, ends)
            return GroupPosition(ends, start)

        commit_batch(
            opts,
            unit,
            refs,
            offsets if opts.consumer_group else None,
            before_begin=lambda log: create_planned_topic(log, self.planned),
        )

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        query_id, _ = self._query(messages, int(batchId))
        if query_id is None:  # every task failed before naming the query: batch N's replay settles and cleans
            return
        unit = self._unit(batchId, query_id)
        abort_batch(self.opts, unit, staged_refs(messages, unit.staging_batch, strict=False))


class TxnLogBatchWriter(DataSourceArrowWriter):
    """A batch ``df.write``: every task stages, the driver commits everything as one transaction."""

    def __init__(self, opts: SinkOptions, target: TopicTarget, unit: BatchIdentity, planned: PlannedTopic) -> None:
        self.opts = opts
        self.target = target
        self.unit = unit
        self.planned = planned

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        if catalog.creates_table(_task_context().getLocalProperty):  # before anything is staged
            raise ConfigurationError(catalog.TABLE_CREATION_REFUSED)
        return _stage(self.opts, self.target, self.unit, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        commit_batch(
            self.opts,
            self.unit,
            staged_refs(messages, self.unit.staging_batch, strict=True),
            before_begin=lambda log: create_planned_topic(log, self.planned),
        )

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        abort_batch(self.opts, self.unit, staged_refs(messages, self.unit.staging_batch, strict=False))
