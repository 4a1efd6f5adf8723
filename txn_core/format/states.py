"""Transaction state machines as data (PROTOCOL.md "State machines").

Two tables of valid previous states: one for the coordinator's view of a transactional id, one for the
producer client. Every transition goes through :func:`check_coordinator_transition` or
:func:`check_client_transition`, which raise :class:`InvalidTxnStateError` naming the transactional id
and both states. Self-transitions that retries produce (Ongoing -> Ongoing when adding partitions,
Prepare* -> Prepare* on a repeated end request) are allowed.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from txn_core.errors import InvalidTxnStateError
from txn_core.format.ids import TxnId


class CoordinatorState(enum.Enum):
    """Kafka's TransactionState, per transactional id, as recorded in the transaction log."""

    EMPTY = "Empty"
    ONGOING = "Ongoing"
    PREPARE_COMMIT = "PrepareCommit"
    PREPARE_ABORT = "PrepareAbort"
    COMPLETE_COMMIT = "CompleteCommit"
    COMPLETE_ABORT = "CompleteAbort"
    DEAD = "Dead"

    @property
    def is_prepared(self) -> bool:
        return self in (CoordinatorState.PREPARE_COMMIT, CoordinatorState.PREPARE_ABORT)

    @property
    def is_complete(self) -> bool:
        return self in (
            CoordinatorState.COMPLETE_COMMIT,
            CoordinatorState.COMPLETE_ABORT,
            CoordinatorState.EMPTY,
            CoordinatorState.DEAD,
        )


_C = CoordinatorState
#: to-state -> the states it may be entered from. ``None`` stands for "no state yet" (new id).
COORDINATOR_TRANSITIONS: dict[CoordinatorState, frozenset[CoordinatorState | None]] = {
    _C.EMPTY: frozenset({None, _C.EMPTY, _C.COMPLETE_COMMIT, _C.COMPLETE_ABORT, _C.DEAD}),
    # from Prepare*: the next transaction begins before the previous one's Complete (it moves to completing)
    _C.ONGOING: frozenset(
        {_C.ONGOING, _C.EMPTY, _C.COMPLETE_COMMIT, _C.COMPLETE_ABORT, _C.PREPARE_COMMIT, _C.PREPARE_ABORT}
    ),
    _C.PREPARE_COMMIT: frozenset({_C.ONGOING, _C.PREPARE_COMMIT}),
    _C.PREPARE_ABORT: frozenset({_C.ONGOING, _C.PREPARE_ABORT}),
    _C.COMPLETE_COMMIT: frozenset({_C.PREPARE_COMMIT}),
    _C.COMPLETE_ABORT: frozenset({_C.PREPARE_ABORT}),
    _C.DEAD: frozenset({_C.EMPTY, _C.COMPLETE_COMMIT, _C.COMPLETE_ABORT}),
}


def check_coordinator_transition(tid: str, current: CoordinatorState | None, target: CoordinatorState) -> None:
    if current not in COORDINATOR_TRANSITIONS[target]:
        raise InvalidTxnStateError(
            f"transactional id {tid!r}: invalid coordinator transition "
            f"{current.value if current else '(none)'} -> {target.value}",
            transactional_id=tid,
            current=current.value if current else None,
            target=target.value,
        )


class ClientState(enum.Enum):
    """The producer's transaction manager states (kafka-python's TransactionManager)."""

    UNINITIALIZED = "Uninitialized"
    INITIALIZING = "Initializing"
    READY = "Ready"
    IN_TRANSACTION = "InTransaction"
    COMMITTING = "CommittingTransaction"
    ABORTING = "AbortingTransaction"
    ABORTABLE_ERROR = "AbortableError"
    FATAL_ERROR = "FatalError"
    CLOSED = "Closed"


_S = ClientState
CLIENT_TRANSITIONS: dict[ClientState, frozenset[ClientState]] = {
    _S.UNINITIALIZED: frozenset(),
    _S.INITIALIZING: frozenset({_S.UNINITIALIZED, _S.INITIALIZING, _S.READY, _S.ABORTABLE_ERROR}),
    _S.READY: frozenset({_S.INITIALIZING, _S.COMMITTING, _S.ABORTING}),
    _S.IN_TRANSACTION: frozenset({_S.READY}),
    _S.COMMITTING: frozenset({_S.IN_TRANSACTION, _S.COMMITTING}),
    _S.ABORTING: frozenset({_S.IN_TRANSACTION, _S.ABORTABLE_ERROR, _S.ABORTING, _S.COMMITTING}),
    _S.ABORTABLE_ERROR: frozenset({_S.IN_TRANSACTION, _S.COMMITTING, _S.ABORTABLE_ERROR}),
    _S.FATAL_ERROR: frozenset(set(_S) - {_S.CLOSED}),
    _S.CLOSED: frozenset(set(_S)),
}


def check_client_transition(tid: str | None, current: ClientState, target: ClientState) -> None:
    if current not in CLIENT_TRANSITIONS[target]:
        hint = {
            _S.UNINITIALIZED: "call init_transactions() first",
            _S.READY: "call begin_transaction() first",
            _S.IN_TRANSACTION: "commit or abort the current transaction first",
            _S.FATAL_ERROR: "the producer is fenced or failed: close it and create a new one",
            _S.CLOSED: "the producer is closed",
            _S.ABORTABLE_ERROR: "the transaction failed: call abort_transaction()",
        }.get(current, "")
        raise InvalidTxnStateError(
            f"transactional id {tid!r}: invalid producer transition {current.value} -> {target.value}"
            + (f"; {hint}" if hint else ""),
            transactional_id=tid,
            current=current.value,
            target=target.value,
        )


@dataclass(frozen=True, slots=True)
class TxnStatus:
    """What a reader needs to know about one transaction."""

    txn: TxnId
    #: Ongoing, PrepareCommit, PrepareAbort, CompleteCommit, CompleteAbort; None when only "finished"
    #: is known (below the low watermark, outcome no longer kept: the partition's marker tells).
    state: CoordinatorState | None
    tid: str | None = None
    #: None for a transaction begun ahead: its timeout runs from its first write (the caller's data tells)
    start_ms: int | None = 0
    timeout_ms: int = 0
    #: participants of an open transaction (empty when only the final outcome is kept)
    participants: tuple[str, ...] = ()

    @property
    def committed(self) -> bool:
        return self.state in (CoordinatorState.PREPARE_COMMIT, CoordinatorState.COMPLETE_COMMIT)

    @property
    def aborted(self) -> bool:
        return self.state in (CoordinatorState.PREPARE_ABORT, CoordinatorState.COMPLETE_ABORT)

    @property
    def decided(self) -> bool:
        return self.committed or self.aborted

    @property
    def finished(self) -> bool:
        """Every participant has its marker."""
        return self.state in (CoordinatorState.COMPLETE_COMMIT, CoordinatorState.COMPLETE_ABORT) or self.state is None
