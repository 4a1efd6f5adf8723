"""The offsets fence: at most one transaction commits a consumer group's input from one start position
(PROTOCOL.md "Offsets fence"; Kafka's KIP-447 generation fencing, without a broker).

A transaction that sends offsets for group ``G`` with a start position ``S`` (topic-partition -> first
offset its input read) claims the start of each partition it consumed, ``(tp, S[tp])``, by creating
``groups/<G>/claims/<h(tp, S[tp])>/<020d gen>`` (all at once), after the group log is registered (so the
transaction id is known) and before ``prepare``. The claims of one partition's start form a slot log of
generations; generation ``g + 1`` is created only after generation ``g`` was read and its transaction found
aborted. Hence of all transactions whose input in a partition starts at the same offset at most one
commits, whatever their transactional ids and whatever other partitions they read: two writers whose
assignments overlap are fenced on the partitions they share. A transaction that loses any of its claims
commits nothing, and its aborted transaction releases the claims it won.

Crash windows: a claim whose transaction never reaches ``prepare`` names an ``Ongoing`` transaction that
is aborted by its id's next ``init_transactions`` or by anyone after its timeout
(:meth:`TransactionCoordinator.resolve`), which releases the claim; a claim create with an unknown outcome
is resolved by reading back its writer id (``create_resolving``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING

from txn_core import envelope, paths
from txn_core.coordinator.states import CoordinatorState
from txn_core.errors import GroupFencedError, ObjectNotFoundError
from txn_core.ids import TopicPartition, TxnId
from txn_core.parallel import parallel_map

if TYPE_CHECKING:
    from txn_core.log import Log

Position = Mapping[tuple[str, int] | TopicPartition, int]


def _triples(position: Position) -> list[tuple[str, int, int]]:
    """``position`` as sorted ``(topic, partition, offset)``."""
    rows: list[tuple[str, int, int]] = []
    for tp, offset in position.items():
        topic, partition = (tp.topic, tp.partition) if isinstance(tp, TopicPartition) else tp
        rows.append((str(topic), int(partition), int(offset)))
    rows.sort()
    return rows


def _rows(position: Position) -> list[list[object]]:
    return [list(row) for row in _triples(position)]


def claims_prefix(group: str, start: Position) -> str:
    """``groups/<group>/claims/<first 32 hex digits of SHA-256 of the canonical start>/``: the claims of one
    partition's start when ``start`` names one partition (as every claim does)."""
    canonical = json.dumps(_rows(start), separators=(",", ":")).encode()
    return f"{paths.GROUPS}{group}/claims/{hashlib.sha256(canonical).hexdigest()[:32]}/"


def claim(
    log: Log, group: str, start: Position, end: Position, *, tid: str, producer_id: int, epoch: int, txn: TxnId
) -> int:
    """Claim each partition's start in ``start`` for transaction ``txn`` of ``tid``: one claim per partition
    whose input this transaction consumed (its offset in ``end`` differs), all created at once; returns the
    highest generation won (-1: nothing to claim, the transaction consumed no input).

    Raises :class:`GroupFencedError` if another transaction from one of these starts committed, is still
    open, or may have committed (its outcome is no longer kept). Costs one round of creates when uncontended.
    """
    ends = {(t, p): o for t, p, o in _triples(end)}
    consumed = [(t, p, o) for t, p, o in _triples(start) if ends.get((t, p), o) != o]
    if not consumed:
        return -1  # no input: committing offsets equal to the start commits nothing twice (no claim)
    value = {
        "group": group,
        "start": _rows(start),
        "end": _rows(end),
        "tid": tid,
        "producer_id": producer_id,
        "epoch": epoch,
        "txn": str(txn),
    }

    def first(row: tuple[str, int, int]) -> bool:  # generation 0, for every partition at once
        key = claims_prefix(group, {(row[0], row[1]): row[2]}) + paths.slot_name(0)
        return envelope.create_json(
            log.storage, key, envelope.ObjectKind.OFFSETS_CLAIM, {**value, "partition": list(row)}
        )

    won = parallel_map(first, consumed, leaf=True)
    gens = [0 if ok else _claim_from(log, group, row, value, txn, tid) for row, ok in zip(consumed, won, strict=True)]
    return max(gens)


def _claim_from(log: Log, group: str, row: tuple[str, int, int], value: dict[str, object], txn: TxnId, tid: str) -> int:
    """Claim one partition's start whose generation 0 is taken: the generation won, or GroupFencedError."""
    topic, partition, offset = row
    prefix = claims_prefix(group, {(topic, partition): offset})
    value = {**value, "partition": list(row)}
    gen = 0
    while True:
        key = prefix + paths.slot_name(gen)
        if envelope.create_json(log.storage, key, envelope.ObjectKind.OFFSETS_CLAIM, value):
            return gen
        try:
            held = envelope.read_json(log.storage, key, envelope.ObjectKind.OFFSETS_CLAIM)
        except ObjectNotFoundError:  # pragma: no cover - claims are never deleted
            continue
        if held.get("txn") == str(txn) and held.get("tid") == tid:
            return gen  # this transaction's own claim (a retried call)
        other = TxnId.parse(str(held.get("txn")))
        status = log.coordinator.resolve(other)
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
            f"consumer group {group!r}: the input starting at {topic}-{partition}@{offset} {how}. Another writer "
            f"(a second query, or a zombie driver) consumes this group; this transaction commits nothing. Stop "
            f"the other writer, or give each query its own consumer group; to continue where the group is, "
            "restart from the group's committed offsets (Spark: a new checkpoint with startingOffsets=group).",
            group,
        )
