"""The effect of one transaction-log action on a transactional id's state (PROTOCOL.md "Transaction log").

:func:`apply` is the one transition function: a writer computes the state a record will produce with it
before creating the record (and persists nothing if it raises), and replay folds the records of a
coordinator partition through it (where an error means a corrupt log). It validates the transition
against the state machine (``states.py``), the producer id and epoch (fencing), and the transaction id.

**Begin ahead** (PROTOCOL.md "Begin ahead"): a ``begin`` with ``ahead`` in the record that decides the
id's current transaction reserves the next one beside it (:class:`~txn_core.coordinator.tidstate.Ahead`);
the first action naming it (``add``, ``prepare``) makes it the current transaction (:meth:`TidState.activated`:
Ongoing, no start, the decided one completing if it is not complete), and a ``withdraw`` drops it unused. A
``prepare`` naming ``participants`` narrows them to those its producer wrote to.

Epochs (KIP-890): every transaction runs at a fresh epoch. ``complete`` of the current transaction bumps
the epoch, and the next ``begin`` uses it; a ``begin`` written while the previous transaction is still
Prepare* (its markers landing) carries that bumped epoch itself, and the previous transaction becomes the
id's :class:`~txn_core.coordinator.tidstate.Completing` one, whose later ``complete`` changes no epoch.
"""

from __future__ import annotations

from dataclasses import replace

from txn_core.coordinator.actions import Action, Add, Begin, Complete, Init, Prepare, Withdraw
from txn_core.coordinator.tidstate import Ahead, Completing, TidState
from txn_core.errors import InvalidTxnStateError, ProducerFencedError, TransactionTimedOutError
from txn_core.format.ids import TxnId
from txn_core.format.states import CoordinatorState, check_coordinator_transition

_C = CoordinatorState

#: One action's transition, as folding a record yields it: (transactional id, state before, state after).
Step = tuple[str, TidState | None, TidState]


def apply(current: TidState | None, action: Action, coordinator: int, slot: int, ts: int) -> TidState:
    """The state after ``action`` (in the record at ``slot``, written at ``ts``: a begin's transaction is
    ``(coordinator, slot, action.index)``); raises a named error if the action is not valid now."""
    if isinstance(action, Init):
        return _init(current, action, ts)
    if current is None:
        raise InvalidTxnStateError(
            f"transactional id {action.tid!r} has no producer: call init_transactions() first",
            transactional_id=action.tid,
        )
    if isinstance(action, Begin):
        txn = TxnId(coordinator, slot, action.index or 0)
        return _begin_ahead(current, action, txn, ts) if action.ahead else _begin(current, action, txn, ts)
    if isinstance(action, Withdraw):
        return _withdraw(current, action)
    if isinstance(action, (Add, Prepare)) and current.ahead is not None and action.txn == current.ahead.txn:
        current = current.activated(ts)  # named by a record: the transaction begun ahead is the current one
    if isinstance(action, Add):
        _check_producer(current, action.producer_id, action.epoch, current.epoch)
        _check_txn(current, action.txn)
        check_coordinator_transition(action.tid, current.state, _C.ONGOING)
        merged = tuple(dict.fromkeys((*current.participants, *action.participants)))
        return replace(current, participants=merged, updated_ms=ts)
    if isinstance(action, Prepare):
        _check_producer(current, action.producer_id, action.epoch, current.epoch)
        _check_txn(current, action.txn)
        return _prepare(current, action, ts)
    if isinstance(action, Complete):
        return _complete(current, action)
    raise InvalidTxnStateError(f"unknown transaction log action {action!r}")  # pragma: no cover


