"""The commit message a Spark write task returns to the driver: references, never data."""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql.datasource import WriterCommitMessage

from spark_txn_sink.checkpoint import SessionCheckpoint
from txn_core import TxnLogError
from txn_core.partition.staging import StagedRef


class CommitMessageError(TxnLogError):
    """Spark offered commit messages that cannot be committed as one batch (a bug, never user input)."""


@dataclass(frozen=True)
class SinkCommitMessage(WriterCommitMessage):
    """What one successful task attempt wrote: its staged objects (one :class:`StagedRef` each).

    ``batch`` is the staging batch name the task wrote under (``<query id>.<batch id>`` for streams, the
    write id for batch writes); the committer checks it against its own before committing anything.
    ``session``: set when the query checkpoints under the session's root, which only tasks can see
    (:mod:`spark_txn_sink.checkpoint`); the commit takes the query's identity from it.
    """

    batch: str
    partition_id: int
    attempt: int
    task_attempt_id: int
    refs: tuple[StagedRef, ...]
    session: SessionCheckpoint | None = None

    @property
    def rows(self) -> int:
        return sum(r.rows for r in self.refs)


def staged_refs(messages: list[WriterCommitMessage | None], batch: str, *, strict: bool) -> list[StagedRef]:
    """The refs of ``messages`` in a deterministic order (Spark partition, then write order).

    ``strict`` (commit): every message must be one of ours, for ``batch``, one per Spark partition; a
    failed task (None) is an error. Not strict (abort): failed tasks are skipped.
    """
    ours: list[SinkCommitMessage] = []
    for m in messages:
        if m is None:
            if strict:
                raise CommitMessageError(f"batch {batch}: commit called with a failed task's message")
            continue
        if not isinstance(m, SinkCommitMessage):
            raise CommitMessageError(f"batch {batch}: unexpected commit message {type(m).__name__}")
        if m.batch != batch:
            if strict:
                raise CommitMessageError(f"message of staging batch {m.batch!r} offered to commit {batch!r}")
            continue
        ours.append(m)
    if strict:
        parts = [m.partition_id for m in ours]
        if len(set(parts)) != len(parts):
            raise CommitMessageError(
                f"batch {batch}: two commit messages for one Spark partition ({sorted(parts)}); refusing to "
                "commit duplicates"
            )
    ours.sort(key=lambda m: (m.partition_id, m.attempt))
    return [r for m in ours for r in m.refs]


def message_session(messages: list[WriterCommitMessage | None], batch_id: int) -> SessionCheckpoint | None:
    """The session checkpoint the tasks of ``messages`` saw (all agree), or None when no message has one
    (every task failed)."""
    seen = {m.session for m in messages if isinstance(m, SinkCommitMessage) and m.session is not None}
    if len(seen) > 1:
        raise CommitMessageError(
            f"batch {batch_id}: tasks saw different queries or checkpoints: {sorted(map(str, seen))}"
        )
    return next(iter(seen), None)
