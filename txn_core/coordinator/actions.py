"""Transaction-log records and their actions, as typed values (PROTOCOL.md "Transaction log").

A coordinator partition is a slot log of **records**; a record is a timestamp and a list of actions, each
naming its transactional id, applied atomically in order (a producer's record carries its own actions; a
group-committed record carries several producers'). Each action kind is a frozen dataclass whose fields are the
JSON fields of PROTOCOL.md's action table (``tests/test_protocol_tables.py`` checks the two against each
other), each declared once with its codec (:mod:`txn_core.format.declared`): its JSON form, its parsing and
the dispatch on ``kind`` (the JSON discriminator ``"action"``) follow from the declaration, so a misspelled or
missing field is an error naming it, never a silent ``None``.

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
from txn_core.format.declared import ANY, FLAG, INT, STR, STRS, TXN, Declared, checked_int, jfield, one_of
from txn_core.format.ids import MAX_BEGINS_PER_RECORD, TxnId

Outcome = Literal["COMMIT", "ABORT"]


_INDEX = checked_int(lambda v: 0 < v < MAX_BEGINS_PER_RECORD, f"an int in [1, {MAX_BEGINS_PER_RECORD})")


class _Action(Declared):
    discriminator: ClassVar[str] = "action"


@dataclass(frozen=True, slots=True)
class Init(_Action):
    """A new producer id or epoch for the id (``init_transactions``): -> Empty."""

    kind: ClassVar[str] = "init"
    tid: str = jfield(STR)
    producer_id: int = jfield(INT)
    epoch: int = jfield(INT)
    timeout_ms: int = jfield(INT)


@dataclass(frozen=True, slots=True)
class Begin(_Action):
    """A transaction starts with its first participants: -> Ongoing. Its TxnId is (coordinator, slot, index):
    ``index`` is the begin's place among its record's begins, given by the writer that builds the record
    (absent for the first, which is index 0; records written before ids had an index carry none, and their begins
    share the id (coordinator, slot), as they were written).

    ``ahead`` (true or absent): begun by its producer ahead of need, in the record that decides its current
    transaction (PROTOCOL.md "Begin ahead"): it waits beside the decided one until a record names it, and its
    timeout runs from its first write, so an idle producer's next transaction never times out unused."""

    kind: ClassVar[str] = "begin"
    tid: str = jfield(STR)
    producer_id: int = jfield(INT)
    epoch: int = jfield(INT)
    timeout_ms: int = jfield(INT)
    participants: tuple[str, ...] = jfield(STRS, default=())
    ahead: bool | None = jfield(FLAG, default=None)
    index: int | None = jfield(_INDEX, default=None)


@dataclass(frozen=True, slots=True)
class Add(_Action):
    """Participants (log paths) added to the ongoing transaction ``txn``."""

    kind: ClassVar[str] = "add"
    tid: str = jfield(STR)
    producer_id: int = jfield(INT)
    epoch: int = jfield(INT)
    txn: TxnId = jfield(TXN)
    participants: tuple[str, ...] = jfield(STRS)


@dataclass(frozen=True, slots=True)
class Prepare(_Action):
    """The decision on ``txn``: -> PrepareCommit / PrepareAbort. ``new_epoch`` fences the producer
    (timeouts, operator aborts, a new instance); ``metadata`` of a commit becomes ``last_committed``.
    ``participants``, set only by the transaction's own producer: the registered participants it wrote to
    (or tried to); the others get no marker (a transaction begun ahead registers a guess)."""

    kind: ClassVar[str] = "prepare"
    tid: str = jfield(STR)
    producer_id: int = jfield(INT)
    epoch: int = jfield(INT)
    txn: TxnId = jfield(TXN)
    outcome: Outcome = jfield(one_of("COMMIT", "ABORT"))
    metadata: dict[str, Any] | None = jfield(ANY, default=None)
    new_epoch: int | None = jfield(INT, default=None)
    reason: str | None = jfield(STR, default=None)
    participants: tuple[str, ...] | None = jfield(STRS, default=None)

    @property
    def commit(self) -> bool:
        return self.outcome == "COMMIT"


@dataclass(frozen=True, slots=True)
class Complete(_Action):
    """Every participant of ``txn`` has its marker: -> CompleteCommit / CompleteAbort."""

    kind: ClassVar[str] = "complete"
    tid: str = jfield(STR)
    txn: TxnId = jfield(TXN)


@dataclass(frozen=True, slots=True)
class Withdraw(_Action):
    """The transaction ``txn`` begun ahead is dropped unused (its producer wrote nothing under it: a closing
    producer); the id's state is its decided transaction's again, as if it had never been begun."""

    kind: ClassVar[str] = "withdraw"
    tid: str = jfield(STR)
    producer_id: int = jfield(INT)
    epoch: int = jfield(INT)
    txn: TxnId = jfield(TXN)


Action = Init | Begin | Add | Prepare | Complete | Withdraw
#: Every action kind, by its JSON discriminator.
ACTION_TYPES: dict[str, type[Action]] = {t.kind: t for t in (Init, Begin, Add, Prepare, Complete, Withdraw)}


def action_from_json(value: dict[str, Any], where: str = "") -> Action:
    """The typed action of one JSON action object (its kind's declared fields); :class:`CorruptDataError`
    (naming ``where``) if it is not a valid one."""
    try:
        cls = ACTION_TYPES.get(value["action"])
        if cls is not None:
            return cls.from_json(value)
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptDataError(f"{where}: transaction log action {value!r} is not valid: {exc!r}", where) from exc
    raise CorruptDataError(f"{where}: unknown transaction log action {value.get('action')!r}", where)


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
