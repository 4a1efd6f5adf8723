"""The sink's commit protocol without Spark: the calls Spark makes, made directly, in the awkward orders.

Each test plays Spark's part (tasks staging rows, the driver committing or aborting a batch) and checks
what a read_committed reader sees, what stays in storage and what the group's offsets say.
"""

from __future__ import annotations

import datetime
import json
from typing import Any

import pyarrow as pa
import pytest
from sink_helpers import garbage, ids, read_topic, staged_objects

import txn_core
from spark_txn_sink import commit as commit_module
from spark_txn_sink.commit import BatchIdentity, abort_batch, commit_batch
from spark_txn_sink.faults import InjectedFaultError
from spark_txn_sink.options import SinkOptions, parse_sink_options
from spark_txn_sink.stager import ROUTE_ROWS, PartitionStager, TopicTarget, align_timestamps
from spark_txn_sink.writer import default_transactional_id
from txn_core.clients.routing import partition_for
from txn_core.errors import SchemaMismatchError
from txn_core.partition.staging import StagedRef

SCHEMA = pa.schema([("id", pa.int64()), ("key", pa.string())])
TID = "sink-test"


def options(log: txn_core.Log, **extra: str) -> SinkOptions:
    return parse_sink_options(
        {"path": log.url, "topic": "out", "checkpointlocation": "/unused", **extra}, streaming=True
    )


def target(log: txn_core.Log, **kw: Any) -> TopicTarget:
    meta = log.topics.get("out")
    return TopicTarget(log.url, (), "out", meta.schema, meta.partitions, kw.pop("key_column", "key"), **kw)


def batch(start: int, end: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [pa.array(range(start, end), pa.int64()), pa.array([f"k{i % 5}" for i in range(start, end)])], schema=SCHEMA
    )


def stage(
    log: txn_core.Log, ident: BatchIdentity, start: int, end: int, *, task: int = 0, attempt: int = 0
) -> list[StagedRef]:
    """One task attempt writing ids [start, end) for ``ident``'s batch."""
    stager = PartitionStager(target(log), log.storage, ident.prefix, f"t{task}a{attempt}", start=task)
    return stager.stage_all([batch(start, end)])


@pytest.fixture
def out(log: txn_core.Log) -> txn_core.Log:
    log.create_topic("out", 3, SCHEMA)
    return log


def ident(batch_id: int, query: str = "q1", tid: str = TID) -> BatchIdentity:
    return BatchIdentity(tid, query_id=query, batch_id=batch_id, topic="out")


def test_only_the_attempts_named_in_the_messages_are_committed(out: txn_core.Log) -> None:
    b0 = ident(0)
    failed = stage(out, b0, 0, 50, attempt=0)  # a failed first attempt of task 0
    speculative = stage(out, b0, 0, 50, attempt=1)  # a speculative duplicate that lost
    winner = stage(out, b0, 0, 50, attempt=2)  # the attempt Spark reports
    other = stage(out, b0, 50, 100, task=1)
    result = commit_batch(options(out), b0, winner + other)
    assert result.outcome == "committed" and result.rows == 100
    assert ids(read_topic(out, "out")) == list(range(100))
    assert result.deleted == len(failed) + len(speculative)
    assert garbage(out, "out") == []


def test_rows_are_routed_by_a_stable_hash_of_the_key(out: txn_core.Log) -> None:
    b0 = ident(0)
    commit_batch(options(out), b0, stage(out, b0, 0, 200))
    table = read_topic(out, "out")
    assert all(
        p == partition_for(k, 3)
        for k, p in zip(table.column("key").to_pylist(), table.column("_partition").to_pylist(), strict=True)
    )


def test_repeated_commit_of_a_batch_is_a_noop_that_deletes_only_its_own_objects(out: txn_core.Log) -> None:
    first = stage(out, ident(0), 0, 50)
    commit_batch(options(out), ident(0), first)
    replayed = stage(out, ident(0), 0, 50)  # Spark re-ran batch 0 after a restart
    result = commit_batch(options(out), ident(0), replayed)
    assert result.outcome == "replayed" and result.deleted == len(replayed)
    assert ids(read_topic(out, "out")) == list(range(50)), "the first commit's objects are still there"
    assert garbage(out, "out") == []


