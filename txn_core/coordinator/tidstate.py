"""The coordinator's state of one transactional id, and what readers learn of one transaction.

:class:`TidState` is Kafka's TransactionMetadata: producer id and epoch, the state of the id's current
transaction, its participants, and the last committed metadata. A transactional id has at most **two**
transactions that are not complete: its current one, and at most one earlier, decided transaction whose
markers may still be landing (:class:`Completing`), because the next transaction may begin before the
previous one's Complete record (PROTOCOL.md "Transactions", the two-phase end). Both are values: every
change makes a new state (see :mod:`txn_core.coordinator.apply`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from txn_core.format.ids import TxnId
from txn_core.format.states import CoordinatorState

_C = CoordinatorState


@dataclass(frozen=True, slots=True)
class Completing:
    """A decided transaction of a transactional id that has begun its next one before this one's Complete
    record. Its markers may still be landing; readers treat it as decided (PROTOCOL.md "Read bound")."""

    txn: TxnId
    committed: bool
    #: the epoch the transaction ran at (its markers carry it)
    epoch: int
    participants: tuple[str, ...]
    #: when it was decided (the Prepare record's time): the completion grace counts from here
    decided_ms: int

    @property
    def state(self) -> CoordinatorState:
        return _C.PREPARE_COMMIT if self.committed else _C.PREPARE_ABORT

    def to_json(self) -> dict[str, Any]:
        return {
            "txn": str(self.txn),
            "committed": self.committed,
            "epoch": self.epoch,
            "participants": list(self.participants),
            "decided_ms": self.decided_ms,
        }

    @classmethod
    def from_json(cls, v: dict[str, Any]) -> Completing:
        return cls(
            TxnId.parse(v["txn"]),
            bool(v["committed"]),
            int(v["epoch"]),
            tuple(v["participants"]),
            int(v["decided_ms"]),
        )


@dataclass(frozen=True, slots=True)
class Ahead:
    """The next transaction of a transactional id, begun ahead by the record that decided its current one
    (PROTOCOL.md "Begin ahead"). It becomes the id's current transaction when a record names it (an ``add``
    or its ``prepare``: :meth:`TidState.activated`); until then the id's state is its decided one's. Whether
    its producer has written under it only the participants' data tells: its timeout runs from its first
    write."""

    txn: TxnId
    #: the epoch it runs at (the decided one's plus one)
    epoch: int
    timeout_ms: int
    participants: tuple[str, ...]
    #: when the record that began it was written (an unused one is aborted after the id expiration)
    begun_ms: int

    def to_json(self) -> dict[str, Any]:
        return {
            "txn": str(self.txn),
            "epoch": self.epoch,
            "timeout_ms": self.timeout_ms,
            "participants": list(self.participants),
            "begun_ms": self.begun_ms,
        }

    @classmethod
    def from_json(cls, v: dict[str, Any]) -> Ahead:
        return cls(
            TxnId.parse(v["txn"]),
            int(v["epoch"]),
            int(v["timeout_ms"]),
            tuple(v["participants"]),
            int(v["begun_ms"]),
        )


@dataclass(frozen=True, slots=True)
class TidState:
    """The coordinator's record of one transactional id (Kafka's TransactionMetadata).

    Invariants (checked by :meth:`check`): ``completing`` is set only while the current transaction is
    Ongoing or Prepare* and is an earlier transaction; a Complete* or Empty id has nothing completing.

    ``ahead``, the next transaction begun ahead, is set only while the current one is decided (Prepare* or
    Complete*) and nothing is completing. ``start_ms`` is None for a transaction begun ahead once current
    (:meth:`activated`): its timeout runs from its first write, which only its data tells (each entry's
    timestamp), so :attr:`deadline_ms` is None.
    """

    tid: str
    producer_id: int
    epoch: int
    state: CoordinatorState
    timeout_ms: int
    txn: TxnId | None = None
    start_ms: int | None = 0
    updated_ms: int = 0
    participants: tuple[str, ...] = ()
    metadata: dict[str, Any] | None = None
    last_committed: dict[str, Any] | None = None
    abort_reason: str | None = None
    completing: Completing | None = None
    ahead: Ahead | None = None

    def to_json(self) -> dict[str, Any]:
        out = {
            "tid": self.tid,
            "producer_id": self.producer_id,
            "epoch": self.epoch,
            "state": self.state.value,
            "timeout_ms": self.timeout_ms,
            "txn": str(self.txn) if self.txn else None,
            "start_ms": self.start_ms,
            "updated_ms": self.updated_ms,
            "participants": list(self.participants),
            "metadata": self.metadata,
            "last_committed": self.last_committed,
            "abort_reason": self.abort_reason,
        }
        if self.completing is not None:
            out["completing"] = self.completing.to_json()
        if self.ahead is not None:
            out["ahead"] = self.ahead.to_json()
        return out

    @classmethod
    def from_json(cls, v: dict[str, Any]) -> TidState:
        completing = v.get("completing")
        ahead = v.get("ahead")
        return cls(
            v["tid"],
            int(v["producer_id"]),
            int(v["epoch"]),
            CoordinatorState(v["state"]),
            int(v["timeout_ms"]),
            TxnId.parse(v["txn"]) if v.get("txn") else None,
            None if "start_ms" in v and v["start_ms"] is None else int(v.get("start_ms", 0)),
            int(v.get("updated_ms", 0)),
            tuple(v.get("participants", ())),
            v.get("metadata"),
            v.get("last_committed"),
            v.get("abort_reason"),
            Completing.from_json(completing) if completing else None,
            Ahead.from_json(ahead) if ahead else None,
        )

    @property
    def deadline_ms(self) -> int | None:
        """When the current transaction times out; None if it was begun ahead and its start is unknown here."""
        return None if self.start_ms is None else self.start_ms + self.timeout_ms

    @property
    def begun_ahead(self) -> bool:
        """The current transaction is Ongoing and was begun ahead: its timeout runs from its first write."""
        return self.state == _C.ONGOING and self.start_ms is None

    def open_txns(self) -> list[TxnId]:
        """The id's transactions that are not complete, oldest first (at most two, or the current one and
        the one begun ahead)."""
        out = [self.completing.txn] if self.completing is not None else []
        if self.txn is not None and not self.state.is_complete:
            out.append(self.txn)
        if self.ahead is not None:
            out.append(self.ahead.txn)
        return out

    def seen_by(self, txn: TxnId | None) -> TidState:
        """The state as a request naming ``txn`` meets it: :meth:`activated` if ``txn`` is the transaction begun
        ahead (a record naming it makes it current), else the state itself."""
        if self.ahead is not None and txn is not None and self.ahead.txn == txn:
            return self.activated()
        return self

    def activated(self, ts: int | None = None) -> TidState:
        """The state once the transaction begun ahead is the current one (a record names it, at ``ts``): Ongoing
        at its epoch with its participants and no start (its timeout runs from its first write); the decided
        transaction before it becomes the completing one if it is not complete. The state itself if there is
        none begun ahead."""
        a = self.ahead
        if a is None:
            return self
        completing = (
            Completing(self.txn, self.state == _C.PREPARE_COMMIT, self.epoch, self.participants, self.updated_ms)
            if self.txn is not None and self.state.is_prepared
            else None
        )
        return replace(
            self,
            state=_C.ONGOING,
            epoch=a.epoch,
            txn=a.txn,
            start_ms=None,
            updated_ms=a.begun_ms if ts is None else ts,
            timeout_ms=a.timeout_ms,
            participants=a.participants,
            metadata=None,
            abort_reason=None,
            completing=completing,
            ahead=None,
        )

    def prepared(self, txn: TxnId) -> TidState | None:
        """The state as seen by whoever completes the decided transaction ``txn`` (the current one or the
        completing one): its state, epoch and participants; None if ``txn`` is not decided and incomplete."""
        if self.txn == txn and self.state.is_prepared:
            return self
        c = self.completing
        if c is None or c.txn != txn:
            return None
        return replace(
            self,
            txn=c.txn,
            state=c.state,
            epoch=c.epoch,
            participants=c.participants,
            updated_ms=c.decided_ms,
            completing=None,
        )

    def check(self) -> None:
        """Assert the invariants (tests call it after every step of the randomised model test)."""
        a = self.ahead
        if a is not None:
            assert self.txn is not None and self.completing is None, self
            assert self.state in (_C.PREPARE_COMMIT, _C.PREPARE_ABORT, _C.COMPLETE_COMMIT, _C.COMPLETE_ABORT), self
            assert a.txn.coordinator == self.txn.coordinator and a.txn.sequence > self.txn.sequence, self
            assert a.epoch == (self.epoch + 1 if self.state.is_prepared else self.epoch), self
        c = self.completing
        if c is None:
            return
        assert self.txn is not None and self.state in (_C.ONGOING, _C.PREPARE_COMMIT, _C.PREPARE_ABORT), self
        assert c.txn.coordinator == self.txn.coordinator and c.txn.sequence < self.txn.sequence, self
        assert c.epoch < self.epoch, self
