"""Application transactions in the core (PROTOCOL.md "Application transactions"): staged data committed
exactly once per (application, version), replays are no-ops, only listed staged objects become visible,
cleanup never deletes what is committed."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import txn_core
from txn_core.clients.apptxn import AppCommitter, abort_staged, commit_staged, stage_table
from txn_core.clients.appunit import RUN_HISTORY, AppVersion
from txn_core.clock import system_clock
from txn_core.format import paths
from txn_core.partition.staging import write_staged
from txn_core.storage import MemoryStorage

SCHEMA = pa.schema([("id", pa.int64())])


def _log() -> txn_core.Log:
    log = txn_core.Log(MemoryStorage(uuid.uuid4().hex))
    log.create_topic("t", 2, SCHEMA)
    return log


def _ids(log: txn_core.Log) -> list[int]:
    c = log.consumer()
    c.assign([("t", 0), ("t", 1)])
    out: list[int] = []
    while (got := c.poll()).num_rows:
        out.extend(got.column("id").to_pylist())
    return sorted(out)


def _failed_attempt(log: txn_core.Log, unit: AppVersion) -> Any:
    """A failed attempt's staged object under ``unit``'s prefix (its ref)."""
    return write_staged(
        log.storage,
        unit.prefix,
        "t",
        0,
        [pa.record_batch([pa.array([666])], schema=SCHEMA)],
        SCHEMA,
        tag="failed",
        clock=system_clock,
    )


def _staged(log: txn_core.Log) -> list[str]:
    def walk(prefix: str) -> list[str]:
        out = []
        for name in log.storage.list(prefix):
            out += walk(prefix + name) if name.endswith("/") else [prefix + name]
        return out

    return walk(paths.STAGING)


def test_each_version_commits_once_and_a_replay_commits_nothing() -> None:
    log = _log()
    with AppCommitter(log) as committer:
        first = committer.write_once(
            AppVersion("loader", run_id="r", version=0), "t", pa.table({"id": [1, 2]}, schema=SCHEMA), key_column="id"
        )
        second = committer.write_once(
            AppVersion("loader", run_id="r", version=1), "t", pa.table({"id": [3]}, schema=SCHEMA)
        )
        assert second.deleted == 0  # its cleanup (the manifest) runs behind the commit: waited for here
        committed_objects = _staged(log)  # the committed units' data: their references point at them
        again = committer.write_once(
            AppVersion("loader", run_id="r", version=1), "t", pa.table({"id": [3]}, schema=SCHEMA)
        )
        older = committer.write_once(
            AppVersion("loader", run_id="r", version=0), "t", pa.table({"id": [1, 2]}, schema=SCHEMA)
        )
    assert [first.outcome, second.outcome, again.outcome, older.outcome] == [
        "committed",
        "committed",
        "replayed",
        "replayed",
    ]
    assert _ids(log) == [1, 2, 3]
    assert _staged(log) == committed_objects, "a replay leaves nothing staged of its own"
    assert len(committed_objects) == first.objects + second.objects
    progress = log.transaction_metadata("loader.t")  # the application's id scoped to the topic
    assert progress is not None and progress["batch_id"] == 1 and progress["query_id"] == "r"


def test_a_replay_in_another_process_after_a_crash_commits_nothing() -> None:
    """A fresh committer (another process, after a crash) learns the progress from storage alone."""
    log = _log()
    unit = AppVersion("loader", run_id="r", version=5)
    with AppCommitter(log) as committer:
        committer.write_once(unit, "t", pa.table({"id": [7]}, schema=SCHEMA), partition=1)
    fresh = txn_core.Log(log.storage)
    with AppCommitter(fresh) as other:
        assert other.write_once(unit, "t", pa.table({"id": [7]}, schema=SCHEMA), partition=1).outcome == "replayed"
    assert _ids(fresh) == [7]


def test_only_the_listed_staged_objects_become_visible_and_the_rest_is_cleaned_up() -> None:
    """A failed attempt's object under the unit's prefix is never visible and is deleted by the commit."""
    log = _log()
    unit = AppVersion("loader", run_id="r", version=0).for_topic("t")  # its staging prefix is the topic's
    stray = _failed_attempt(log, unit)
    refs = stage_table(log, unit, "t", pa.table({"id": [1]}, schema=SCHEMA), partition=0)
    result, kept = commit_staged(log, unit, refs, topic="t")
    assert result.outcome == "committed" and result.deleted == 1 and stray is not None
    assert _ids(log) == [1]
    assert _staged(log) == [r.key for r in refs], "the stray attempt is deleted, the committed data kept"
    assert kept is not None
    kept[0].close()


def test_a_kept_producer_fenced_by_another_committer_starts_over_from_storage() -> None:
    """Two committers of one application: the second fences the first; the first's next unit (with its
    kept producer) is fenced at its begin, before anything is decided, and starts over: exactly once, and
    the manifest the fenced attempt wrote is deleted (a Spark query restarted in another Python worker left
    it behind under a replayed batch)."""
    log_a = _log()
    log_b = txn_core.Log(log_a.storage)
    a, b = AppCommitter(log_a), AppCommitter(log_b)
    a.write_once(AppVersion("app", run_id="r", version=0), "t", pa.table({"id": [0]}, schema=SCHEMA))
    b.write_once(
        AppVersion("app", run_id="r", version=1), "t", pa.table({"id": [1]}, schema=SCHEMA)
    )  # fences a's kept producer
    assert (
        a.write_once(AppVersion("app", run_id="r", version=1), "t", pa.table({"id": [1]}, schema=SCHEMA)).outcome
        == "replayed"
    )
    # the fenced attempt had written its manifest before its begin failed: the replay leaves nothing staged
    assert [k for k in _staged(log_a) if "/_manifest-" in k] == []
    assert (
        a.write_once(AppVersion("app", run_id="r", version=2), "t", pa.table({"id": [2]}, schema=SCHEMA)).outcome
        == "committed"
    )
    a.close()
    b.close()
    assert _ids(txn_core.Log(log_a.storage)) == [0, 1, 2]


def test_a_run_whose_id_another_run_took_over_commits_nothing_and_leaves_the_other_alone() -> None:
    """Two runs on one transactional id at once (two streaming queries given the same transactionalId):
    the newer takes the id over with its first unit; the older then fails, even replaying a unit it had
    committed (the progress names the other run, so the replay would commit again), and fences nobody. A
    run the id's history does not name may take it over at any version (sequential reuse)."""
    log = _log()
    old, new = AppCommitter(log), AppCommitter(txn_core.Log(log.storage))
    table = pa.table({"id": [1]}, schema=SCHEMA)
    old.write_once(AppVersion("shared", run_id="old", version=0), "t", table, partition=0)
    old.write_once(AppVersion("shared", run_id="old", version=1), "t", pa.table({"id": [2]}, schema=SCHEMA))
    taken = new.write_once(AppVersion("shared", run_id="new", version=0), "t", pa.table({"id": [10]}, schema=SCHEMA))
    assert taken.outcome == "committed", "a run's first unit may take an id over (sequential reuse)"
    # its markers and Complete (which bumps the epoch, as every completed transaction does) run behind the
    # returned commit on an object store: settled before the epoch is read
    assert taken.deleted == 0
    epoch = log.describe_transaction("shared.t").producer_epoch

    with pytest.raises(txn_core.TransactionalIdTakenOverError, match="run 'new''s version 0") as refused:
        old.write_once(AppVersion("shared", run_id="old", version=2), "t", pa.table({"id": [3]}, schema=SCHEMA))
    assert isinstance(refused.value, txn_core.ProducerFencedError) and refused.value.other_run == "new"
    # a replay after a crash, in a fresh process
    with pytest.raises(txn_core.TransactionalIdTakenOverError), AppCommitter(txn_core.Log(log.storage)) as restarted:
        restarted.write_once(AppVersion("shared", run_id="old", version=1), "t", pa.table({"id": [2]}, schema=SCHEMA))
    unit = AppVersion("shared", run_id="old", version=2)
    refs = stage_table(log, unit, "t", pa.table({"id": [3]}, schema=SCHEMA), partition=0)
    assert abort_staged(log, unit, refs) == 0, "its objects wait for the sweep: commit point unknown"
    assert log.describe_transaction("shared.t").producer_epoch == epoch, "the refused run fenced nobody"

    again = new.write_once(AppVersion("shared", run_id="new", version=1), "t", pa.table({"id": [11]}, schema=SCHEMA))
    assert again.outcome == "committed"
    with AppCommitter(txn_core.Log(log.storage)) as dated:  # a new run's first unit may have any version
        assert dated.write_once(AppVersion("shared", run_id="dated", version=20261124), "t", table).outcome == (
            "committed"
        )
    with pytest.raises(txn_core.TransactionalIdTakenOverError, match="run 'dated''s version 20261124"):
        new.write_once(AppVersion("shared", run_id="new", version=2), "t", pa.table({"id": [12]}, schema=SCHEMA))
    old.close()
    new.close()
    assert _ids(txn_core.Log(log.storage)) == [1, 1, 2, 10, 11], "each unit once; nothing of the refused ones"