def _init(current: TidState | None, action: Init, ts: int) -> TidState:
    if current is not None and current.ahead is not None:
        raise InvalidTxnStateError(
            f"transactional id {action.tid!r}: transaction {current.ahead.txn} was begun ahead and may hold data: "
            "abort it before a new producer instance starts",
            transactional_id=action.tid,
        )
    check_coordinator_transition(action.tid, current.state if current else None, _C.EMPTY)
    if current is not None and current.completing is not None:  # pragma: no cover - Empty/Complete* has none
        raise InvalidTxnStateError(
            f"transactional id {action.tid!r}: transaction {current.completing.txn} is not complete yet",
            transactional_id=action.tid,
        )
    return TidState(
        action.tid,
        action.producer_id,
        action.epoch,
        _C.EMPTY,
        action.timeout_ms,
        None,
        0,
        ts,
        (),
        None,
        current.last_committed if current else None,
        None,
    )


def _begin(current: TidState, action: Begin, txn: TxnId, ts: int) -> TidState:
    prepared = current.state.is_prepared
    # From Prepare* the begin carries the epoch the previous transaction's Complete would have bumped to.
    _check_producer(current, action.producer_id, action.epoch, current.epoch + 1 if prepared else current.epoch)
    if current.ahead is not None:  # its own producer: a fenced one failed above
        raise InvalidTxnStateError(
            f"transactional id {action.tid!r}: transaction {current.ahead.txn} was begun ahead; it is the next "
            "transaction (or withdraw it first)",
            transactional_id=action.tid,
        )
    if current.state == _C.ONGOING:
        raise InvalidTxnStateError(
            f"transactional id {action.tid!r}: transaction {current.txn} is already ongoing; end it before "
            "beginning another",
            transactional_id=action.tid,
            current=current.state.value,
            target=_C.ONGOING.value,
        )
    check_coordinator_transition(action.tid, current.state, _C.ONGOING)
    completing = current.completing
    if prepared:
        if completing is not None or current.txn is None:
            raise InvalidTxnStateError(
                f"transactional id {action.tid!r}: transaction {completing.txn if completing else None} must "
                f"complete before a transaction begins after {current.txn}",
                transactional_id=action.tid,
                current=current.state.value,
                target=_C.ONGOING.value,
            )
        completing = Completing(
            current.txn,
            current.state == _C.PREPARE_COMMIT,
            current.epoch,
            current.participants,
            current.updated_ms,
        )
    return replace(
        current,
        state=_C.ONGOING,
        epoch=action.epoch,
        txn=txn,
        start_ms=ts,
        updated_ms=ts,
        timeout_ms=action.timeout_ms,
        participants=tuple(dict.fromkeys(action.participants)),
        metadata=None,
        abort_reason=None,
        completing=completing,
    )


def _begin_ahead(current: TidState, action: Begin, txn: TxnId, ts: int) -> TidState:
    """Reserve the next transaction beside the decided current one. Valid only with nothing completing (the
    current one becomes the completing one when this one is named) and nothing begun ahead already."""
    prepared = current.state.is_prepared
    _check_producer(current, action.producer_id, action.epoch, current.epoch + 1 if prepared else current.epoch)
    if not (prepared or current.state.is_complete) or current.txn is None:
        raise InvalidTxnStateError(
            f"transactional id {action.tid!r}: a transaction is begun ahead only beside a decided one (state "
            f"{current.state.value})",
            transactional_id=action.tid,
            current=current.state.value,
        )
    other = current.completing or current.ahead
    if other is not None:
        raise InvalidTxnStateError(
            f"transactional id {action.tid!r}: transaction {other.txn} is still open beside {current.txn}; nothing "
            "more can be begun ahead",
            transactional_id=action.tid,
            current=current.state.value,
        )
    ahead = Ahead(txn, action.epoch, action.timeout_ms, tuple(dict.fromkeys(action.participants)), ts)
    return replace(current, ahead=ahead)


def _withdraw(current: TidState, action: Withdraw) -> TidState:
    """Drop the unused transaction begun ahead: the id's state is its decided transaction's again."""
    a = current.ahead
    if a is None or a.txn != action.txn:
        raise InvalidTxnStateError(
            f"transactional id {action.tid!r}: transaction {action.txn} is not begun ahead (current "
            f"{current.txn}, {current.state.value}); nothing to withdraw",
            transactional_id=action.tid,
            current=current.state.value,
        )
    _check_producer(replace(current, epoch=a.epoch), action.producer_id, action.epoch, a.epoch)
    return replace(current, ahead=None)


