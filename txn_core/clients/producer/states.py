"""A producer's client state machine (PROTOCOL.md "State machines"): its state, the error that put it in an
error state, and the checks each call of the producer's API makes first.

Producer client states: Uninitialized -> Initializing -> Ready -> InTransaction -> CommittingTransaction /
AbortingTransaction -> Ready; AbortableError (must abort); FatalError (fenced: close); Closed. An idempotent
producer starts Ready and stays there until it closes.

Invariants:

* the state changes only through :meth:`ClientStateMachine.transition`, which checks the table of valid
  previous states in ``txn_core/format/states.py`` and raises :class:`InvalidTxnStateError` naming the
  transactional id and both states, errors and close included;
* an abortable error (:meth:`ClientStateMachine.abortable`) makes ``commit_transaction`` refuse and
  ``abort_transaction`` work; a fatal one (:meth:`ClientStateMachine.fatal`: fenced) makes every later
  call but ``close`` raise, with the error as its cause.

Crash windows: none, nothing here is durable; a new instance starts Uninitialized (transactional) or Ready.

Locking: none of its own. The state is changed by the thread holding the producer's lock
(``Producer._lock``), or by a pool thread of the Sender working for it while it waits (an overlapped begin
that finds the producer fenced, an offsets fence claim that is lost).
"""

from __future__ import annotations

from txn_core.clients.producer.sequences import ProducerSequences
from txn_core.errors import InvalidTxnStateError, ProducerClosedError, ProducerFencedError
from txn_core.format.ids import TxnId
from txn_core.format.states import ClientState, check_client_transition
from txn_core.logs import get_logger

_S = ClientState
logger = get_logger("txnlog.producer")


class ClientStateMachine:
    """The client state of one producer; see module doc."""

    def __init__(self, transactional_id: str | None, ids: ProducerSequences) -> None:
        self.transactional_id = transactional_id
        #: the producer id and epoch that fatal errors name
        self._ids = ids
        self.state = _S.UNINITIALIZED if transactional_id else _S.READY
        #: what put the producer in an error state (the cause of what later calls raise)
        self.error: BaseException | None = None

    def transition(self, target: ClientState) -> None:
        """The one way the client state changes (the table in ``states.py``)."""
        check_client_transition(self.transactional_id, self.state, target)
        self.state = target

    def fatal(self, exc: BaseException) -> None:
        """Fenced or failed for good: every later call but ``close`` raises."""
        self.error = exc
        logger.warning("producer %s: fatal error, close it: %s", self.transactional_id, exc)
        self.transition(_S.FATAL_ERROR)

    def abortable(self, exc: BaseException, txn: TxnId | None) -> None:
        """Transaction ``txn`` failed: ``commit_transaction`` refuses, ``abort_transaction`` works."""
        self.error = exc
        logger.info("producer %s: transaction %s must be aborted: %s", self.transactional_id, txn, exc)
        self.transition(_S.ABORTABLE_ERROR)

    def require_open(self) -> None:
        if self.state == _S.CLOSED:
            raise ProducerClosedError(f"producer {self.transactional_id or self._ids.producer_id} is closed")
        if self.state == _S.FATAL_ERROR:
            raise ProducerFencedError(
                f"producer {self.transactional_id!r} is in a fatal state ({self.error}); close it and create a new one",
                transactional_id=self.transactional_id,
                producer_id=self._ids.producer_id,
                epoch=self._ids.epoch,
            ) from self.error

    def require_transactional(self, what: str) -> None:
        if self.transactional_id is None:
            raise InvalidTxnStateError(f"{what}() needs a transactional producer: Log.producer(transactional_id='...')")

    def require_in_transaction(self, what: str) -> None:
        if self.transactional_id is not None and self.state != _S.IN_TRANSACTION:
            if self.state == _S.UNINITIALIZED:
                raise InvalidTxnStateError(
                    f"transactional id {self.transactional_id!r}: call init_transactions() before {what}()",
                    transactional_id=self.transactional_id,
                    current=self.state.value,
                )
            raise InvalidTxnStateError(
                f"transactional id {self.transactional_id!r}: {what}() needs an open transaction "
                f"(state {self.state.value}); call begin_transaction() first",
                transactional_id=self.transactional_id,
                current=self.state.value,
            )

    def require_not_failed(self) -> None:
        """``commit_transaction`` of a transaction that failed (an abortable error) is refused."""
        if self.state == _S.ABORTABLE_ERROR:
            raise InvalidTxnStateError(
                f"transactional id {self.transactional_id!r}: the transaction failed ({self.error}); "
                "call abort_transaction()",
                transactional_id=self.transactional_id,
                current=self.state.value,
            ) from self.error