@pytest.mark.parametrize("between", ["runs", "one-shot write"])
def test_the_run_history_keeps_the_newest_runs_whatever_their_names_and_survives_one_shot_writes(
    between: str,
) -> None:
    """The history is kept in commit order (stored JSON sorts object keys: a dict would keep the runs whose
    names sort last), and a one-shot write under the id hands it on: the run that a new run took the id
    from is still refused its replay."""
    log = _log()
    table = pa.table({"id": [1]}, schema=SCHEMA)
    with AppCommitter(log) as committer:
        if between == "runs":
            for n in range(RUN_HISTORY - 1):  # older runs whose names sort after the ones that matter
                committer.write_once(AppVersion("shared", run_id=f"z{n:02d}", version=0), "t", table)
        committer.write_once(AppVersion("shared", run_id="a", version=0), "t", table)
        committer.write_once(AppVersion("shared", run_id="a", version=1), "t", table)
        if between == "one-shot write":
            committer.write_once(AppVersion("shared", write_id="w1"), "t", table)
        committer.write_once(AppVersion("shared", run_id="b", version=0), "t", table)
    runs = [r for r, _ in log.transaction_metadata("shared.t")["runs"]]  # type: ignore[index]
    assert runs[-2:] == ["a", "b"] and len(runs) <= RUN_HISTORY
    rows = len(_ids(log))
    with pytest.raises(txn_core.TransactionalIdTakenOverError), AppCommitter(txn_core.Log(log.storage)) as again:
        again.write_once(AppVersion("shared", run_id="a", version=1), "t", table)  # a replay after a crash
    assert len(_ids(log)) == rows, "the replay committed nothing"


