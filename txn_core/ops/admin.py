"""Transaction administration: list, describe, abort, find hanging (Kafka KIP-664; PROTOCOL.md "Admin").

A transaction is **hanging** when it keeps a partition's last stable offset from advancing for longer
than it should: it is ongoing in the partition past its timeout (the next read_committed reader will
abort it), or the partition holds its data without a marker although the transaction log says it ended
(a participant the coordinator did not know about). ``abort_transaction`` ends an ongoing transaction by
the ordinary protocol (PrepareAbort with an epoch bump, markers, CompleteAbort), fencing its producer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from txn_core.coordinator.txnlog import TidState
from txn_core.errors import ConfigurationError
from txn_core.format import paths
from txn_core.format.ids import TopicPartition, TxnId
from txn_core.format.states import CoordinatorState
from txn_core.logs import get_logger
from txn_core.partition.state import PartitionState

if TYPE_CHECKING:
    from txn_core.clients.context import LogContext, SupportsContext

expiry_logger = get_logger("txnlog.expiry")


@dataclass(frozen=True, slots=True)
class TransactionListing:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    state: str
    txn: TxnId | None
    coordinator: int
    #: the transaction was begun ahead by its producer's last decision (PROTOCOL.md "Begin ahead"): open to
    #: readers of any data written under it, idle otherwise; its start is its first write
    begun_ahead: bool = False


@dataclass(frozen=True, slots=True)
class TransactionDescription:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    state: str
    txn: TxnId | None
    timeout_ms: int
    #: None for a transaction begun ahead (its timeout runs from its first write, which only its data tells)
    start_ms: int | None
    age_ms: int | None
    participants: tuple[str, ...]
    last_committed_metadata: dict[str, Any] | None
    abort_reason: str | None
    #: the next transaction, begun ahead with the last decision (PROTOCOL.md "Begin ahead"): open wherever
    #: its producer has written under it (readers time it out from its first entry), idle otherwise
    ahead: TxnId | None = None


@dataclass(frozen=True, slots=True)
class HangingTransaction:
    topic_partition: TopicPartition
    txn: TxnId
    transactional_id: str | None
    first_offset: int
    age_ms: int | None
    reason: str


def _describe(ctx: LogContext, st: TidState) -> TransactionDescription:
    age = (
        ctx.clock() - st.start_ms
        if st.start_ms is not None
        and st.state in (CoordinatorState.ONGOING, CoordinatorState.PREPARE_COMMIT, CoordinatorState.PREPARE_ABORT)
        else None
    )
    return TransactionDescription(
        st.tid,
        st.producer_id,
        st.epoch,
        st.state.value,
        st.txn,
        st.timeout_ms,
        st.start_ms,
        age,
        st.participants,
        st.last_committed,
        st.abort_reason,
        st.ahead.txn if st.ahead is not None else None,
    )


def list_transactions(log: SupportsContext, *, include_complete: bool = False) -> list[TransactionListing]:
    ctx = log.context
    out: list[TransactionListing] = []
    for c in range(ctx.coordinator_partitions):
        view = ctx.views.get(c)
        view.refresh()
        states = list(view.tids.values()) if include_complete else view.open_states()
        out.extend(
            TransactionListing(s.tid, s.producer_id, s.epoch, s.state.value, s.txn, c, s.begun_ahead) for s in states
        )
    return sorted(out, key=lambda t: t.transactional_id)


def describe_transaction(log: SupportsContext, transactional_id: str) -> TransactionDescription:
    ctx = log.context
    st = ctx.coordinator.state(transactional_id)
    if st is None:
        raise ConfigurationError(f"unknown transactional id {transactional_id!r}: no producer ever used it")
    return _describe(ctx, st)


def abort_transaction(log: SupportsContext, transactional_id: str) -> TransactionDescription:
    ctx = log.context
    st = ctx.coordinator.state(transactional_id)
    if st is None:
        raise ConfigurationError(f"unknown transactional id {transactional_id!r}: no producer ever used it")
    result = ctx.coordinator.abort_transaction(transactional_id)
    return _describe(ctx, result or st)


def find_hanging_transactions(
    log: SupportsContext, topic: str | None = None, *, max_age_ms: int | None = None
) -> list[HangingTransaction]:
    """Open transactions holding a partition's read bound too long (see module doc).

    ``max_age_ms`` flags anything open for longer than that, whatever its timeout.
    """
    ctx = log.context
    topics = [topic] if topic else ctx.topics.list()
    now = ctx.clock()
    out = []
    for t in topics:
        meta = ctx.topics.get(t)
        for p in range(meta.partitions):
            state = ctx.partition_state(paths.partition_log_path(t, p))
            state.scan_to_end()
            for o in list(state.buffer.ongoing.values()):
                view = ctx.views.get(o.txn.coordinator)
                view.refresh()
                status = view.status(o.txn)
                start = state.start_ms(o.txn, status)
                age = now - start if start else None
                reason = None
                if status is None or status.state is None or status.finished:
                    reason = "the transaction log says it ended, but this partition has no marker for it"
                elif status.state == CoordinatorState.ONGOING and start is not None and now > start + status.timeout_ms:
                    reason = f"ongoing past its timeout of {status.timeout_ms} ms"
                elif max_age_ms is not None and age is not None and age > max_age_ms:
                    reason = f"open for {age} ms (more than {max_age_ms} ms)"
                if reason:
                    out.append(
                        HangingTransaction(
                            TopicPartition(t, p), o.txn, status.tid if status else None, o.first_offset, age, reason
                        )
                    )
    return out


def abort_hanging(log: SupportsContext, topic: str, partition: int, txn: TxnId) -> int:
    """Write an ABORT marker for ``txn`` into one partition whose data it holds without a marker
    (KIP-664's ``--topic --partition --start-offset`` abort). Returns the marker's offset.

    Refused while the transaction log says ``txn`` is ongoing (abort it by its transactional id) or
    committed with this partition as a participant (its marker is being written).
    """
    ctx = log.context
    from txn_core.format.entry import EntryKind, Payload

    meta = ctx.topics.get(topic)
    if not 0 <= partition < meta.partitions:
        raise ConfigurationError(f"topic {topic!r} has no partition {partition} (0..{meta.partitions - 1})")
    path = paths.partition_log_path(topic, partition)
    state = ctx.partition_state(path)
    state.scan_to_end()
    ongoing = state.buffer.by_txn.get(txn)
    if ongoing is None:
        raise ConfigurationError(
            f"transaction {txn} holds no data without a marker in {topic}-{partition}; "
            "nothing to abort (see find_hanging_transactions)"
        )
    view = ctx.views.get(txn.coordinator)
    view.refresh()
    status = view.status(txn)
    if status is not None and status.state == CoordinatorState.ONGOING:
        raise ConfigurationError(
            f"transaction {txn} is still ongoing in the transaction log; abort it by its "
            f"transactional id {status.tid!r} instead"
        )
    if status is not None and status.committed and path in status.participants:
        raise ConfigurationError(
            f"transaction {txn} committed and {topic}-{partition} is one of its "
            "participants; its marker is being written, nothing to abort"
        )
    payload = Payload.of_json(
        {
            "outcome": "ABORT",
            "txn": str(txn),
            "tid": status.tid if status else None,
            "reason": "aborted as hanging by an operator",
        }
    )
    result = ctx.partition_log(path).append_payload(
        EntryKind.ABORT,
        payload,
        1,
        producer_id=ongoing.producer_id,
        producer_epoch=ongoing.producer_epoch,
        txn=txn,
    )
    state.scan_to_end()
    return result.base_offset


def expire_transactions(log: SupportsContext) -> int:
    """Abort every transaction past its timeout, in every coordinator partition; returns how many.

    A transaction begun ahead has no start in the transaction log: its timeout runs from its first write
    (PROTOCOL.md "Timeouts"), which this finds in the logs it guessed as participants once it has been
    reserved for longer than its timeout (:func:`_first_write_ms`)."""
    ctx = log.context
    n = 0
    scanned: dict[str, PartitionState | None] = {}  # each participant's buffer brought up to date once
    for c in range(ctx.coordinator_partitions):
        view = ctx.views.get(c)
        view.refresh()
        n += len(ctx.coordinator.expire(view, first_write=lambda txn, where: _first_write_ms(ctx, txn, where, scanned)))
    return n


def _first_write_ms(
    ctx: LogContext, txn: TxnId, participants: tuple[str, ...], scanned: dict[str, PartitionState | None]
) -> int | None:
    """The earliest first entry of ``txn`` among ``participants`` that are partition logs (topic
    partitions, group offsets), as their readers see it (the entry header's timestamp); None if none of
    them holds it ongoing. ``scanned``: the states this expiry run has brought to the log end (None: could
    not be read), so a path is scanned once per run. A participant that cannot be read now is skipped
    (logged): the next run tries again."""
    found: list[int] = []
    for path in participants:
        if paths.topic_partition_of(path) is None and not (path.startswith(paths.GROUPS) and path.endswith("/offsets")):
            continue  # an acknowledgement log: its readers time the transaction out
        if path not in scanned:
            try:
                fresh = ctx.partition_state(path)
                fresh.scan_to_end()
                scanned[path] = fresh
            except Exception as exc:  # one unreadable log must not stop the expiry of everything else
                expiry_logger.warning("%s: not read for expiry (%s); the next run tries again", path, exc)
                scanned[path] = None
        known = scanned[path]
        first = None
        if known is not None:
            try:
                first = known.first_write_ms(txn)
            except Exception as exc:
                expiry_logger.warning("%s: first write of %s not known (%s)", path, txn, exc)
        if first is not None:
            found.append(first)
    return min(found, default=None)
