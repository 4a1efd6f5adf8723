"""PROTOCOL.md's tables are the code's: the transaction-log action table against the typed actions, and the
coordinator state table against the transition table. A field added, renamed or made optional in one place
and not the other fails here."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest

from txn_core.clients.routing import partition_for
from txn_core.coordinator.actions import (
    ACTION_TYPES,
    Add,
    Begin,
    Complete,
    Init,
    Prepare,
    Record,
    Withdraw,
    action_from_json,
)
from txn_core.coordinator.service import coordinator_for
from txn_core.errors import CorruptDataError
from txn_core.format.ids import TxnId
from txn_core.format.states import COORDINATOR_TRANSITIONS, CoordinatorState

PROTOCOL = (Path(__file__).resolve().parent.parent / "txn_core" / "PROTOCOL.md").read_text()


def table_after(heading: str) -> list[list[str]]:
    """The rows (cells, without the header and rule) of the first Markdown table after ``heading``."""
    start = PROTOCOL.index(heading)
    rows: list[list[str]] = []
    for line in PROTOCOL[start:].splitlines()[1:]:
        if line.startswith("|"):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif rows:
            break
    return rows[2:]


def test_the_action_table_names_every_action_with_exactly_its_fields() -> None:
    rows = table_after("A record is a list of actions, each naming its transactional id")
    documented = {r[0].strip("`"): [f.strip() for f in r[1].split(",")] for r in rows}
    assert set(documented) == set(ACTION_TYPES)
    for kind, cls in ACTION_TYPES.items():
        fields = dataclasses.fields(cls)
        assert [f.rstrip("?") for f in documented[kind]] == [f.name for f in fields], kind
        optional = {f.rstrip("?") for f in documented[kind] if f.endswith("?")}
        assert optional == {f.name for f in fields if f.default is None}, kind


def test_the_state_table_is_the_transition_table() -> None:
    rows = table_after("Coordinator states per transactional id")
    documented = {}
    for to, sources in rows:
        names = re.sub(r"\(.*?\)", "", sources.replace("(none)", "NONE")).split(",")
        documented[CoordinatorState(to)] = {None if n.strip() == "NONE" else CoordinatorState(n.strip()) for n in names}
    assert documented == {k: set(v) for k, v in COORDINATOR_TRANSITIONS.items()}


EXAMPLES: list[Any] = [
    Init("copier", 7, 3, 60_000),
    Begin("copier", 7, 4, 60_000, ("topics/orders/00000", "groups/g/offsets")),
    Add("copier", 7, 4, TxnId(11, 5), ("topics/orders/00001",)),
    Prepare("copier", 7, 4, TxnId(11, 5), "COMMIT", {"batch": 3}),
    Prepare("copier", 7, 4, TxnId(11, 5), "ABORT", None, 5, "timeout"),
    Complete("copier", TxnId(11, 5)),
    Begin("copier", 7, 5, 60_000, ("topics/orders/00000",), ahead=True),
    Begin("copier", 7, 5, 60_000, ("topics/orders/00000",), ahead=True, index=3),
    Prepare("copier", 7, 5, TxnId(11, 8), "COMMIT", None, None, None, ("topics/orders/00000",)),
    Withdraw("copier", 7, 6, TxnId(11, 9)),
]


@pytest.mark.parametrize("action", EXAMPLES, ids=lambda a: type(a).__name__)
def test_every_action_round_trips_through_json_with_only_its_fields(action: Any) -> None:
    value = action.to_json()
    assert action_from_json(value) == action
    present = {f.name for f in dataclasses.fields(action) if getattr(action, f.name) is not None}
    assert set(value) == {"action", *present}
    assert Record.from_json(Record(17, (action,)).to_json()) == Record(17, (action,))


@pytest.mark.parametrize(
    "bad",
    [
        {"action": "begin", "tid": "t"},
        {"action": "prepare", "tid": "t", "producer_id": 1, "epoch": 0, "txn": "1:2", "outcome": "MAYBE"},
        {"action": "complete", "tid": "t", "txn": "not-a-txn"},
        {"action": "begin", "tid": "t", "producer_id": 1, "epoch": 0, "timeout_ms": 9, "ahead": "yes"},
        {"action": "withdraw", "tid": "t", "producer_id": 1, "epoch": 0},
        {"action": "begin", "tid": "t", "producer_id": 1, "epoch": 0, "timeout_ms": 9, "index": 16},
        {"action": "begin", "tid": "t", "producer_id": 1, "epoch": 0, "timeout_ms": 9, "index": 0},
        {"action": "explode", "tid": "t"},
    ],
)
def test_a_malformed_action_is_corruption_naming_the_record(bad: dict[str, Any]) -> None:
    with pytest.raises(CorruptDataError, match="slot-9"):
        action_from_json(bad, "slot-9")


def test_the_layout_example_puts_its_transactional_id_in_its_own_coordinator_partition() -> None:
    """The Layout example's coordinator directory and the transaction ids printed for the same id are the
    ones the code computes (CRC-32 of ``copier`` mod 16 is 10: the text once said 11)."""
    tid = re.search(r"transactional id `(\w+)`\):", PROTOCOL)
    assert tid is not None
    c = coordinator_for(tid.group(1), 16)
    dirs = set(re.findall(r"_txnlog/coordinators/(\d{5})/log/", PROTOCOL))
    assert dirs == {f"{c:05d}"}
    markers = re.findall(r'"tid":"' + tid.group(1) + r'","txn":"(\d+):', PROTOCOL)
    assert markers and {int(m) for m in markers} == {c}


def test_the_routing_examples_are_where_the_code_routes_those_keys() -> None:
    line = next(t for t in PROTOCOL.splitlines() if t.startswith("Examples with 8 partitions:"))
    spelled = {
        '"user-7"': "user-7",
        "42": 42,
        "-1": -1,
        "true": True,
        "null": None,
        "00 01": b"\x00\x01",
    }
    got = dict(re.findall(r"`?([^`,:]+?)`? → (\d+)", line.split(":", 1)[1]))
    assert {k.strip() for k in got} == set(spelled)
    for text, partition in got.items():
        assert partition_for(spelled[text.strip()], 8) == int(partition), text
