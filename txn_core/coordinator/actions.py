"""Transaction-log records and their actions, as typed values (PROTOCOL.md "Transaction log").

A coordinator partition is a slot log of **records**; a record is a timestamp and a list of actions, each
naming its transactional id, applied atomically in order (a producer's record carries its own actions; a
group-committed record carries several producers'). Each action kind is a frozen dataclass whose fields are the
JSON fields of PROTOCOL.md's action table (``tests/test_protocol_tables.py`` checks the two against each
other); ``kind`` is the JSON discriminator (``"action"``). :func:`action_from_json` is the only parser and
``to_json`` the only writer, so a misspelled field is a type error, never a silent ``None``.

Example record (``Record.to_json``)::

    {"ts": 1795258451153, "actions": [
        {"action": "complete", "tid": "copier", "txn": "11:3"},
        {"action": "prepare", "tid": "copier", "producer_id": 7, "epoch": 4, "txn": "11:5",
         "outcome": "COMMIT", "participants": ["topics/orders/00000"]},
        {"action": "begin", "tid": "copier", "producer_id": 7, "epoch": 5, "timeout_ms": 60000,
         "participants": ["topics/orders/00000"], "ahead": true}]}

The effect of each action on a transactional id's state is :func:`txn_core.coordinator.apply.apply`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from txn_core.errors import CorruptDataError
from txn_core.format.ids import MAX_BEGINS_PER_RECORD, TxnId

Outcome = Literal["COMMIT", "ABORT"]


@dataclass(frozen=True, slots=True)
class Init:
    """A new producer id or epoch for the id (``init_transactions``): -> Empty."""

    kind: ClassVar[str] = "init"
    tid: str
    producer_id: int
    epoch: int
    timeout_ms: int

    def to_json(self) -> dict[str, Any]:
        return {
            "action": self.kind,
            "tid": self.tid,
            "producer_id": self.producer_id,
            "epoch": self.epoch,
            "timeout_ms": self.timeout_ms,
        }


@dataclass(frozen=True, slots=True)
class Begin:
    """A transaction starts with its first participants: -> Ongoing. Its TxnId is (coordinator, slot, index):
    ``index`` is the begin's place among its record's begins, given by the writer that builds the record
    (absent for the first, which is index 0; records written before ids had an index carry none, and their begins
    share the id (coordinator, slot), as they were written).

    ``ahead`` (true or absent): begun by its producer ahead of need, in the record that decides its current
    transaction (PROTOCOL.md "Begin ahead"): it waits beside the decided one until a record names it, and its
    timeout runs from its first write, so an idle producer's next transaction never times out unused."""

    kind: ClassVar[str] = "begin"
    tid: str
    producer_id: int
    epoch: int
    timeout_ms: int
    participants: tuple[str, ...] = ()
    ahead: bool | None = None
    index: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "action": self.kind,
            "tid": self.tid,
            "producer_id": self.producer_id,
            "epoch": self.epoch,
            "timeout_ms": self.timeout_ms,
            "participants": list(self.participants),
        }
        if self.ahead:
            out["ahead"] = True
        if self.index is not None:
            out["index"] = self.index
        return out


@dataclass(frozen=True, slots=True)
class Add:
    """Participants (log paths) added to the ongoing transaction ``txn``."""

    kind: ClassVar[str] = "add"
    tid: str
    producer_id: int
    epoch: int
    txn: TxnId
    participants: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "action": self.kind,
            "tid": self.tid,
            "producer_id": self.producer_id,
            "epoch": self.epoch,
            "txn": str(self.txn),
            "participants": list(self.participants),
        }


@dataclass(frozen=True, slots=True)
class Prepare:
    """The decision on ``txn``: -> PrepareCommit / PrepareAbort. ``new_epoch`` fences the producer
    (timeouts, operator aborts, a new instance); ``metadata`` of a commit becomes ``last_committed``.
    ``participants``, set only by the transaction's own producer: the registered participants it wrote to
    (or tried to); the others get no marker (a transaction begun ahead registers a guess)."""

    kind: ClassVar[str] = "prepare"
    tid: str
    producer_id: int
    epoch: int
    txn: TxnId
    outcome: Outcome
    metadata: dict[str, Any] | None = None
    new_epoch: int | None = None
    reason: str | None = None
    participants: tuple[str, ...] | None = None

    @property
    def commit(self) -> bool:
        return self.outcome == "COMMIT"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "action": self.kind,
            "tid": self.tid,
            "producer_id": self.producer_id,
            "epoch": self.epoch,
            "txn": str(self.txn),
            "outcome": self.outcome,
        }
        if self.metadata is not None:
            out["metadata"] = self.metadata
        if self.new_epoch is not None:
            out["new_epoch"] = self.new_epoch
        if self.reason is not None:
            out["reason"] = self.reason
        if self.participants is not None:
            out["participants"] = list(self.participants)
        return out


