"""The offsets fence (PROTOCOL.md "Offsets fence"): two writers that consume one group's input can never
both commit it, whatever their transactional ids, and the loser's transaction commits nothing."""

from __future__ import annotations

import uuid

import pyarrow as pa
import pytest

import txn_core
from txn_core import GroupFencedError, InvalidTxnStateError, ProducerFencedError, TopicPartition
from txn_core.clients.offsets_fence import claims_prefix
from txn_core.storage import MemoryStorage

SCHEMA = pa.schema([("id", pa.int64())])


@pytest.fixture
def log() -> txn_core.Log:
    log = txn_core.Log(MemoryStorage(f"fence-{uuid.uuid4().hex}"))
    log.create_topic("in", 1, SCHEMA)
    log.create_topic("out", 1, SCHEMA)
    p = log.producer()
    p.send("in", pa.table({"id": list(range(20))}), partition=0)
    p.flush()
    p.close()
    return log


def _consume(log: txn_core.Log, start: int, end: int) -> pa.Table:
    c = log.consumer()
    c.assign([("in", 0)])
    c.seek(("in", 0), start)
    rows = c.poll()
    c.close()
    return rows.slice(0, end - start)


def _copy(p: txn_core.Producer, log: txn_core.Log, start: int, end: int) -> None:
    """One transaction of a consume-transform-produce loop: input [start, end) of in-0 to out."""
    p.begin_transaction()
    p.send("out", _consume(log, start, end).select(["id"]), partition=0)
    p.send_offsets_to_transaction({("in", 0): end}, "cg", start_offsets={("in", 0): start})


def _output(log: txn_core.Log) -> list[int]:
    c = log.consumer()
    c.assign([("out", 0)])
    out: list[int] = []
    while (t := c.poll()).num_rows:
        out.extend(t.column("id").to_pylist())
    return out


def _committed(log: txn_core.Log) -> int | None:
    got = log.groups.committed("cg").get(TopicPartition("in", 0))
    return None if got is None else got.offset


def test_two_transactional_ids_cannot_both_commit_one_groups_input(log: txn_core.Log) -> None:
    a, b = log.producer("copier-a"), log.producer("copier-b")
    a.init_transactions()
    b.init_transactions()
    _copy(a, log, 0, 10)
    a.commit_transaction()
    with pytest.raises(GroupFencedError, match=r"consumer group 'cg'.*in-0@0.*already committed.*'copier-a'"):
        _copy(b, log, 0, 12)  # b resumed from the same committed position before a committed
    with pytest.raises(InvalidTxnStateError, match="call abort_transaction"):
        b.commit_transaction()
    b.abort_transaction()
    # b continues from where the group is now: its chain is a's chain
    _copy(b, log, 10, 20)
    b.commit_transaction()
    a.close()
    b.close()
    assert _output(log) == list(range(20))
    assert _committed(log) == 20


def test_an_open_claim_fences_a_concurrent_writer(log: txn_core.Log) -> None:
    a, b = log.producer("copier-a"), log.producer("copier-b")
    a.init_transactions()
    b.init_transactions()
    _copy(a, log, 0, 10)  # claimed, not yet committed
    with pytest.raises(GroupFencedError, match="held by open transaction"):
        _copy(b, log, 0, 10)
    b.abort_transaction()
    a.commit_transaction()
    a.close()
    b.close()
    assert _output(log) == list(range(10))
    assert _committed(log) == 10


def test_an_aborted_claim_is_released_to_the_next_generation(log: txn_core.Log) -> None:
    a, b = log.producer("copier-a"), log.producer("copier-b")
    a.init_transactions()
    b.init_transactions()
    _copy(a, log, 0, 10)
    a.abort_transaction()
    _copy(b, log, 0, 10)
    b.commit_transaction()
    prefix = claims_prefix("cg", {("in", 0): 0})
    assert log.storage.list(prefix) == ["00000000000000000000", "00000000000000000001"]
    a.close()
    b.close()
    assert _output(log) == list(range(10))


def test_zombie_of_the_same_transactional_id_loses_to_its_successor(log: txn_core.Log) -> None:
    zombie = log.producer("copier")
    zombie.init_transactions()
    _copy(zombie, log, 0, 10)  # claimed; then the process stalls
    successor = log.producer("copier")
    successor.init_transactions()  # fences the zombie and aborts its transaction: the claim is released
    _copy(successor, log, 0, 10)
    successor.commit_transaction()
    with pytest.raises(ProducerFencedError):
        zombie.commit_transaction()
    successor.close()
    assert _output(log) == list(range(10))
    assert _committed(log) == 10


def test_a_writer_that_restarts_from_an_old_position_is_refused(log: txn_core.Log) -> None:
    a = log.producer("copier-a")
    a.init_transactions()
    _copy(a, log, 0, 10)
    a.commit_transaction()
    _copy(a, log, 10, 20)
    a.commit_transaction()
    a.close()
    late = log.producer("copier-late")  # e.g. a query resumed on an old checkpoint at offset 10
    late.init_transactions()
    with pytest.raises(GroupFencedError, match="in-0@10"):
        _copy(late, log, 10, 15)
    late.abort_transaction()
    late.close()
    assert _output(log) == list(range(20))


def test_a_transaction_that_consumed_nothing_claims_nothing(log: txn_core.Log) -> None:
    a = log.producer("copier-a")
    a.init_transactions()
    _copy(a, log, 0, 10)
    a.commit_transaction()
    _copy(a, log, 10, 10)  # an empty batch: offsets stay where they started
    a.commit_transaction()
    _copy(a, log, 10, 20)  # the next batch from the same start still gets its claim
    a.commit_transaction()
    a.close()
    assert _output(log) == list(range(20))
    assert log.storage.list(claims_prefix("cg", {("in", 0): 10})) == ["00000000000000000000"]
