"""Storage requests of a steady-state micro-batch of a txnlog -> txnlog stream copy with consumerGroup
(8,000 rows over 4 partitions), counted without Spark by ``spark_batch_rtt`` (the driver's calls Spark
makes, the tasks in between). Counts only, never time: the round trips are reported by running
``tests/spark_batch_rtt.py`` with ``--rtt-ms``."""

from __future__ import annotations

from pathlib import Path

import pytest
from sink_helpers import ids, read_topic
from spark_batch_rtt import run
from test_spark_sink_protocol import SCHEMA, ident, options, stage

import txn_core
from spark_txn_sink import commit as commit_module
from spark_txn_sink.commit import commit_batch
from txn_core.clients import apptxn
from txn_core.clients.apptxn import AppCommitter
from txn_core.clients.producer import client as producer_client
from txn_core.clients.producer import completion
from txn_core.partition import partition, snapshots

PARTITIONS = 4


@pytest.fixture(scope="module")
def batches(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, int]]:
    # A reader re-reads a partition's log start once it is older than LOG_START_RECHECK_S (5 s): a batch
    # that crosses that mark pays one request more. Counts must not depend on how fast the machine runs
    # the batches (a loaded CI machine once counted 18, 19, 18), so the interval is longer than the run. A
    # reader likewise leaves a buffer snapshot of a changed buffer once a minute (SNAPSHOT_EVERY_MS): a
    # loaded machine that took longer than that counted its create (18, 18, 19). And a writer re-checks
    # its cached tail once a minute (TAIL_RECHECK_S, one existence check): a loaded CI machine counted
    # commits of 15, 15, 16. A decided transaction's Complete rides on the next begin when that comes within
    # COMPLETE_LINGER_S (0.2 s) of its markers, else it is written alone: a loaded machine pays it. A batch's
    # markers likewise ride in the next batch's entries when that comes within APP_MARKER_LINGER_MS (1 s), else
    # they are written alone: a loaded machine counted commits of 10, 11, 11.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(completion, "COMPLETE_LINGER_S", 3600.0)
        patch.setattr(apptxn, "APP_MARKER_LINGER_MS", 3_600_000)
        patch.setattr(producer_client, "MAX_MARKER_LINGER_MS", 3_600_000)
        patch.setattr(partition, "LOG_START_RECHECK_S", 3600.0)
        patch.setattr(partition, "TAIL_RECHECK_S", 3600.0)
        patch.setattr(snapshots, "SNAPSHOT_EVERY_MS", 3_600_000)
        phases = run(batches=5, rows=8000, partitions=PARTITIONS, root=str(tmp_path_factory.mktemp("rtt")))
    counts = [{name: p.total for name, p in b.items()} for b in phases]
    for b in counts:  # the markers and cleanup run behind the returned commit: counted with it
        b["commit"] += b.pop("finish")
    return counts


def test_a_steady_state_batch_costs_the_same_requests_as_the_last(batches: list[dict[str, int]]) -> None:
    # Per batch, not per phase: the probes past a partition's end and the commit's markers run behind the
    # phase that issued them and are counted in whichever phase they start. The first batch after the
    # catch-up of the history learns the stream's pace (how many new entries each partition gets per batch,
    # PROTOCOL.md "Reading ahead").
    steady = [sum(b.values()) for b in batches[2:]]
    assert all(b == steady[0] for b in steady), batches[2:]


def test_a_steady_state_batch_pays_each_partitions_new_entries_and_its_output(batches: list[dict[str, int]]) -> None:
    # per partition: the input transaction's data entry and marker and the slot past them, read at once,
    # two probes past that end, the task's reads of the two entries and its staged object, the output's
    # DATA_REF and marker (10 per partition); plus the topic metadata refresh (2 existence checks), the
    # manifest, the offsets entry and its marker, the claim, the PrepareCommit, the Complete, the cleanup's
    # listing and the manifest's delete (8)
    assert sum(batches[-1].values()) <= 10 * PARTITIONS + 2 + 8


def test_planning_reads_one_header_per_partition(batches: list[dict[str, int]]) -> None:
    assert batches[-1]["partitions"] <= PARTITIONS


def test_a_steady_state_commit_reuses_its_producer(batches: list[dict[str, int]]) -> None:
    # no init_transactions, progress read or topic metadata refresh, no read before a coordinator record:
    # begin (with every participant), 4 DATA_REFs, the manifest, the offsets entry, the claim and the
    # PrepareCommit on the batch's path; 5 markers, the Complete, a listing and a delete behind it
    assert batches[-1]["commit"] <= 16
    assert batches[0]["commit"] > batches[-1]["commit"]


def test_a_kept_producer_fenced_by_another_committer_turns_the_batch_into_a_replay(
    log: txn_core.Log, tmp_path: Path
) -> None:
    log.create_topic("out", 3, SCHEMA)
    opts = options(log)
    assert commit_batch(opts, ident(0), stage(log, ident(0), 0, 10)).outcome == "committed"
    first_process = dict(commit_module._LOGS)
    kept = first_process[commit_module._log_key(opts)].committer._kept
    assert ident(0).transactional_id in kept, "the committed batch's producer is kept"
    commit_module._LOGS.clear()  # another driver process commits batch 1 of the same query
    assert commit_batch(opts, ident(1), stage(log, ident(1), 10, 20)).outcome == "committed"
    commit_module._LOGS.clear()
    commit_module._LOGS.update(first_process)  # back in the first process, its producer kept
    replay = commit_batch(opts, ident(1), stage(log, ident(1), 10, 20, attempt=1))
    assert replay.outcome == "replayed"
    assert ids(read_topic(log, "out")) == list(range(20))


def test_a_kept_producer_commits_to_partitions_added_since_its_last_batch(log: txn_core.Log) -> None:
    log.create_topic("out", 1, SCHEMA)
    opts = options(log)
    assert commit_batch(opts, ident(0), stage(log, ident(0), 0, 10)).outcome == "committed"
    txn_core.open_log(log.url).add_partitions("out", 3)  # another process grows the topic
    grown = txn_core.open_log(log.url)  # the tasks plan with the new partition count
    assert commit_batch(opts, ident(1), stage(grown, ident(1), 10, 40)).outcome == "committed"
    assert ids(read_topic(log, "out")) == list(range(40))


def test_a_batch_whose_transaction_timed_out_says_so_not_that_another_query_took_over(
    log: txn_core.Log, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a consumerGroup, every fenced commit was reported as "taken over by another committer (a second
    query on this group ...)"; a batch whose own transaction ran past its timeout is fenced too, and now
    hears that."""
    log.create_topic("out", 1, SCHEMA)
    opts = options(log, consumergroup="g")
    timed_out = txn_core.TransactionTimedOutError("transaction 0:1 exceeded its timeout of 1000 ms")

    def late(*args: object, **kwargs: object) -> None:
        raise timed_out

    monkeypatch.setattr(AppCommitter, "commit", late)
    with pytest.raises(txn_core.TransactionTimedOutError) as raised:
        commit_batch(opts, ident(0), stage(log, ident(0), 0, 10))
    assert raised.value is timed_out and "taken over" not in str(raised.value)