def test_a_query_whose_transactional_id_another_query_took_over_fails_naming_it(out: txn_core.Log) -> None:
    """Two streaming queries given one transactionalId: the newer takes it over at its first batch; the
    older's next batch (or a replay of one it committed) fails naming the other query and commits nothing,
    so the two cannot alternate on the id (each replay check would then miss the other's batches)."""
    commit_batch(options(out), ident(0, "q-old"), stage(out, ident(0, "q-old"), 0, 10))
    commit_batch(options(out), ident(1, "q-old"), stage(out, ident(1, "q-old"), 10, 20))
    assert commit_batch(options(out), ident(0, "q-new"), stage(out, ident(0, "q-new"), 100, 110)).outcome == "committed"
    for batch_id, (start, end) in ((2, (20, 30)), (1, (10, 20))):  # its next batch; a replay after a restart
        with pytest.raises(txn_core.TransactionalIdTakenOverError, match="taken over by q-new") as refused:
            commit_batch(options(out), ident(batch_id, "q-old"), stage(out, ident(batch_id, "q-old"), start, end))
        assert f"batch {batch_id} of q-old: this attempt committed nothing" in str(refused.value)
    assert commit_batch(options(out), ident(1, "q-new"), stage(out, ident(1, "q-new"), 110, 120)).outcome == "committed"
    assert ids(read_topic(out, "out")) == [*range(20), *range(100, 120)]


def test_an_older_batch_id_is_also_a_noop(out: txn_core.Log) -> None:
    commit_batch(options(out), ident(0), stage(out, ident(0), 0, 10))
    commit_batch(options(out), ident(1), stage(out, ident(1), 10, 20))
    assert commit_batch(options(out), ident(0), stage(out, ident(0), 0, 10)).outcome == "replayed"
    assert ids(read_topic(out, "out")) == list(range(20))


def test_replay_finishes_a_cleanup_the_crashed_committer_never_ran(out: txn_core.Log) -> None:
    b1 = ident(1)
    leftover = stage(out, b1, 0, 30, attempt=0)  # a failed attempt's objects
    refs = stage(out, b1, 0, 30, attempt=1)
    with pytest.raises(InjectedFaultError):
        commit_batch(options(out, **{"testing.fault": "after_prepare"}), b1, refs)
    assert {r.key for r in leftover} <= set(staged_objects(out)), "the crash came before the cleanup"
    assert any("_manifest-" in k for k in garbage(out, "out"))
    assert abort_batch(options(out), b1, refs) == 0, "Spark's abort must not delete a committed batch"
    replay = stage(out, b1, 0, 30, attempt=0)
    assert commit_batch(options(out), b1, replay).outcome == "replayed"
    assert ids(read_topic(out, "out")) == list(range(30))
    assert garbage(out, "out") == [], "leftovers, the replay's own objects and the manifest are gone"


def test_abort_of_an_uncommitted_batch_deletes_its_objects_and_releases_readers(out: txn_core.Log) -> None:
    b0 = ident(0)
    refs = stage(out, b0, 0, 40)
    with pytest.raises(InjectedFaultError):
        commit_batch(options(out, **{"testing.fault": "before_commit"}), b0, refs)
    desc = out.describe_topic("out")
    assert any(p.ongoing_transactions for p in desc.partitions), "references sent, transaction open"
    assert read_topic(out, "out").num_rows == 0
    assert abort_batch(options(out), b0, refs) == len(refs) + 1  # + the manifest
    assert not any(p.ongoing_transactions for p in out.describe_topic("out").partitions)
    assert staged_objects(out) == []
    assert commit_batch(options(out), b0, stage(out, b0, 0, 40)).outcome == "committed"
    assert ids(read_topic(out, "out")) == list(range(40))


def test_a_zombie_driver_mid_commit_is_fenced_by_the_next_run(out: txn_core.Log) -> None:
    b0 = ident(0)
    zombie_refs = stage(out, b0, 0, 20, attempt=0)
    zombie = out.producer(TID)
    zombie.init_transactions()
    zombie.begin_transaction()
    zombie.send_staged(zombie_refs)  # the old driver got this far, then stalled
    result = commit_batch(options(out), b0, stage(out, b0, 0, 20, attempt=1))
    assert result.outcome == "committed"
    with pytest.raises(txn_core.ProducerFencedError):
        zombie.commit_transaction(metadata={"sink": "zombie"})
    assert ids(read_topic(out, "out")) == list(range(20)), "the zombie's references never show"


def test_a_zombie_that_committed_first_turns_the_new_run_into_a_replay(out: txn_core.Log) -> None:
    b0 = ident(0)
    commit_batch(options(out), b0, stage(out, b0, 0, 20, attempt=0))  # the old run's commit landed
    assert commit_batch(options(out), b0, stage(out, b0, 0, 20, attempt=1)).outcome == "replayed"
    assert ids(read_topic(out, "out")) == list(range(20))


def test_a_new_query_reusing_the_transactional_id_is_not_mistaken_for_a_replay(out: txn_core.Log) -> None:
    commit_batch(options(out), ident(0, "q1"), stage(out, ident(0, "q1"), 0, 10))
    commit_batch(options(out), ident(1, "q1"), stage(out, ident(1, "q1"), 10, 20))
    # a new checkpoint: batch ids restart at 0 under a new query id
    result = commit_batch(options(out), ident(0, "q2"), stage(out, ident(0, "q2"), 20, 30))
    assert result.outcome == "committed"
    assert ids(read_topic(out, "out")) == list(range(30))