def test_abort_deletes_an_uncommitted_attempt_and_leaves_a_committed_one() -> None:
    log = _log()
    unit = AppVersion("app", run_id="r", version=0)
    refs = stage_table(log, unit, "t", pa.table({"id": [1, 2]}, schema=SCHEMA), partition=0)
    assert abort_staged(log, unit, refs) == 1 and _staged(log) == []
    refs = stage_table(log, unit, "t", pa.table({"id": [1, 2]}, schema=SCHEMA), partition=0)
    _, kept = commit_staged(log, unit, refs, topic="t")
    assert kept is not None
    kept[0].close()
    assert abort_staged(log, unit, refs) == 0, "a committed unit's objects are data"
    assert _ids(log) == [1, 2]


def test_a_one_shot_write_is_ephemeral_and_never_replayed() -> None:
    log = _log()
    with AppCommitter(log) as committer:
        unit = AppVersion("once", write_id="w1")
        assert committer.write_once(unit, "t", pa.table({"id": [9]}, schema=SCHEMA)).outcome == "committed"
        assert committer.write_once(unit, "t", pa.table({"id": [9]}, schema=SCHEMA)).outcome == "replayed"
    progress = log.transaction_metadata("once.t")
    assert progress is not None and progress["ephemeral"] is True and progress["write_id"] == "w1"
    assert _ids(log) == [9]


def test_bad_input_names_the_problem() -> None:
    log = _log()
    with pytest.raises(txn_core.ConfigurationError, match="partition 5 does not exist"):
        stage_table(log, AppVersion("x", run_id="r", version=0), "t", pa.table({"id": [1]}, schema=SCHEMA), partition=5)
    with pytest.raises(txn_core.SchemaMismatchError):
        stage_table(log, AppVersion("x", run_id="r", version=0), "t", pa.table({"name": ["a"]}))
    assert _staged(log) == []


