"""The offsets fence: at most one transaction commits a consumer group's input from one start position
(PROTOCOL.md "Offsets fence"; Kafka's KIP-447 generation fencing, without a broker).

A transaction that sends offsets for group ``G`` with a start position ``S`` (topic-partition -> first
offset its input read) claims ``S`` by creating ``groups/<G>/claims/<h(S)>/<020d gen>``, after the group log
is registered (so the transaction id is known) and before ``prepare``. The claims of one ``S`` form a slot
log of generations; generation ``g + 1`` is created only after generation ``g`` was read and its
transaction found aborted. Hence of all transactions starting from ``S`` at most one commits, whatever
their transactional ids.

Crash windows: a claim whose transaction never reaches ``prepare`` names an ``Ongoing`` transaction that
is aborted by its id's next ``init_transactions`` or by anyone after its timeout
(:meth:`TransactionCoordinator.resolve`), which releases the claim; a claim create with an unknown outcome
is resolved by reading back its writer id (``create_resolving``).
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING

from txn_core.errors import GroupFencedError, ObjectNotFoundError
from txn_core.format import envelope, paths
from txn_core.format.ids import TopicPartition, TxnId
from txn_core.format.states import CoordinatorState

if TYPE_CHECKING:
    from txn_core.clients.context import SupportsContext

Position = Mapping[tuple[str, int] | TopicPartition, int]


def _rows(position: Position) -> list[list[object]]:
    rows: list[list[object]] = []
    for tp, offset in position.items():
        topic, partition = (tp.topic, tp.partition) if isinstance(tp, TopicPartition) else tp
        rows.append([str(topic), int(partition), int(offset)])
    rows.sort()
    return rows


def claims_prefix(group: str, start: Position) -> str:
    """``groups/<group>/claims/<first 32 hex digits of SHA-256 of the canonical start>/``."""
    canonical = json.dumps(_rows(start), separators=(",", ":")).encode()
    return f"{paths.GROUPS}{group}/claims/{hashlib.sha256(canonical).hexdigest()[:32]}/"


def _describe(start: Position, limit: int = 4) -> str:
    rows = _rows(start)
    text = ", ".join(f"{t}-{p}@{o}" for t, p, o in rows[:limit])
    return text + (f" (+{len(rows) - limit} more)" if len(rows) > limit else "")


def claim(
    log: SupportsContext,
    group: str,
    start: Position,
    end: Position,
    *,
    tid: str,
    producer_id: int,
    epoch: int,
    txn: TxnId,
) -> int:
    """Claim ``start`` for transaction ``txn`` of ``tid``; returns the generation won (-1: nothing to
    claim, the transaction consumed no input: ``end`` equals ``start``).

    Raises :class:`GroupFencedError` if another transaction from ``start`` committed, is still open, or
    may have committed (its outcome is no longer kept). Costs one create when uncontended.
    """
    ctx = log.context
    if _rows(start) == _rows(end):
        return -1  # no input: committing offsets equal to the start commits nothing twice (no claim)
    prefix = claims_prefix(group, start)
    value = {
        "group": group,
        "start": _rows(start),
        "end": _rows(end),
        "tid": tid,
        "producer_id": producer_id,
        "epoch": epoch,
        "txn": str(txn),
        "ts": ctx.clock(),
    }
    gen = 0
    while True:
        key = prefix + paths.slot_name(gen)
        if envelope.create_json(ctx.storage, key, envelope.ObjectKind.OFFSETS_CLAIM, value):
            return gen
        try:
            held = envelope.read_json(ctx.storage, key, envelope.ObjectKind.OFFSETS_CLAIM)
        except ObjectNotFoundError:  # pragma: no cover - claims are never deleted
            continue
        if held.get("txn") == str(txn) and held.get("tid") == tid:
            return gen  # this transaction's own claim (a retried call)
        other = TxnId.parse(str(held.get("txn")))
        written = held.get("ts")  # after its transaction's first write: where a begun-ahead one's timeout runs from
        status = ctx.coordinator.resolve(other, functools.partial(int, written) if isinstance(written, int) else None)
        if status.state in (CoordinatorState.PREPARE_ABORT, CoordinatorState.COMPLETE_ABORT):
            gen += 1  # released: its transaction aborted
            continue
        if status.state == CoordinatorState.ONGOING:
            how = (
                f"is held by open transaction {other} of transactional id {held.get('tid')!r}; if that "
                "writer is gone, the claim is released when its transaction is aborted (at its timeout, or "
                "at once with `txnlog transactions abort`)"
            )
        else:
            how = (
                f"was already committed by transaction {other} of transactional id {held.get('tid')!r}"
                if status.committed
                else f"was taken by transaction {other} of transactional id {held.get('tid')!r}, whose outcome "
                "is no longer kept (treated as committed)"
            )
        raise GroupFencedError(
            f"consumer group {group!r}: the input starting at {_describe(start)} {how}. Another writer "
            f"(a second query, or a zombie driver) consumes this group; this transaction commits nothing. Stop "
            f"the other writer, or give each query its own consumer group; to continue where the group is, "
            "restart from the group's committed offsets (Spark: a new checkpoint with startingOffsets=group).",
            group,
        )
