"""The sink's offsets fence without Spark (PROTOCOL.md "Offsets fence" in spark_txn_sink): the commits
Spark's drivers would make for two queries on one group, made directly in the racy orders."""

from __future__ import annotations

import pytest
from sink_helpers import ids, read_topic
from test_spark_sink_protocol import SCHEMA, options, stage

import txn_core
from spark_txn_sink.commit import BatchIdentity, GroupPosition, abort_batch, commit_batch
from spark_txn_sink.faults import InjectedFaultError
from spark_txn_sink.writer import default_transactional_id

TP = ("in", 0)


@pytest.fixture
def out(log: txn_core.Log) -> txn_core.Log:
    log.create_topic("out", 2, SCHEMA)
    log.create_topic("in", 1, SCHEMA)
    return log


def batch(query: str, n: int, tid: str | None = None) -> BatchIdentity:
    return BatchIdentity(tid or default_transactional_id(query, "cg"), query_id=query, batch_id=n, topic="out")


def pos(start: int | None, end: int) -> GroupPosition:
    return GroupPosition({TP: end}, None if start is None else {TP: start})


def committed(log: txn_core.Log) -> int:
    return log.groups.committed("cg")[txn_core.TopicPartition(*TP)].offset


@pytest.mark.parametrize("tid_b", [None, "explicit-b"], ids=["shared-default-id", "other-id"])
def test_two_queries_from_the_group_position_commit_it_once(out: txn_core.Log, tid_b: str | None) -> None:
    opts = options(out, consumergroup="cg")
    a0, b0 = batch("qA", 0), batch("qB", 0, tid_b)
    assert commit_batch(opts, a0, stage(out, a0, 0, 10), lambda url: pos(-1, 10)).outcome == "committed"
    # qB planned its first batch from the same (empty) group position before qA committed
    with pytest.raises(txn_core.GroupFencedError, match=r"consumer group 'cg'.*in-0@-1.*already committed"):
        commit_batch(opts, b0, stage(out, b0, 0, 10), lambda url: pos(-1, 10))
    assert ids(read_topic(out, "out")) == list(range(10))
    assert committed(out) == 10


def test_a_zombie_driver_resuming_its_checkpoint_cannot_recommit_what_a_new_query_copied(out: txn_core.Log) -> None:
    opts = options(out, consumergroup="cg")
    a0 = batch("qA", 0)
    commit_batch(opts, a0, stage(out, a0, 0, 10), lambda url: pos(-1, 10))
    b0, b1 = batch("qB", 0), batch("qB", 1)  # new checkpoint, startingOffsets=group: starts at 10
    commit_batch(opts, b0, stage(out, b0, 10, 20), lambda url: pos(10, 20))
    commit_batch(opts, b1, stage(out, b1, 20, 30), lambda url: pos(20, 30))
    a1 = batch("qA", 1)  # the zombie's next batch starts where its batch 0 ended
    refs = stage(out, a1, 10, 25)
    with pytest.raises(txn_core.GroupFencedError, match=r"in-0@10"):
        commit_batch(opts, a1, refs, lambda url: pos(10, 25))
    abort_batch(opts, a1, refs)  # what Spark does next: it settles the zombie's open transaction at once
    assert out.describe_transaction(a1.transactional_id).state != "Ongoing"
    assert ids(read_topic(out, "out")) == list(range(30))
    assert committed(out) == 30


def test_a_crashed_attempt_releases_its_claim_to_the_replay(out: txn_core.Log) -> None:
    opts = options(out, consumergroup="cg")
    a0 = batch("qA", 0)
    with pytest.raises(InjectedFaultError):  # killed after the claim, before PrepareCommit
        commit_batch(
            options(out, consumergroup="cg", **{"testing.fault": "before_commit"}),
            a0,
            stage(out, a0, 0, 10),
            lambda url: pos(-1, 10),
        )
    assert commit_batch(opts, a0, stage(out, a0, 0, 10), lambda url: pos(-1, 10)).outcome == "committed"
    assert ids(read_topic(out, "out")) == list(range(10))


def test_a_first_batch_that_did_not_start_from_a_used_group_is_refused(out: txn_core.Log) -> None:
    opts = options(out, consumergroup="cg")
    a0 = batch("qA", 0)
    commit_batch(opts, a0, stage(out, a0, 0, 10), lambda url: pos(None, 10))  # an empty group: allowed
    c0 = batch("qC", 0)  # startingOffsets=earliest on a group that already has offsets
    with pytest.raises(txn_core.GroupFencedError, match="startingOffsets=group"):
        commit_batch(opts, c0, stage(out, c0, 0, 10), lambda url: pos(None, 10))
    assert ids(read_topic(out, "out")) == list(range(10))