@dataclass(frozen=True, slots=True)
class Complete:
    """Every participant of ``txn`` has its marker: -> CompleteCommit / CompleteAbort."""

    kind: ClassVar[str] = "complete"
    tid: str
    txn: TxnId

    def to_json(self) -> dict[str, Any]:
        return {"action": self.kind, "tid": self.tid, "txn": str(self.txn)}


@dataclass(frozen=True, slots=True)
class Withdraw:
    """The transaction ``txn`` begun ahead is dropped unused (its producer wrote nothing under it: a closing
    producer); the id's state is its decided transaction's again, as if it had never been begun."""

    kind: ClassVar[str] = "withdraw"
    tid: str
    producer_id: int
    epoch: int
    txn: TxnId

    def to_json(self) -> dict[str, Any]:
        return {
            "action": self.kind,
            "tid": self.tid,
            "producer_id": self.producer_id,
            "epoch": self.epoch,
            "txn": str(self.txn),
        }


Action = Init | Begin | Add | Prepare | Complete | Withdraw
#: Every action kind, by its JSON discriminator.
ACTION_TYPES: dict[str, type[Action]] = {t.kind: t for t in (Init, Begin, Add, Prepare, Complete, Withdraw)}


def action_from_json(value: dict[str, Any], where: str = "") -> Action:
    """The typed action of one JSON action object; :class:`CorruptDataError` (naming ``where``) if it is
    not a valid one."""
    try:
        kind = value["action"]
        tid = str(value["tid"])
        if kind == "init":
            return Init(tid, int(value["producer_id"]), int(value["epoch"]), int(value["timeout_ms"]))
        if kind == "begin":
            return Begin(
                tid,
                int(value["producer_id"]),
                int(value["epoch"]),
                int(value["timeout_ms"]),
                tuple(str(p) for p in value.get("participants", ())),
                _flag(value.get("ahead")),
                _begin_index(value.get("index")),
            )
        if kind == "add":
            return Add(
                tid,
                int(value["producer_id"]),
                int(value["epoch"]),
                TxnId.parse(value["txn"]),
                tuple(str(p) for p in value["participants"]),
            )
        if kind == "prepare":
            outcome = value["outcome"]
            if outcome not in ("COMMIT", "ABORT"):
                raise ValueError(f"outcome {outcome!r}")
            new_epoch = value.get("new_epoch")
            written = value.get("participants")
            return Prepare(
                tid,
                int(value["producer_id"]),
                int(value["epoch"]),
                TxnId.parse(value["txn"]),
                outcome,
                value.get("metadata"),
                None if new_epoch is None else int(new_epoch),
                value.get("reason"),
                None if written is None else tuple(str(p) for p in written),
            )
        if kind == "complete":
            return Complete(tid, TxnId.parse(value["txn"]))
        if kind == "withdraw":
            return Withdraw(tid, int(value["producer_id"]), int(value["epoch"]), TxnId.parse(value["txn"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptDataError(f"{where}: transaction log action {value!r} is not valid: {exc!r}", where) from exc
    raise CorruptDataError(f"{where}: unknown transaction log action {value.get('action')!r}", where)


def _begin_index(value: object) -> int | None:
    """A begin's index among its record's begins: absent (0), or an int in ``[1, MAX_BEGINS_PER_RECORD)``."""
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 < value < MAX_BEGINS_PER_RECORD:
        raise ValueError(f"begin index {value!r} is not an int in [1, {MAX_BEGINS_PER_RECORD})")
    return value


def _flag(value: object) -> bool | None:
    """An optional flag: true, or absent (None)."""
    if value is not None and value is not True:
        raise ValueError(f"expected true or nothing, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class Record:
    """One transaction-log record: actions, each naming its transactional id, applied atomically in order."""

    ts: int
    actions: tuple[Action, ...]

    def __post_init__(self) -> None:
        if not self.actions:
            raise ValueError("a transaction log record has at least one action")

    def to_json(self) -> dict[str, Any]:
        return {"ts": self.ts, "actions": [a.to_json() for a in self.actions]}

    @classmethod
    def from_json(cls, value: dict[str, Any], where: str = "") -> Record:
        try:
            ts = int(value["ts"])
            actions = value["actions"]
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptDataError(f"{where}: not a transaction log record: {exc!r}", where) from exc
        if not isinstance(actions, list) or not actions:
            raise CorruptDataError(f"{where}: a transaction log record without actions", where)
        return cls(ts, tuple(action_from_json(a, where) for a in actions))