def _prepare(current: TidState, action: Prepare, ts: int) -> TidState:
    target = _C.PREPARE_COMMIT if action.commit else _C.PREPARE_ABORT
    if current.state.is_prepared and current.state != target:
        raise InvalidTxnStateError(
            f"transactional id {action.tid!r}: transaction {current.txn} is already {current.state.value}"
            + (f" ({current.abort_reason})" if current.abort_reason else "")
            + f"; it cannot move to {target.value}",
            transactional_id=action.tid,
            current=current.state.value,
            target=target.value,
        )
    check_coordinator_transition(action.tid, current.state, target)
    if current.state == target:
        return current
    participants = current.participants
    if action.participants is not None:
        extra = [p for p in action.participants if p not in participants]
        if extra:
            raise InvalidTxnStateError(
                f"transactional id {action.tid!r}: transaction {current.txn} wrote to {extra[0]!r}, which it never "
                "registered as a participant",
                transactional_id=action.tid,
            )
        participants = tuple(dict.fromkeys(action.participants))
    committed = target == _C.PREPARE_COMMIT
    return replace(
        current,
        state=target,
        participants=participants,
        epoch=current.epoch if action.new_epoch is None else action.new_epoch,
        updated_ms=ts,
        metadata=action.metadata,
        last_committed=action.metadata if committed and action.metadata is not None else current.last_committed,
        abort_reason=None if committed else action.reason,
    )


def _complete(current: TidState, action: Complete) -> TidState:
    completing = current.completing
    if completing is not None and completing.txn == action.txn:
        return replace(current, completing=None)  # its begin-after already carries the bumped epoch
    _check_txn(current, action.txn)
    if completing is not None:
        raise InvalidTxnStateError(
            f"transactional id {action.tid!r}: transaction {completing.txn} must complete before {action.txn}",
            transactional_id=action.tid,
            current=current.state.value,
        )
    target = _C.COMPLETE_COMMIT if current.state == _C.PREPARE_COMMIT else _C.COMPLETE_ABORT
    check_coordinator_transition(action.tid, current.state, target)
    return replace(current, state=target, epoch=current.epoch + 1)


def _check_producer(current: TidState, producer_id: int, epoch: int, expected_epoch: int) -> None:
    """Fencing: the action's producer must be the id's current producer at ``expected_epoch``."""
    if producer_id == current.producer_id and epoch == expected_epoch:
        return
    if (
        current.abort_reason == "timeout"
        and current.txn is not None
        and producer_id == current.producer_id
        and epoch < current.epoch
    ):
        raise TransactionTimedOutError(
            f"transactional id {current.tid!r}: transaction {current.txn} exceeded its timeout of "
            f"{current.timeout_ms} ms and was aborted by another participant; this producer "
            f"(id {producer_id}, epoch {epoch}) is fenced. Create a new producer and call init_transactions().",
            transactional_id=current.tid,
            producer_id=producer_id,
            epoch=epoch,
            current_producer_id=current.producer_id,
            current_epoch=current.epoch,
        )
    raise ProducerFencedError(
        f"transactional id {current.tid!r}: producer id {producer_id} epoch {epoch} is fenced by producer id "
        f"{current.producer_id} epoch {current.epoch}. Another instance with the same transactional id "
        "called init_transactions(); close this producer.",
        transactional_id=current.tid,
        producer_id=producer_id,
        epoch=epoch,
        current_producer_id=current.producer_id,
        current_epoch=current.epoch,
    )


def _check_txn(current: TidState, txn: TxnId) -> None:
    if current.txn is not None and current.txn != txn:
        raise InvalidTxnStateError(
            f"transactional id {current.tid!r}: request for transaction {txn} but the current one "
            f"is {current.txn} ({current.state.value})",
            transactional_id=current.tid,
            current=current.state.value,
        )