def test_group_offsets_are_committed_with_the_output_and_only_then(out: txn_core.Log) -> None:
    opts = options(out, consumergroup="copier")
    out.create_topic("in", 2, SCHEMA)
    with pytest.raises(InjectedFaultError):
        commit_batch(
            options(out, consumergroup="copier", **{"testing.fault": "before_commit"}),
            ident(0),
            stage(out, ident(0), 0, 10),
            lambda url: {("in", 0): 5, ("in", 1): 7},
        )
    abort_batch(opts, ident(0), [])
    assert out.groups.committed("copier") == {}, "an aborted batch commits no offsets"
    commit_batch(opts, ident(0), stage(out, ident(0), 0, 10), lambda url: {("in", 0): 5, ("in", 1): 7})
    assert {(tp.topic, tp.partition): o.offset for tp, o in out.groups.committed("copier").items()} == {
        ("in", 0): 5,
        ("in", 1): 7,
    }
    replay = commit_batch(opts, ident(0), stage(out, ident(0), 0, 10), lambda url: {("in", 0): 99})
    assert replay.outcome == "replayed"
    assert out.groups.committed("copier")[txn_core.TopicPartition("in", 0)].offset == 5


def test_a_new_query_on_the_group_settles_the_crashed_query_s_open_transaction(out: txn_core.Log) -> None:
    """Query A dies before its commit point; query B (new checkpoint) starts from the group. B's offset
    commits must be readable at once, or a query C started from the group would re-read B's output."""
    out.create_topic("in", 1, SCHEMA)
    opts = options(out, consumergroup="copier")
    a = BatchIdentity(default_transactional_id("qA", "copier"), query_id="qA", batch_id=0, topic="out")
    commit_batch(opts, a, stage(out, a, 0, 10), lambda url: {("in", 0): 10})
    a1 = BatchIdentity(a.transactional_id, query_id="qA", batch_id=1, topic="out")
    with pytest.raises(InjectedFaultError):  # killed: no abort follows, the transaction stays open
        commit_batch(
            options(out, consumergroup="copier", **{"testing.fault": "before_commit"}),
            a1,
            stage(out, a1, 10, 20),
            lambda url: {("in", 0): 20},
        )
    assert out.groups.committed("copier")[txn_core.TopicPartition("in", 0)].offset == 10
    b = BatchIdentity(default_transactional_id("qB", "copier"), query_id="qB", batch_id=0, topic="out")
    assert b.transactional_id == a.transactional_id
    assert commit_batch(opts, b, stage(out, b, 10, 20), lambda url: {("in", 0): 20}).outcome == "committed"
    assert out.groups.committed("copier")[txn_core.TopicPartition("in", 0)].offset == 20, "readable at once"
    assert ids(read_topic(out, "out")) == list(range(20))
    assert default_transactional_id("qB") != default_transactional_id("qC"), "no group: one id per query"


def test_an_empty_batch_still_commits_its_progress_and_offsets(out: txn_core.Log) -> None:
    out.create_topic("in", 1, SCHEMA)
    opts = options(out, consumergroup="copier")
    assert commit_batch(opts, ident(0), [], lambda url: {("in", 0): 3}).outcome == "committed"
    progress = out.transaction_metadata(TID)
    assert progress is not None and progress["batch_id"] == 0 and progress["rows"] == 0
    assert out.groups.committed("copier")[txn_core.TopicPartition("in", 0)].offset == 3


def test_a_stager_holds_at_most_its_buffer_budget(out: txn_core.Log) -> None:
    t = target(out, object_bytes=200_000, buffer_bytes=300_000)
    stager = PartitionStager(t, out.storage, ident(0).prefix, "t0a0", start=0)
    for i in range(300):
        stager.add(batch(i * 1000, (i + 1) * 1000))
        assert stager._total < t.buffer_bytes, "routed rows held"
        assert stager._pending_rows < ROUTE_ROWS, "rows waiting to be routed"
    assert len(stager.refs) >= 6, "objects were written as buffers filled, not once at the end"
    refs = stager.finish()
    commit_batch(options(out), ident(0), refs)
    assert ids(read_topic(out, "out")) == list(range(300_000))


def test_without_a_key_each_staged_object_goes_to_the_next_partition(out: txn_core.Log) -> None:
    small = PartitionStager(target(out, key_column=None), out.storage, ident(0).prefix, "t1a0", start=1)
    assert [r.partition for r in small.stage_all([batch(0, 10), batch(10, 20)])] == [1], "one object"
    t = target(out, key_column=None, object_bytes=20_000, buffer_bytes=40_000)
    stager = PartitionStager(t, out.storage, ident(0).prefix, "t2a0", start=2)
    refs = stager.stage_all([batch(i * 1000, (i + 1) * 1000) for i in range(6)])
    assert [r.partition for r in refs] == [2, 0, 1]
    assert sum(r.rows for r in refs) == 6000