def test_the_cli_produces_a_file_once_per_app_version(tmp_path: Path) -> None:
    url = str(tmp_path / "log")
    log = txn_core.open_log(url)
    log.create_topic("t", 2, SCHEMA)
    data = tmp_path / "day.parquet"
    pq.write_table(pa.table(pa.table({"id": [1, 2, 3]}, schema=SCHEMA)), data)
    cli = [sys.executable, "-m", "txn_core.cli", "produce", url, "t", str(data), "--app-id", "nightly"]

    def run(*extra: str) -> str:
        done = subprocess.run([*cli, *extra], capture_output=True, text=True, check=False, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert "committed 3 rows" in run("--version", "20261123")
    assert "already committed" in run("--version", "20261123")
    # An older version was never committed: it is skipped as one the application has passed, and says so.
    assert "or older than the last version committed for it" in run("--version", "20261122")
    assert _ids(txn_core.open_log(url)) == [1, 2, 3]
    bad = subprocess.run(
        [*cli, "--version", "1", "--format", "csv"], capture_output=True, text=True, timeout=120, check=False
    )
    assert bad.returncode == 1 and "txnlog: error:" in bad.stderr
    lone = subprocess.run([*cli], capture_output=True, text=True, timeout=120, check=False)
    assert lone.returncode == 1 and "--app-id and --version go together" in lone.stderr


TEXT_SCHEMA = pa.schema(
    [("id", pa.int64()), ("code", pa.string()), ("when", pa.string()), ("at", pa.timestamp("us", tz="UTC"))]
)


def test_csv_and_json_lines_are_read_as_the_topic_types_their_columns(tmp_path: Path) -> None:
    """A code ``007`` and a date in a text column stay text (inference made them a number and a timestamp,
    and the file was refused); a value that is not of its column's type names the file and the column types;
    a zone-less time for a UTC column is taken as UTC, as before."""
    from txn_core.cli.produce import read_rows

    csv = tmp_path / "day.csv"
    csv.write_text("id,code,when,at\n1,007,2026-01-02 03:04,2026-01-02 03:04:05\n2,010,soon,2026-01-02 03:04:05\n")
    got = read_rows(str(csv), None, TEXT_SCHEMA)
    assert got.column("code").to_pylist() == ["007", "010"]
    assert got.column("when").to_pylist() == ["2026-01-02 03:04", "soon"]
    assert got.column("id").type == pa.int64()
    jsonl = tmp_path / "day.jsonl"
    jsonl.write_text('{"id": 3, "code": "0042", "when": "2026-01-02 03:04:05", "at": "2026-01-02 03:04:05"}\n')
    got = read_rows(str(jsonl), None, TEXT_SCHEMA)
    assert got.column("when").to_pylist() == ["2026-01-02 03:04:05"] and got.column("code").to_pylist() == ["0042"]

    bad = tmp_path / "bad.csv"
    bad.write_text("id,code,when,at\nabc,1,x,2026-01-02 03:04:05\n")
    with pytest.raises(txn_core.ConfigurationError, match=r"bad.csv.*invalid value 'abc'.*id int64, code string"):
        read_rows(str(bad), None, TEXT_SCHEMA)

    url = str(tmp_path / "log")
    txn_core.open_log(url).create_topic("t", 1, TEXT_SCHEMA)
    for f in (csv, jsonl):
        done = subprocess.run(
            [sys.executable, "-m", "txn_core.cli", "produce", url, "t", str(f)],
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
    c = txn_core.open_log(url).consumer()
    c.assign([("t", 0)])
    rows = c.poll().to_pylist()
    assert [(r["id"], r["code"], r["when"]) for r in rows] == [
        (1, "007", "2026-01-02 03:04"),
        (2, "010", "soon"),
        (3, "0042", "2026-01-02 03:04:05"),
    ]
    assert {r["at"].isoformat() for r in rows} == {"2026-01-02T03:04:05+00:00"}


# --- scope: one application, several topics (Delta's fan-out) -------------------------------------------


def _topic_ids(log: txn_core.Log, topic: str) -> list[int]:
    c = log.consumer()
    c.assign([(topic, p) for p in range(log.topics.get(topic).partitions)])
    out: list[int] = []
    while (got := c.poll()).num_rows:
        out.extend(got.column("id").to_pylist())
    return sorted(out)


def test_one_application_writes_each_version_once_to_each_topic() -> None:
    """Delta scopes (appId, version) to a table: the same unit written to two topics commits once to each,
    and a replay of either commits nothing (it used to be taken for the other topic's, and skipped)."""
    log = _log()
    log.create_topic("u", 1, SCHEMA)
    with AppCommitter(log) as committer:
        for version in (0, 1):
            unit = AppVersion("fanout", run_id="r", version=version)
            rows = pa.table({"id": [version * 10, version * 10 + 1]}, schema=SCHEMA)
            assert committer.write_once(unit, "t", rows).outcome == "committed"
            assert committer.write_once(unit, "u", rows).outcome == "committed"
        # a replay of the last version, after a crash, in a fresh process: nothing more in either topic
    with AppCommitter(txn_core.Log(log.storage)) as again:
        unit = AppVersion("fanout", run_id="r", version=1)
        rows = pa.table({"id": [10, 11]}, schema=SCHEMA)
        assert [again.write_once(unit, t, rows).outcome for t in ("t", "u")] == ["replayed", "replayed"]
    assert _topic_ids(log, "t") == _topic_ids(log, "u") == [0, 1, 10, 11]
    assert {log.transaction_metadata(f"fanout.{t}")["topic"] for t in ("t", "u")} == {"t", "u"}  # type: ignore[index]


def test_an_id_bound_to_one_topic_refuses_a_version_it_cannot_tell_for_another() -> None:
    """A unit built with its transactional id and topic (a Spark query's, or one a user chose) commits under
    exactly that id. The same run's version at or below the id's last one, for another topic, cannot be told
    committed or not: it is refused, naming the topic that holds the version, and nothing is written. A later
    version to another topic is new (a stream whose topic changed between batches)."""
    log = _log()
    log.create_topic("u", 1, SCHEMA)
    rows = pa.table({"id": [1]}, schema=SCHEMA)
    with AppCommitter(log) as committer:
        committer.write_once(AppVersion("mine", run_id="r", version=7, topic="t"), "t", rows)
        with pytest.raises(txn_core.AppScopeError, match="last commit is version 7 of this run to topic 't'") as err:
            committer.write_once(AppVersion("mine", run_id="r", version=7, topic="u"), "u", rows)
        assert (err.value.topic, err.value.other_topic, err.value.version) == ("u", "t", 7)
        with pytest.raises(txn_core.AppScopeError):  # an older version of the run, likewise
            committer.write_once(AppVersion("mine", run_id="r", version=6, topic="u"), "u", rows)
        assert _topic_ids(log, "u") == []
        later = committer.write_once(AppVersion("mine", run_id="r", version=8, topic="u"), "u", rows)
        assert later.outcome == "committed"
        with pytest.raises(txn_core.ConfigurationError, match="bound to topic 'u' and cannot commit to 't'"):
            committer.write_once(AppVersion("mine", run_id="r", version=9, topic="u"), "t", rows)
    assert _topic_ids(log, "t") == _topic_ids(log, "u") == [1]


def test_progress_committed_under_the_bare_application_id_still_counts_for_its_topic() -> None:
    """Units were committed under the application's id itself before units were scoped per topic; a replay
    of the last of them (a query restarted across the upgrade) is still recognised. For another topic the
    same version cannot be told committed or not (an older txnlog may have committed it before the last
    commit, or skipped it): refused, naming the application id; a later version is new."""
    log = _log()
    log.create_topic("u", 1, SCHEMA)
    rows = pa.table({"id": [5]}, schema=SCHEMA)
    with AppCommitter(log) as committer:  # what an earlier version wrote: progress under "legacy" naming "t"
        committer.write_once(AppVersion("legacy", run_id="r", version=3, topic="t"), "t", rows)
    with AppCommitter(txn_core.Log(log.storage)) as committer:
        unit = AppVersion("legacy", run_id="r", version=3)
        assert committer.write_once(unit, "t", rows).outcome == "replayed"
        with pytest.raises(txn_core.AppScopeError, match=r"application id 'legacy'.*under a new application id"):
            committer.write_once(unit, "u", rows)
        assert committer.write_once(AppVersion("legacy", run_id="r", version=4), "u", rows).outcome == "committed"
        assert committer.write_once(AppVersion("legacy", run_id="r", version=4), "t", rows).outcome == "committed"
    assert _topic_ids(log, "t") == [5, 5] and _topic_ids(log, "u") == [5]
    runs = log.transaction_metadata("legacy.t")["runs"]  # type: ignore[index]
    assert runs == [["r", 4]], "the scoped id carries the run on"


def test_a_committer_still_using_the_bare_application_id_is_fenced_by_the_first_scoped_commit() -> None:
    """A committer of the older kind in the middle of a unit under the bare application id (a zombie, a
    driver not yet upgraded) must not commit after the scoped id committed the same unit: the first scoped
    commit fences the bare id before reading its progress."""
    log = _log()
    rows = pa.table({"id": [5]}, schema=SCHEMA)
    with AppCommitter(log) as committer:
        committer.write_once(AppVersion("legacy", run_id="r", version=4, topic="t"), "t", pa.table({"id": [4]}))
    old_unit = AppVersion("legacy", run_id="r", version=5, topic="t")  # the older kind: exactly the bare id
    zombie = log.producer("legacy")
    zombie.init_transactions()
    zombie.begin_transaction()
    zombie.send("t", rows)
    with AppCommitter(txn_core.Log(log.storage)) as committer:
        assert committer.write_once(AppVersion("legacy", run_id="r", version=5), "t", rows).outcome == "committed"
    with pytest.raises(txn_core.ProducerFencedError):
        zombie.commit_transaction(metadata=old_unit.progress("t", [], None).to_json())
    assert _topic_ids(txn_core.Log(log.storage), "t") == [4, 5]


def test_an_abort_after_another_topics_later_version_deletes_nothing() -> None:
    """Version 5 to 'u' under an id a user named; its commit raised after the commit point; version 6 of
    the run then committed to 't'. The abort of version 5 cannot tell it uncommitted: it deletes nothing."""
    log = _log()
    log.create_topic("u", 1, SCHEMA)
    unit = AppVersion("mine", run_id="r", version=5, topic="u")
    refs = stage_table(log, unit, "u", pa.table({"id": [55]}, schema=SCHEMA), partition=0)
    _, kept = commit_staged(log, unit, refs, topic="u")
    assert kept is not None
    kept[0].close()
    with AppCommitter(log) as committer:
        committer.write_once(AppVersion("mine", run_id="r", version=6, topic="t"), "t", pa.table({"id": [6]}))
    assert abort_staged(log, unit, refs) == 0
    assert _topic_ids(txn_core.Log(log.storage), "u") == [55]


def test_scoped_ids_are_valid_names_and_long_ones_are_hashed_apart() -> None:
    from txn_core.clients.appunit import scoped_transactional_id
    from txn_core.format.ids import validate_name

    assert scoped_transactional_id("loader", "orders") == "loader.orders"
    long_app, long_topic = "a" * 200, "t" * 200
    one, two = scoped_transactional_id(long_app, long_topic), scoped_transactional_id(long_app, long_topic + "x")
    assert one != two and len(one) <= 200 and validate_name("transactional id", one) == one


def test_abort_of_a_unit_bound_to_no_topic_needs_the_topic() -> None:
    log = _log()
    unit = AppVersion("app", run_id="r", version=0)
    with pytest.raises(txn_core.ConfigurationError, match="pass topic="):
        abort_staged(log, unit, [])
    assert abort_staged(log, unit, [], topic="t") == 0
    refs = stage_table(log, unit, "t", pa.table({"id": [1]}, schema=SCHEMA), partition=0)
    assert abort_staged(log, unit, refs) == 1 and _staged(log) == [], "the refs tell the topic"


def test_the_cli_writes_one_app_version_to_two_topics(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from txn_core.cli import main

    url = str(tmp_path / "log")
    log = txn_core.open_log(url)
    log.create_topic("t", 1, SCHEMA)
    log.create_topic("u", 1, SCHEMA)
    data = tmp_path / "day.parquet"
    pq.write_table(pa.table({"id": [1, 2]}, schema=SCHEMA), data)

    def produce(topic: str) -> str:
        assert main(["produce", url, topic, str(data), "--app-id", "loader", "--version", "7"]) == 0
        return capsys.readouterr().out

    assert "committed 2 rows to t" in produce("t")
    assert "committed 2 rows to u" in produce("u")
    assert "already committed" in produce("u")
    fresh = txn_core.open_log(url)
    assert _topic_ids(fresh, "t") == _topic_ids(fresh, "u") == [1, 2]


def test_a_kept_unit_returns_at_its_commit_point_and_its_next_unit_carries_its_markers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A kept producer's unit returns at its commit point, visible whatever its markers; the next unit does
    not wait for them: its references carry them into the partitions (PROTOCOL.md "Carried markers"), and
    a lone write of them, held here, is never needed."""
    import threading

    from txn_core.clients.producer import completion
    from txn_core.coordinator.service import TransactionCoordinator

    log = _log()
    held = threading.Event()
    write_markers = TransactionCoordinator.write_markers
    alone: list[object] = []

    def slow_markers(self: TransactionCoordinator, prepared: object, paths: Any = None) -> None:
        alone.append(getattr(prepared, "txn", None))
        assert held.wait(30)
        write_markers(self, prepared, paths)  # type: ignore[arg-type]

    monkeypatch.setattr(TransactionCoordinator, "write_markers", slow_markers)
    # records as dear as an object store's: the producer leaves its markers to the next unit or its completer
    monkeypatch.setattr(completion, "FAST_RECORD_S", 0.0)
    with AppCommitter(log) as committer:
        first = committer.write_once(AppVersion("loader", run_id="r", version=0), "t", pa.table({"id": [1, 2]}))
        assert first.outcome == "committed"
        assert _ids(log) == [1, 2], "visible from the commit point, markers or not"
        second = committer.write_once(AppVersion("loader", run_id="r", version=1), "t", pa.table({"id": [3, 4]}))
        assert second.outcome == "committed"
        assert not alone, "the first unit's markers travelled in the second unit's entries"
        held.set()
    assert _ids(log) == [1, 2, 3, 4]
    carried = [
        h.carried
        for part in (0, 1)
        for plog in [log.partition_log(paths.partition_log_path("t", part))]
        for h in (plog.read_header(s) for s in range(plog.tail(refresh=True)[0]))
        if h.carried is not None
    ]
    assert carried and len({m.txn for m in carried}) == 1 and all(m.committed for m in carried), carried
    assert not [k for k in _staged(log) if "_manifest-" in k], "every cleanup finished by close()"


def test_a_kept_unit_whose_markers_failed_is_committed_and_the_next_unit_commits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A marker write that fails once (behind the returned commit on an object store) leaves the unit
    committed, whatever the store said, and the application's next unit commits."""
    from txn_core.coordinator.service import TransactionCoordinator
    from txn_core.errors import StorageError

    log = _log()
    failures = iter([True])
    write_markers = TransactionCoordinator.write_markers

    def flaky(self: TransactionCoordinator, prepared: object, paths: Any = None) -> None:
        if next(failures, False):
            raise StorageError("markers lost on the way")
        write_markers(self, prepared, paths)  # type: ignore[arg-type]

    monkeypatch.setattr(TransactionCoordinator, "write_markers", flaky)
    with AppCommitter(log) as committer:
        first = committer.write_once(AppVersion("loader", run_id="r", version=0), "t", pa.table({"id": [1]}))
        assert first.outcome == "committed"
        second = committer.write_once(AppVersion("loader", run_id="r", version=1), "t", pa.table({"id": [2]}))
        assert second.outcome == "committed"
    assert _ids(log) == [1, 2]


def test_a_committer_starting_from_storage_finishes_the_cleanup_a_dead_committer_left() -> None:
    """A committer that dies after its commit point, before its cleanup, leaves a committed unit's manifest
    and failed attempts' objects. The id's next committer that starts from storage finishes that cleanup
    from the manifest (behind its own unit); the committed data stays."""
    import time

    class DiedError(Exception):
        pass

    def die(point: str) -> None:
        if point == "after_prepare":
            raise DiedError(point)

    log = _log()
    unit = AppVersion("loader", run_id="r", version=0).for_topic("t")
    stray = _failed_attempt(log, unit)
    assert stray is not None
    refs = stage_table(log, unit, "t", pa.table({"id": [1]}, schema=SCHEMA), partition=0)
    with pytest.raises(DiedError):
        commit_staged(log, unit, refs, topic="t", hit=die)  # committed: its PrepareCommit is durable
    left = _staged(log)
    assert stray.key in left and any("_manifest-" in k for k in left), "the cleanup never ran"
    fresh = txn_core.Log(log.storage)
    nxt = AppVersion("loader", run_id="r", version=1)
    with AppCommitter(fresh) as committer:
        assert committer.write_once(nxt, "t", pa.table({"id": [2]}, schema=SCHEMA), partition=0).outcome == "committed"
    deadline = time.monotonic() + 30
    while (stray.key in _staged(log) or any("_manifest-" in k for k in _staged(log))) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sorted(_staged(log)) == sorted([r.key for r in refs] + [k for k in _staged(log) if "/r.1/" in k])
    assert stray.key not in _staged(log) and not any("_manifest-" in k for k in _staged(log))
    assert _ids(log) == [1, 2]