def test_spark_time_zone_labels_are_aligned_to_the_topic() -> None:
    spark_batch = pa.RecordBatch.from_arrays([pa.array([1_000_000], pa.timestamp("us", "Etc/UTC"))], names=["ts"])
    topic = pa.schema([("ts", pa.timestamp("us", "UTC"))])
    aligned = align_timestamps(spark_batch, topic)
    assert aligned.schema.field("ts").type == pa.timestamp("us", "UTC")
    assert aligned.column(0).cast(pa.int64()).to_pylist() == [1_000_000]


def test_an_instant_into_a_wall_clock_column_takes_its_time_in_the_session_zone() -> None:
    # 2023-12-31 23:00 UTC is 2024-01-01 00:00 in Paris, what CAST(t AS TIMESTAMP_NTZ) gives under Europe/Paris
    instant = 1_704_063_600_000_000
    spark_batch = pa.RecordBatch.from_arrays([pa.array([instant], pa.timestamp("us", "Europe/Paris"))], names=["t"])
    aligned = align_timestamps(spark_batch, pa.schema([("t", pa.timestamp("us"))]))
    assert aligned.schema.field("t").type == pa.timestamp("us")
    assert aligned.column(0).to_pylist() == [datetime.datetime(2024, 1, 1, 0, 0)]
    utc = pa.RecordBatch.from_arrays([pa.array([instant], pa.timestamp("us", "Etc/UTC"))], names=["t"])
    assert align_timestamps(utc, pa.schema([("t", pa.timestamp("ns"))])).column(0).to_pylist() == [
        datetime.datetime(2023, 12, 31, 23, 0)
    ]


@pytest.mark.parametrize(
    ("given", "topic", "cast"),
    [
        (pa.timestamp("us"), pa.timestamp("us", "UTC"), "cast('timestamp')"),
        (pa.struct([("at", pa.timestamp("us", "Etc/UTC"))]), pa.struct([("at", pa.timestamp("us"))]), "TIMESTAMP_NTZ"),
        (pa.list_(pa.timestamp("us")), pa.list_(pa.timestamp("ns", "UTC")), "cast('timestamp')"),
    ],
)
def test_a_wall_clock_time_into_an_instant_column_is_refused_naming_the_cast(
    given: pa.DataType, topic: pa.DataType, cast: str
) -> None:
    spark_batch = pa.RecordBatch.from_arrays([pa.array([None], given)], names=["t"])
    with pytest.raises(SchemaMismatchError, match=r"column 't[.\w]*' is timestamp") as refused:
        align_timestamps(spark_batch, pa.schema([("t", topic)]))
    assert cast in str(refused.value)


def test_staging_batches_of_two_queries_never_share_a_prefix() -> None:
    assert ident(0, "q1").prefix != ident(0, "q2").prefix
    assert BatchIdentity(TID, write_id="a", topic="out").prefix != BatchIdentity(TID, write_id="b", topic="out").prefix


def test_commits_in_one_process_cost_the_same_however_long_the_history(out: txn_core.Log, tmp_path: Any) -> None:
    """Spark runs every commit of a query run in one Python worker: the sink reuses its log there, so a
    commit does not replay the transaction log since its last snapshot nor re-discover partition tails."""
    stats = tmp_path / "stats"
    opts = options(out, **{"testing.stats": str(stats)})
    for b in range(40):
        commit_batch(opts, ident(b), stage(out, ident(b), b * 10, b * 10 + 10))
    totals = [json.loads((stats / f"q1.{b}.json").read_text())["total"] for b in range(40)]
    assert totals[39] <= totals[2] + 2, f"requests per commit grew with history: {totals}"
    assert ids(read_topic(out, "out")) == list(range(400))


def test_a_failed_commit_forgets_the_reused_log(out: txn_core.Log) -> None:
    key = commit_module._log_key(options(out))
    commit_batch(options(out), ident(0), stage(out, ident(0), 0, 10))
    first = commit_module._LOGS[key][0]
    commit_batch(options(out), ident(1), stage(out, ident(1), 10, 20))
    assert commit_module._LOGS[key][0] is first
    with pytest.raises(InjectedFaultError):
        commit_batch(options(out, **{"testing.fault": "before_commit"}), ident(2), stage(out, ident(2), 20, 30))
    assert key not in commit_module._LOGS, "the next commit starts from storage alone"
    commit_batch(options(out), ident(2), stage(out, ident(2), 20, 30))
    assert commit_module._LOGS[key][0] is not first
    assert ids(read_topic(out, "out")) == list(range(30))
