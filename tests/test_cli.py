"""The ``txnlog`` command line, through its real entry point (``python -m txn_core.cli`` in a subprocess).

Each test builds a small log in-process (fast), then runs the CLI against it and checks what a person or a
script sees: tables, JSON, one-line errors and exit codes. Subprocesses cost ~0.3-1 s each, so each test
groups its assertions; the many small argument checks run ``main()`` in-process.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from fakeclock import FakeClock
from raw_entries import append_data

import txn_core
from txn_core import cli
from txn_core.cli.output import Progress, format_bytes, format_duration, render_table
from txn_core.cli.schemaspec import format_schema, parse_schema
from txn_core.clock import system_clock
from txn_core.format import paths
from txn_core.partition.staging import staging_prefix, write_staged

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string())])
ENV = {**os.environ, "PYTHONWARNINGS": "ignore", "COLUMNS": "200"}


@dataclass
class Result:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


Command = tuple[tuple[str | Path, ...], int]


def cmd(*args: str | Path, code: int = 0) -> Command:
    """A command line for :func:`txnlog_all` and the exit code it must end with."""
    return args, code


def txnlog_all(*commands: Command) -> list[Result]:
    """Run independent ``txnlog`` command lines as concurrent processes; assert their exit codes."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "txn_core.cli", *map(str, args)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=ENV,
        )
        for args, _ in commands
    ]
    results = []
    for (args, code), proc in zip(commands, procs, strict=True):
        out, err = proc.communicate(timeout=120)
        result = Result(proc.returncode, out, err)
        assert proc.returncode == code, f"txnlog {' '.join(map(str, args))} exited {proc.returncode}: {result}"
        results.append(result)
    return results


def txnlog(*args: str | Path, code: int = 0) -> Result:
    """Run ``txnlog ARGS`` as a separate process; assert its exit code."""
    return txnlog_all(cmd(*args, code=code))[0]


def txnlog_inprocess(capsys: pytest.CaptureFixture[str], *args: str | Path) -> Result:
    """Run ``main(ARGS)`` in this process (for the many small argument checks)."""
    try:
        code = cli.main([str(a) for a in args])
    except SystemExit as exc:  # argparse: --help and usage errors
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return Result(code, out, err)


@pytest.fixture
def here(capsys: pytest.CaptureFixture[str]) -> Callable[..., Result]:
    """``here(*ARGS, code=0)``: run ``main(ARGS)`` in this process and assert its exit code (variants of a
    verb already run through the real entry point: no interpreter start-up to pay)."""

    def run(*args: str | Path, code: int = 0) -> Result:
        result = txnlog_inprocess(capsys, *args)
        assert result.code == code, f"txnlog {' '.join(map(str, args))} exited {result.code}: {result}"
        return result

    return run


def one_error_line(result: Result, *fragments: str) -> None:
    """Exactly one line on stderr, ``txnlog: error: ...``, containing every fragment; nothing on stdout."""
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("txnlog: error: "), result.err
    for f in fragments:
        assert f in lines[0], (f, lines[0])
    assert result.out == ""


def build_scenario(directory: Path) -> Path:
    """A log with committed, aborted, hanging and open transactions and a consumer group.

    ``orders`` (2 partitions): ``copier`` committed 2 transactions and aborted one (after its rows were
    written); group ``billing`` committed offsets part-way; ``stuck`` opened a transaction two hours ago
    (60 s timeout) in partition 0 and died; ``fresh`` has a transaction open in partition 1 (15 min
    timeout), followed by one non-transactional record.
    """
    url = directory / "log"
    now = int(time.time() * 1000)
    log = txn_core.open_log(str(url))
    log.create_topic("orders", 2, SCHEMA)
    # markers alone, an offset each: the offsets below count them (carried markers: test_carried_markers.py)
    with log.producer("copier", marker_linger_ms=0) as p:
        p.init_transactions()
        for t in range(3):
            p.begin_transaction()
            p.send(
                "orders",
                pa.table({"id": list(range(t * 5, t * 5 + 5)), "name": [f"n{i}" for i in range(5)]}),
                key_column="id",
            )
            if t == 1:
                p.flush()
                p.abort_transaction()
            else:
                p.commit_transaction()
    c = log.consumer("billing")
    c.assign([("orders", 0), ("orders", 1)])
    c.seek(("orders", 0), 2)
    c.commit()
    stale = txn_core.open_log(str(url), clock=FakeClock(now - 2 * 3600_000))
    stuck = stale.producer("stuck", transaction_timeout_ms=60_000)
    stuck.init_transactions()
    stuck.begin_transaction()
    stuck.send("orders", pa.table({"id": [100], "name": ["x"]}), partition=0)
    stuck.flush()
    stuck.close()  # the open transaction is left behind, as if the process had died
    fresh = log.producer("fresh", transaction_timeout_ms=900_000)
    fresh.init_transactions()
    fresh.begin_transaction()
    fresh.send("orders", pa.table({"id": [200], "name": ["y"]}), partition=1)
    fresh.flush()
    fresh.close()
    with log.producer() as plain:
        plain.send("orders", pa.table({"id": [300], "name": ["z"]}), partition=1)
    return url


@pytest.fixture
def scenario(tmp_path: Path) -> Path:
    """A fresh :func:`build_scenario` log for a test that changes it."""
    return build_scenario(tmp_path)


@pytest.fixture(scope="module")
def shared_scenario(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One :func:`build_scenario` log for the argument checks, which leave it as it is."""
    return build_scenario(tmp_path_factory.mktemp("shared"))


# --- help and grammar ----------------------------------------------------------------------------


def test_help_everywhere(capsys: pytest.CaptureFixture[str]) -> None:
    top = txnlog("--help")
    for noun in ("topics", "transactions", "groups", "subscriptions", "dump", "maintenance", "demo"):
        assert noun in top.out
    assert "examples:" in top.out
    verbs = {
        "topics": ["create", "list", "describe", "add-partitions", "set-retention"],
        "transactions": ["list", "describe", "abort", "find-hanging", "expire"],
        "groups": ["list", "describe"],
        "subscriptions": ["list", "describe", "skip-lost"],
        "maintenance": ["snapshot", "compact", "retention", "roll", "sweep-staging", "damaged", "mark-lost"],
    }
    for noun, names in verbs.items():
        r = txnlog_inprocess(capsys, noun, "--help")
        assert r.code == 0 and all(v in r.out for v in names) and f"examples:\n  txnlog {noun} " in r.out, r.out
        for verb in names:
            r = txnlog_inprocess(capsys, noun, verb, "--help")
            assert r.code == 0, r
            assert "URL" in r.out and "--storage-option" in r.out and "--json" in r.out, r.out
            assert f"examples:\n  txnlog {noun} {verb}" in r.out, r.out
    for single in ("dump", "demo"):
        r = txnlog_inprocess(capsys, single, "--help")
        assert r.code == 0 and f"txnlog {single}" in r.out
    r = txnlog_inprocess(capsys, "--version")
    assert r.code == 0 and txn_core.__version__ in r.out


def test_console_script_is_installed(tmp_path: Path) -> None:
    script = shutil.which("txnlog", path=str(Path(sys.executable).parent))
    if script is None:
        pytest.skip("the txnlog console script is not installed next to this interpreter")
    proc = subprocess.run(
        [script, "topics", "list", str(tmp_path / "none")], capture_output=True, text=True, env=ENV, check=False
    )
    assert proc.returncode == 1
    assert proc.stderr.startswith("txnlog: error: no txnlog at")


# --- topics ------------------------------------------------------------------------------------


def test_topics_create_list_describe_add_partitions_set_retention(tmp_path: Path, here: Callable[..., Result]) -> None:
    url = tmp_path / "new-log"
    created = txnlog(
        "topics",
        "create",
        url,
        "orders",
        "--partitions",
        "3",
        "--schema",
        "id:int64 not null,name:string,ts:timestamp[ms, UTC]",
        "--retention-ms",
        "86400000",
    )
    assert "created topic 'orders'" in created.out and "3 partition(s)" in created.out
    log = txn_core.open_log(str(url))
    meta = log.topics.get("orders")
    assert meta.partitions == 3 and meta.config.retention_ms == 86_400_000
    assert meta.schema == pa.schema(
        [pa.field("id", pa.int64(), nullable=False), ("name", pa.string()), ("ts", pa.timestamp("ms", tz="UTC"))]
    )
    with log.producer() as p:
        p.send(
            "orders",
            pa.table(
                {"id": [1, 2, 3], "name": ["a", "b", "c"], "ts": pa.array([0, 1, 2], pa.timestamp("ms", tz="UTC"))}
            ),
            partition=2,
        )

    listed_json, grown, kept_json = txnlog_all(
        cmd("topics", "list", url, "--json"),
        cmd("topics", "add-partitions", url, "orders", "--total", "5"),
        cmd("topics", "set-retention", url, "orders", "--retention-bytes", "1000000", "--json"),
    )
    # add-partitions and set-retention ran at once: each retried on the other's new version, neither is lost.
    assert "now has 5 partitions (was 3)" in grown.out
    kept = kept_json.json()
    assert (kept["retention_ms"], kept["retention_bytes"]) == (86_400_000, 1_000_000)
    (listed,) = listed_json.json()
    schema = "id:int64 not null,name:string,ts:timestamp[ms, UTC]"
    assert listed["schema"] == schema and listed["partitions"] in (3, 5) and listed["created_ms"] == meta.created_ms
    listed_table = here("topics", "list", url)
    described_json = here("topics", "describe", url, "orders", "--partition", "2", "--json")
    table = listed_table.out.splitlines()
    assert table[0].split() == ["topic", "partitions", "retention", "schema"]
    assert table[1].split()[:2] == ["orders", "5"] and "1 d 00 h, 976.6 KiB/partition" in table[1]

    described = described_json.json()
    assert [d["partition"] for d in described["partition_details"]] == [2]
    assert described["partition_details"][0] | {"size_bytes": 0} == {
        "partition": 2,
        "log_start_offset": 0,
        "log_end_offset": 3,
        "last_stable_offset": 3,
        "held_back": 0,
        "ongoing_transactions": [],
        "aborted_transactions": 0,
        "committed_transactions": 0,
        "size_bytes": 0,
    }
    cleared = here("topics", "set-retention", url, "orders", "--retention-ms", "none")
    assert "976.6 KiB/partition" in cleared.out
    meta = txn_core.open_log(str(url)).topics.get("orders")
    assert (meta.partitions, meta.config.retention_ms, meta.config.retention_bytes) == (5, None, 1_000_000)


def test_topics_describe_shows_the_last_stable_offset_and_open_transactions(
    scenario: Path, here: Callable[..., Result]
) -> None:
    text = txnlog("topics", "describe", scenario, "orders").out
    assert "schema:     id:int64,name:string" in text
    header, p0, p1 = text.split("\n\n")[1].splitlines()
    assert header.split() == [
        "partition",
        "log",
        "start",
        "log",
        "end",
        "LSO",
        "held",
        "back",
        "open",
        "txns",
        "aborted",
        "committed",
        "size",
    ]
    # Partition 0: stuck was past its timeout, so describe (a reader) aborted it; its ABORT marker is offset 12.
    # Partition 1: fresh's open transaction holds the LSO at its first offset (10), one record behind it.
    assert p0.split()[:8] == ["0", "0", "13", "13", "0", "0", "2", "2"]
    assert p1.split()[:8] == ["1", "0", "12", "10", "2", "1", "1", "2"]
    assert "open transactions:" in text and "fresh" in text and "Ongoing" in text
    detail = here("topics", "describe", scenario, "orders", "--json").json()["partition_details"][1]
    (ongoing,) = detail["ongoing_transactions"]
    assert ongoing["transactional_id"] == "fresh" and ongoing["first_offset"] == 10 and ongoing["state"] == "Ongoing"
    assert 0 <= ongoing["age_ms"] < 600_000
    assert detail["last_stable_offset"] == 10 and detail["log_end_offset"] == 12 and detail["held_back"] == 2


# --- transactions --------------------------------------------------------------------------------


def test_transactions_list_describe_find_hanging_abort_expire(scenario: Path, here: Callable[..., Result]) -> None:
    listed_json, hanging, described = txnlog_all(
        cmd("transactions", "list", scenario, "--json"),
        cmd("transactions", "find-hanging", scenario),
        cmd("transactions", "describe", scenario, "stuck"),
    )
    everything = here("transactions", "list", scenario, "--all")
    hanging_by_age = here("transactions", "find-hanging", scenario, "--topic", "orders", "--max-age-ms", "0", "--json")
    listed = listed_json.json()
    assert {r["transactional_id"]: r["state"] for r in listed} == {"fresh": "Ongoing", "stuck": "Ongoing"}
    stuck_row = next(r for r in listed if r["transactional_id"] == "stuck")
    assert stuck_row["age_ms"] >= 2 * 3600_000 and stuck_row["timeout_ms"] == 60_000
    assert "copier" in everything.out and "CompleteCommit" in everything.out

    assert "stuck" in hanging.out and "ongoing past its timeout of 60000 ms" in hanging.out
    assert "fresh" not in hanging.out.split("to release them")[0]
    assert f"txnlog transactions abort {scenario} stuck" in hanging.out
    assert sorted((h["transactional_id"], h["partition"], h["first_offset"]) for h in hanging_by_age.json()) == [
        ("fresh", 1, 10),
        ("stuck", 0, 11),
    ]

    assert "Ongoing" in described.out and "topics/orders/00000" in described.out and "2 h 00 m" in described.out

    aborted, expired = txnlog_all(
        cmd("transactions", "abort", scenario, "fresh"), cmd("transactions", "expire", scenario, "--json")
    )
    assert "aborted transaction" in aborted.out and "'fresh'" in aborted.out and "fenced" in aborted.out
    again = here("transactions", "abort", scenario, "fresh", "--json")
    assert again.json()["aborted"] is False and again.json()["after"]["state"] == "CompleteAbort"
    assert expired.json() == {"expired": 1}  # stuck, past its timeout

    none_open = here("transactions", "list", scenario)
    none_hanging = here("transactions", "find-hanging", scenario)
    reason = here("transactions", "describe", scenario, "stuck", "--json")
    assert none_open.out.strip() == f"no open transactions in file://{scenario}"
    assert none_hanging.out.strip() == "no hanging transactions"
    assert reason.json()["state"] == "CompleteAbort" and reason.json()["abort_reason"] == "timeout"


# --- groups --------------------------------------------------------------------------------------


def test_groups_list_and_describe_lag_against_the_last_stable_offset(
    scenario: Path, here: Callable[..., Result]
) -> None:
    listed, described_json = txnlog_all(
        cmd("groups", "list", scenario, "--json"), cmd("groups", "describe", scenario, "billing", "--json")
    )
    text = here("groups", "describe", scenario, "billing")
    assert listed.json() == ["billing"]
    described = described_json.json()
    rows = {r["partition"]: r for r in described["partitions"]}
    # partition 0: committed 2; the stuck transaction is aborted by the lookup (a reader): nothing holds the LSO.
    assert rows[0]["committed"] == 2 and rows[0]["last_stable_offset"] == rows[0]["log_end_offset"] >= 12
    assert rows[0]["lag"] == rows[0]["last_stable_offset"] - 2
    # partition 1: committed 0 (its start); fresh's open transaction holds the LSO at 10 < end 12.
    assert (rows[1]["committed"], rows[1]["last_stable_offset"], rows[1]["log_end_offset"], rows[1]["lag"]) == (
        0,
        10,
        12,
        10,
    )
    assert described["total_lag"] == rows[0]["lag"] + 10
    assert text.out.splitlines()[0].split()[:6] == ["topic", "partition", "committed", "LSO", "log", "end"]
    assert "total lag: " in text.out


def test_subscriptions_list_describe_and_skip_lost_after_retention(tmp_path: Path, here: Callable[..., Result]) -> None:
    from txn_core.ops import maintenance

    url = str(tmp_path / "log")
    log = txn_core.open_log(url)
    log.create_topic("orders", 2, pa.schema([("id", pa.int64())]))
    p = log.producer()
    for i in range(7):
        if i == 4:
            time.sleep(0.05)  # 0-3 older than 4-6
        p.send("orders", pa.table({"id": [i]}), partition=0)
        p.flush()
    c = log.subscribe("orders", 0, "billing")
    got = c.receive(10)
    c.acknowledge([0, 1, 4, 5])  # 2-3 and 6 not: the mark-delete is 2
    c.close()
    audit = log.subscribe("orders", 1, "audit", subscription_type="exclusive", consumer_name="auditor")
    newer = int(got["_timestamp"][4].as_py().timestamp() * 1000)
    retained = maintenance.apply_retention(
        log, "orders", retention_ms=20, now_ms=newer + 5, min_age_ms=0, check_min_age=False
    )
    assert retained[0].new_start == 4  # 2-3 removed unacknowledged; 4-5 acknowledged; 6 not
    listed = here("subscriptions", "list", url, "--json").json()
    assert listed == [
        {"topic": "orders", "partition": 0, "subscription": "billing", "type": "shared"},
        {"topic": "orders", "partition": 1, "subscription": "audit", "type": "exclusive"},
    ]
    before = here("subscriptions", "describe", url, "orders", "0", "billing", "--json").json()
    assert before["mark_delete"] == 2 and before["backlog"] == 5 and before["acked_above_mark_delete"] == 2
    assert before["type"] == "shared" and before["active_consumer"] is None
    held = here("subscriptions", "describe", url, "orders", "1", "audit")
    assert held.out.splitlines()[1].split()[3:5] == ["exclusive", audit.consumer_id], held.out
    audit.close()
    released = here("subscriptions", "describe", url, "orders", "1", "audit", "--json").json()
    assert released["type"] == "exclusive" and released["active_consumer"] is None
    standby = log.subscribe("orders", 1, "backup", subscription_type="failover", consumer_name="standby")
    failover = here("subscriptions", "describe", url, "orders", "1", "backup")
    assert failover.out.splitlines()[1].split()[3:5] == ["failover", "(none)"], failover.out  # nothing received
    assert f"  consumers: {standby.consumer_id}" in failover.out
    standby.close()
    skipped = txnlog("subscriptions", "skip-lost", url, "orders", "0", "billing")
    assert "moved the subscription from 2 to 6, past offsets retention removed" in skipped.out, skipped.out
    again = here("subscriptions", "skip-lost", url, "orders", "0", "billing", "--json").json()
    assert again == {"moved": 0, "mark_delete": 6}
    assert txn_core.open_log(url).subscribe("orders", 0, "billing").receive(10)["id"].to_pylist() == [6]
    one_error_line(here("subscriptions", "describe", url, "orders", "0", "bill", code=1), "'bill'", "billing")
    one_error_line(here("subscriptions", "skip-lost", url, "orders", "2", "billing", code=1), "no partition 2")


def test_subscriptions_describe_shows_a_key_shared_ones_key_ranges(tmp_path: Path, here: Callable[..., Result]) -> None:
    url = str(tmp_path / "log")
    log = txn_core.open_log(url)
    log.create_topic("events", 1, pa.schema([("id", pa.int64()), ("user", pa.string())]))
    p = log.producer()
    p.send("events", pa.table({"id": list(range(64)), "user": [f"u{i % 16}" for i in range(64)]}), partition=0)
    p.close()
    low = log.subscribe("events", 0, "by-user", subscription_type="key_shared", key_column="user",
                        key_ranges=[(0, 32767)], consumer_name="low")  # fmt: skip
    high = log.subscribe("events", 0, "by-user", subscription_type="key_shared", key_column="user",
                         key_ranges=[(32768, 65535)], consumer_name="high")  # fmt: skip
    assert low.receive(100).num_rows and high.receive(100).num_rows
    text = here("subscriptions", "describe", url, "events", "0", "by-user").out
    assert text.splitlines()[1].split()[3:4] == ["key_shared"], text
    assert f"  consumers: {high.consumer_id}, {low.consumer_id}" in text
    assert "  keys: column 'user', sticky" in text
    lines = [line for line in text.splitlines() if "key ranges of" in line]
    held = {line.split(":")[0].split()[-1]: line.split(": ")[1] for line in lines}
    assert set(held) == {low.consumer_id, high.consumer_id}
    spans = [tuple(int(x) for x in r.split("-")) for r in held[low.consumer_id].split(", ")]
    assert all(0 <= a <= b <= 32767 for a, b in spans)  # the slices it holds: those its keys hash into
    described = here("subscriptions", "describe", url, "events", "0", "by-user", "--json").json()
    assert described["type"] == "key_shared" and described["key_mode"] == "sticky"
    assert described["key_holders"][high.consumer_id] and described["key_column"] == "user"
    listed = here("subscriptions", "list", url, "--json").json()
    assert listed == [{"topic": "events", "partition": 0, "subscription": "by-user", "type": "key_shared"}]
    low.close()
    high.close()


def test_subscriptions_describe_counts_dead_letters(tmp_path: Path, here: Callable[..., Result]) -> None:
    url = str(tmp_path / "log")
    log = txn_core.open_log(url)
    log.create_topic("jobs", 1, pa.schema([("id", pa.int64())]))
    p = log.producer()
    p.send("jobs", pa.table({"id": [1, 2]}), partition=0)
    p.close()
    none = here("subscriptions", "describe", url, "jobs", "0", "runner", code=1)
    c = log.subscribe("jobs", 0, "runner", nack_delay_ms=0, dead_letter_policy=txn_core.DeadLetterPolicy(0))
    c.negative_acknowledge(c.receive(10))
    assert not c.receive(10).num_rows  # both dead-lettered
    c.close()
    text = here("subscriptions", "describe", url, "jobs", "0", "runner")
    assert "  dead letters: 2 in jobs-runner-DLQ" in text.out, text.out
    described = here("subscriptions", "describe", url, "jobs", "0", "runner", "--json").json()
    assert (described["dead_letter_topic"], described["dead_lettered"]) == ("jobs-runner-DLQ", 2)
    other = here("subscriptions", "describe", url, "jobs", "0", "runner", "--dead-letter-topic", "elsewhere", "--json")
    assert (other.json()["dead_letter_topic"], other.json()["dead_lettered"]) == ("elsewhere", None)
    assert "'runner'" in none.err


# --- dump ----------------------------------------------------------------------------------------


def test_dump_isolation_levels_control_records_ranges_and_limits(scenario: Path, here: Callable[..., Result]) -> None:
    committed_out, raw_out = txnlog_all(
        cmd("dump", scenario, "orders", "--partition", "1"),
        cmd(
            "dump",
            scenario,
            "orders",
            "--partition",
            "1",
            "--isolation",
            "read_uncommitted",
            "--show-control",
            "--json",
        ),
    )
    window_out = here(
        "dump",
        scenario,
        "orders",
        "--partition",
        "1",
        "--partition",
        "1",  # repeated: read once
        "--from",
        "1",
        "--to",
        "3",
        "--isolation",
        "read_uncommitted",
        "--json",
    )
    limited = here("dump", scenario, "orders", "--limit", "3", "--show-control")
    committed = committed_out.out.splitlines()
    assert committed[0].split() == ["partition", "offset", "timestamp", "id", "name"]
    offsets = [int(line.split()[1]) for line in committed[1:]]
    # read_committed: the aborted transaction's rows and everything from fresh's open transaction on are held.
    ids = [int(line.split()[4]) for line in committed[1:]]
    assert max(offsets) < 10 and 200 not in ids and 300 not in ids
    assert not set(ids) & {5, 6, 7, 8, 9}

    raw = [json.loads(line) for line in raw_out.out.splitlines()]
    kinds = [(r["_offset"], r["_kind"]) for r in raw]
    assert [o for o, _ in kinds] == list(range(12))  # every offset: data and markers, dense
    assert sum(k == "COMMIT" for _, k in kinds) == 2 and sum(k == "ABORT" for _, k in kinds) == 1
    marker = next(r for r in raw if r["_kind"] == "ABORT")
    assert marker["_transactional_id"] == "copier" and marker["_txn"]
    aborted_rows = [r for r in raw if r["_kind"] == "data" and r["_txn"] == marker["_txn"]]
    assert aborted_rows and {r["id"] for r in aborted_rows} <= {5, 6, 7, 8, 9}
    assert [r["id"] for r in raw if r["_offset"] >= 10] == [200, 300]
    assert raw[0]["_timestamp"].endswith("+00:00")

    window = [json.loads(line) for line in window_out.out.splitlines()]
    assert [r["_offset"] for r in window] == [1, 2]
    assert list(window[0]) == ["_partition", "_offset", "_timestamp", "id", "name"]

    assert len(limited.out.splitlines()) >= 1 + 3
    assert sum(" data " in line for line in limited.out.splitlines()) == 3
    assert "showing the first 3 records" in limited.err


# --- maintenance ---------------------------------------------------------------------------------


def test_maintenance_snapshot_compact_retention_sweep(scenario: Path, here: Callable[..., Result]) -> None:
    log = txn_core.open_log(str(scenario))
    ref = write_staged(
        log.storage,
        staging_prefix("cli-test", 1),
        "orders",
        0,
        pa.table({"id": [1], "name": ["a"]}).to_batches(),
        SCHEMA,
        clock=system_clock,
    )
    assert ref is not None  # a staged object no entry references: what a failed Spark task leaves behind
    snaps, compacted, swept = txnlog_all(
        cmd("maintenance", "snapshot", scenario, "--json"),
        cmd("maintenance", "compact", scenario, "--min-age-ms", "0", "--no-age-check"),
        cmd("maintenance", "sweep-staging", scenario, "--older-than-ms", "0", "--no-age-check", "--json"),
    )
    assert [(s["topic"], s["partition"]) for s in snaps.json()] == [("orders", 0), ("orders", 1)]
    assert log.storage.list(paths.buffer_snapshots(paths.partition_log_path("orders", 0)))
    assert "snapshotted 16 coordinator partitions" in compacted.out and "deleted" in compacted.out
    assert swept.json() == {"staged_objects_deleted": 1}
    assert not log.storage.exists(ref.key)

    # Retention: partition 1 keeps everything from fresh's open transaction on (offset 10).
    retain = ("maintenance", "retention", scenario, "--topic", "orders", "--retention-ms", "1")
    retained = txnlog(*retain, "--min-age-ms", "0", "--no-age-check", "--json")
    by_partition = {r["partition"]: r for r in retained.json()}
    assert by_partition[1]["new_start"] == 10 and by_partition[1]["entries_deleted"] > 0
    # stuck, past its timeout, is aborted by retention's own read bound: nothing holds partition 0 back.
    assert by_partition[0]["new_start"] >= 12
    text = here(*retain, "--min-age-ms", "0", "--no-age-check").out
    assert text.splitlines()[0].split() == [
        "topic",
        "partition",
        "old",
        "start",
        "new",
        "start",
        "entries",
        "deleted",
        "freed",
    ]
    assert text.splitlines()[2].split() == ["orders", "1", "10", "10", "0", "0", "B"]  # held by fresh's transaction
    assert "(entries younger than 0 ms and data of open transactions are kept)" in text
    # A topic without retention named with --topic: the way out is the CLI's own, not a Python call.
    unset = here("maintenance", "retention", scenario, "--topic", "orders", "--no-age-check", code=1)
    assert "'txnlog topics set-retention'" in unset.err and "Log.set_retention" not in unset.err


def _three_entries(tmp_path: Path) -> Path:
    """A log whose topic ``orders`` holds three entries of two records each (ids 0..5); returns its path."""
    url = tmp_path / "log"
    log = txn_core.open_log(str(url))
    log.create_topic("orders", 1, SCHEMA)
    with log.producer() as producer:
        for n in range(3):
            producer.send("orders", pa.table({"id": [2 * n, 2 * n + 1], "name": ["a", "b"]}), partition=0)
            producer.flush()
    return url


def test_dump_shows_what_precedes_damage_and_a_range_before_it_is_clean(
    tmp_path: Path, here: Callable[..., Result]
) -> None:
    """The table output of ``dump`` printed nothing when the read met a damaged entry (``--json`` streamed the
    records before it), and ``--to`` just before the damage still failed: the read polled on into it."""
    url = _three_entries(tmp_path)
    entry = url / paths.entries(paths.partition_log_path("orders", 0)) / paths.slot_name(2)
    data = bytearray(entry.read_bytes())
    data[-3] ^= 0x01  # the payload checksum no longer matches
    entry.write_bytes(bytes(data))

    for extra in ([], ["--show-control"]):
        failed = here("dump", url, "orders", *extra, code=1)
        ids = [line.split()[4 + (2 if extra else 0)] for line in failed.out.splitlines()[1:]]
        assert ids == ["0", "1", "2", "3"], failed.out
        assert "is damaged" in failed.err and "payload checksum mismatch" in failed.err
    before = here("dump", url, "orders", "--to", "4", "--json")
    assert [json.loads(line)["id"] for line in before.out.splitlines()] == [0, 1, 2, 3]
    assert here("dump", url, "orders", "--to", "4").out.count("\n") == 5  # header and four records, exit 0
    limited = here("dump", url, "orders", "--limit", "4")
    assert "showing the first 4 records" in limited.err
    assert "showing the first" not in here("dump", url, "orders", "--limit", "4", "--to", "4").err  # all it wanted

    # A truncated payload under an intact header: the error's hint names the check that lists it.
    entry.write_bytes(bytes(data[: len(data) // 2]))
    truncated = here("dump", url, "orders", code=1)
    assert "truncated" in truncated.err and "'txnlog maintenance damaged URL --verify-payloads'" in truncated.err
    assert "truncated" in here("maintenance", "damaged", url, "--verify-payloads", code=1).out


def test_maintenance_damaged_and_mark_lost_round_trip(tmp_path: Path, here: Callable[..., Result]) -> None:
    """A damaged entry is listed with what its bytes still tell, marking it lost asks for --yes, and once
    marked, describe says by whom and why and dump reads past it (PROTOCOL.md "Damage")."""
    url = _three_entries(tmp_path)
    entry = url / paths.entries(paths.partition_log_path("orders", 0)) / paths.slot_name(1)
    data = bytearray(entry.read_bytes())
    data[20] ^= 0x01  # the header checksum no longer matches
    entry.write_bytes(bytes(data))
    key = f"{paths.entries(paths.partition_log_path('orders', 0))}{paths.slot_name(1)}"

    listed = here("maintenance", "damaged", url, code=1)  # damage not resolved: exit status 1
    assert listed.out.splitlines()[0].split()[:4] == ["topic", "partition", "slot", "offsets"]
    row = listed.out.splitlines()[1]
    assert row.split()[:4] == ["orders", "0", "1", "[2,"] and "header checksum mismatch" in row and row.endswith("no")
    assert f"{key}: the payload reads as an Arrow stream of 2 records" in listed.out
    (found,) = here("maintenance", "damaged", url, "--json", code=1).json()
    assert (found["slot"], found["first_offset"], found["next_offset"], found["marked_lost"]) == (1, 2, 4, None)
    failed = here("dump", url, "orders", code=1)
    assert f"{key} is damaged" in failed.err and "mark-lost" in failed.err

    mark = ("maintenance", "mark-lost", url, "--topic", "orders", "--partition", "0", "--slot", "1")
    dry = here(*mark, "--reason", "bit rot, no replica", code=1)
    assert "header checksum mismatch" in dry.out and "Pass --yes" in dry.err
    assert not (url / paths.lost_entries(paths.partition_log_path("orders", 0))).exists(), "nothing was marked"
    done = here(*mark, "--reason", "bit rot, no replica", "--yes")
    assert "marked offsets [2, 4) of orders-0 lost (2 record(s)" in done.out and "bit rot, no replica" in done.out

    described = here("topics", "describe", url, "orders", "--json").json()["partition_details"][0]
    (damaged,) = described["damaged_entries"]
    assert (damaged["slot"], damaged["marked_lost"], damaged["reason"]) == (1, True, "bit rot, no replica")
    assert described["last_stable_offset"] == described["log_end_offset"] == 6
    text = here("topics", "describe", url, "orders").out
    assert "damaged entries" in text and "yes, by " in text
    dumped = [json.loads(line) for line in here("dump", url, "orders", "--json").out.splitlines()]
    assert [r["id"] for r in dumped] == [0, 1, 4, 5]


def test_maintenance_damaged_reports_a_damaged_transaction_log_record(
    tmp_path: Path, here: Callable[..., Result]
) -> None:
    """A flipped byte in a coordinator record blocks every transactional id of that coordinator partition:
    ``damaged`` said "no damaged entries". It now fails naming the record, what it blocks and the way out;
    and a partition the topic does not have is an error, not a clean bill of health."""
    from txn_core.coordinator.service import coordinator_for

    url = tmp_path / "log"
    log = txn_core.open_log(str(url))
    log.create_topic("orders", 1, SCHEMA)
    with log.producer("w") as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("orders", pa.table({"id": [1], "name": ["a"]}))
        producer.commit_transaction()
    coordinator = coordinator_for("w", log.coordinator_partitions)
    record = url / paths.coordinator_log(coordinator) / paths.slot_name(1)
    data = bytearray(record.read_bytes())
    data[-2] ^= 0x01
    record.write_bytes(bytes(data))

    failed = here("maintenance", "damaged", url, code=1)
    assert "no damaged entries" in failed.out
    assert str(record.relative_to(url)) in failed.err and "payload checksum mismatch" in failed.err
    assert f"coordinator partition {coordinator}" in failed.err and "restored from a backup" in failed.err
    assert here("maintenance", "damaged", url, "--json", code=1).json() == []
    assert here("maintenance", "damaged", url, "--topic", "orders").out.startswith("no damaged entries")
    with pytest.raises(txn_core.CorruptDataError, match="restored from a backup"):
        txn_core.open_log(str(url)).producer("w").init_transactions()

    missing = here("maintenance", "damaged", url, "--topic", "orders", "--partition", "3", code=1)
    one_error_line(missing, "'orders' has 1 partition(s)", "partition 3 does not exist")
    mark = ("maintenance", "mark-lost", url, "--topic", "orders", "--partition", "3", "--slot", "0", "--reason", "x")
    one_error_line(here(*mark, "--yes", code=1), "partition 3 does not exist")


def test_maintenance_damaged_and_describe_name_a_deleted_transaction_log_record(
    tmp_path: Path, here: Callable[..., Result]
) -> None:
    """A coordinator record deleted by hand with later records present: ``damaged`` said "no damaged entries"
    (exit 0) and ``transactions describe`` showed a stale state. Both now fail naming the missing record."""
    from txn_core.coordinator.service import coordinator_for

    url = tmp_path / "log"
    log = txn_core.open_log(str(url))
    log.create_topic("orders", 1, SCHEMA)
    with log.producer("w") as producer:
        producer.init_transactions()
        for i in range(3):
            producer.begin_transaction()
            producer.send("orders", pa.table({"id": [i], "name": ["a"]}))
            producer.commit_transaction()
    record = url / paths.coordinator_log(coordinator_for("w", log.coordinator_partitions)) / paths.slot_name(2)
    record.unlink()

    failed = here("maintenance", "damaged", url, code=1)
    assert str(record.relative_to(url)) in failed.err and "missing" in failed.err, failed.err
    described = here("transactions", "describe", url, "w", code=1)
    assert str(record.relative_to(url)) in described.err and "restored from a backup" in described.err


def test_a_topic_with_damaged_metadata_does_not_hide_the_others(tmp_path: Path, here: Callable[..., Result]) -> None:
    """One flipped byte in a topic's newest metadata version failed ``topics list`` and ``maintenance damaged``
    for the whole log, with no way out. They now go on with the other topics and exit 1 naming the object
    and what to do; commands on that topic say the same."""
    url = tmp_path / "log"
    log = txn_core.open_log(str(url))
    log.create_topic("orders", 1, SCHEMA)
    log.create_topic("other", 1, SCHEMA)
    log.topics.update("orders", partitions=2)
    meta = url / "topics" / "orders" / "meta" / paths.slot_name(1)
    data = bytearray(meta.read_bytes())
    data[-3] ^= 0xFF
    meta.write_bytes(bytes(data))

    listed = here("topics", "list", url, code=1)
    assert [line.split()[0] for line in listed.out.splitlines()[1:]] == ["other"]
    assert str(meta.relative_to(url)) in listed.err and "restore the object from a backup" in listed.err
    assert "version 1 of the metadata of topic 'orders'" in listed.err
    assert [m["name"] for m in here("topics", "list", url, "--json", code=1).json()] == ["other"]
    checked = here("maintenance", "damaged", url, code=1)
    assert "no damaged entries" in checked.out and "restore the object from a backup" in checked.err
    one_error_line(here("topics", "describe", url, "orders", code=1), "restore the object from a backup")


def test_maintenance_roll_rolls_decided_history_and_readers_read_the_same(
    scenario: Path, here: Callable[..., Result]
) -> None:
    def dumped() -> str:
        args = ("--isolation", "read_uncommitted", "--show-control", "--limit", "0", "--json")
        return here("dump", scenario, "orders", *args).out + here("dump", scenario, "orders", "--limit", "0").out

    dumped()  # a read_committed read aborts "stuck", past its timeout (its marker lands), as a roll would
    before = dumped()
    rolled = txnlog("maintenance", "roll", scenario, "--entries", "2", "--min-age-ms", "0", "--no-age-check", "--json")
    rows = {r["partition"]: r for r in rolled.json()}
    assert all(r["segments_created"] >= 1 and r["entries_deleted"] == r["entries_rolled"] > 0 for r in rows.values())
    log = txn_core.open_log(str(scenario))
    assert log.storage.list(paths.segments(paths.partition_log_path("orders", 0)))
    # partition 1 is rolled up to fresh's open transaction (offset 10), not past it
    assert rows[1]["rolled_through_slot"] <= log.partition_log(paths.partition_log_path("orders", 1)).slot_for_offset(
        10
    )
    assert dumped() == before
    again = here("maintenance", "roll", scenario, "--min-age-ms", "0", "--no-age-check").out
    assert again.splitlines()[0].split()[:3] == ["topic", "partition", "segments"]
    assert "rolled 0 entries into 0 segment(s)" in again


# --- demo ----------------------------------------------------------------------------------------


def test_demo_core_prints_a_readable_summary(tmp_path: Path) -> None:
    out = txnlog("demo", "--core", "--dir", tmp_path / "demo").out
    assert "committed 30 rows in 3 transactions, aborted 10 rows in 1" in out
    assert "read_uncommitted consumer saw 40 rows" in out
    assert "exactly the committed ones: True" in out


def test_demo_falls_back_to_the_core_demo_without_the_spark_demo(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None)
    r = txnlog_inprocess(capsys, "demo", "--dir", tmp_path / "demo")
    assert r.code == 0 and "exactly the committed ones: True" in r.out
    assert "running the core demo instead" in r.err


def test_demo_runs_the_spark_demo_when_it_is_importable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from txn_core.cli import demo

    calls: list[str | None] = []

    def run_demo(d: str | None) -> int:
        calls.append(d)
        return 0

    monkeypatch.setattr(demo, "spark_demo", lambda: run_demo)
    assert txnlog_inprocess(capsys, "demo", "--dir", tmp_path).code == 0
    assert calls == [str(tmp_path)]


# --- bad input -----------------------------------------------------------------------------------


def test_bad_input_gives_one_clear_line_and_a_nonzero_exit(scenario: Path, tmp_path: Path) -> None:
    unknown_topic, bad_scheme, no_log, bad_flag, debug = txnlog_all(
        cmd("topics", "describe", scenario, "nope", code=1),
        cmd("topics", "list", "ftp://host/log", code=1),
        cmd("groups", "list", tmp_path / "typo", code=1),
        cmd("topics", "describe", scenario, "orders", "--colour", code=2),
        cmd("--debug", "transactions", "describe", scenario, "nobody", code=1),
    )
    one_error_line(unknown_topic, "unknown topic 'nope'", "existing topics: orders", "txnlog topics create")
    one_error_line(bad_scheme, "unsupported scheme 'ftp'")
    one_error_line(no_log, "no txnlog at", "check the URL")
    assert not (tmp_path / "typo").exists()  # a typo never creates a log
    one_error_line(bad_flag, "topics describe: unrecognized arguments: --colour", "txnlog topics describe --help")
    assert "Traceback (most recent call last)" in debug.err
    assert debug.err.strip().splitlines()[-1].startswith("txnlog: error: unknown transactional id 'nobody'")


@pytest.mark.parametrize(
    ("args", "code", "fragments"),
    [
        # row: the arguments after the log URL, the exit code, what the one error line must say
        (["topics", "list", "{url}", "-o", "novalue"], 2, ["bad storage option 'novalue'", "KEY=VALUE"]),
        (["topics", "list", "{url}", "-o", "x={bad"], 2, ["not valid JSON"]),
        (["topics", "create", "{url}", "t", "-p", "0", "-s", "id:int64"], 2, ["expected a number > 0"]),
        (["topics", "create", "{url}", "t", "-p", "1", "-s", "id"], 2, ["column 'id' has no type"]),
        (["topics", "create", "{url}", "t", "-p", "1", "-s", "id:int65"], 2, ["unknown type 'int65'", "example:"]),
        (["topics", "create", "{url}", "t", "-p", "1", "-s", "_offset:int64"], 1, ["reserved column name"]),
        (["topics", "create", "{url}", "orders", "-p", "1", "-s", "id:int64"], 1, ["topic 'orders' already exists"]),
        (["topics", "create", "{url}", "bad/name", "-p", "1", "-s", "id:int64"], 1, ["invalid topic name"]),
        (["topics", "describe", "{url}", "orders", "--partition", "5"], 1, ["has no partition 5", "0..1"]),
        (["topics", "add-partitions", "{url}", "orders", "--total", "1"], 1, ["can only grow"]),
        (["topics", "set-retention", "{url}", "orders"], 1, ["needs --retention-ms and/or --retention-bytes"]),
        (["topics", "set-retention", "{url}", "orders", "--retention-ms", "soon"], 2, ["expected a whole number"]),
        (["transactions", "describe", "{url}", "nobody"], 1, ["unknown transactional id 'nobody'"]),
        (["transactions", "abort", "{url}", "nobody"], 1, ["unknown transactional id 'nobody'"]),
        (["transactions", "find-hanging", "{url}", "--topic", "nope"], 1, ["unknown topic 'nope'"]),
        (["groups", "describe", "{url}", "nobody"], 1, ["unknown consumer group 'nobody'", "existing groups: billing"]),
        (["dump", "{url}", "nope"], 1, ["unknown topic 'nope'", "existing topics: orders"]),
        (["dump", "{url}", "orders", "--from", "5", "--to", "2"], 1, ["--to 2 is before --from 5"]),
        (["dump", "{url}", "orders", "--from", "99"], 1, ["offset 99 is beyond the log end"]),
        (["dump", "{url}", "orders", "--isolation", "dirty"], 2, ["invalid choice: 'dirty'"]),
        (["dump", "{url}", "orders", "--partition", "-1"], 1, ["has no partition -1"]),
        (["maintenance", "retention", "{url}"], 1, ["no topic has a retention setting"]),
        (["maintenance", "snapshot", "{url}", "--topic", "nope"], 1, ["unknown topic 'nope'"]),
        (["topics"], 2, ["topics: the following arguments are required: VERB"]),
        ([], 2, ["the following arguments are required: COMMAND"]),
    ],
)
def test_bad_arguments_in_process(
    shared_scenario: Path, capsys: pytest.CaptureFixture[str], args: list[str], code: int, fragments: list[str]
) -> None:
    r = txnlog_inprocess(capsys, *[a.replace("{url}", str(shared_scenario)) for a in args])
    assert r.code == code, r
    one_error_line(r, *fragments)


def test_unexpected_errors_and_interrupts_are_one_line_too(
    shared_scenario: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from txn_core.cli import topics

    def boom(args: object) -> int:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(topics, "list_topics", boom)
    r = txnlog_inprocess(capsys, "topics", "list", shared_scenario)
    assert r.code == 1
    one_error_line(r, "unexpected RuntimeError: disk on fire", "rerun with --debug")

    def interrupted(args: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(topics, "list_topics", interrupted)
    r = txnlog_inprocess(capsys, "topics", "list", shared_scenario)
    assert (r.code, r.err, r.out) == (130, "txnlog: interrupted\n", "")


def test_storage_options_nest_and_parse_values() -> None:
    from txn_core.cli.common import storage_option, storage_options

    pairs = [
        storage_option(s)
        for s in [
            "anon=true",
            "client_kwargs.endpoint_url=http://127.0.0.1:9000",
            "client_kwargs.region_name=eu-west-1",
            "max_concurrency=8",
            "key=abc=def",
        ]
    ]
    assert storage_options(pairs) == {
        "anon": True,
        "max_concurrency": 8,
        "key": "abc=def",
        "client_kwargs": {"endpoint_url": "http://127.0.0.1:9000", "region_name": "eu-west-1"},
    }
    assert storage_options([]) is None
    with pytest.raises(txn_core.ConfigurationError, match=r"'anon\.x' conflicts with 'anon'"):
        storage_options([("anon", True), ("anon.x", 1)])
    with pytest.raises(txn_core.ConfigurationError, match=r"bad storage option name 'a\.\.b'"):
        storage_options([("a..b", 1)])


# --- output helpers ------------------------------------------------------------------------------


def test_schema_specs_round_trip() -> None:
    spec = (
        "a:int64 not null,b:string,c:timestamp[us, UTC],d:decimal(10, 2),e:list<int32>,"
        "f:struct<x:int64,y:list<string>>,g:map<string, int64>,h:date32,i:float32,j:duration[ms]"
    )
    schema = parse_schema(spec)
    assert format_schema(schema) == spec
    assert parse_schema(format_schema(schema)) == schema
    assert parse_schema("ts:timestamp[ms, tz=UTC]").field("ts").type == pa.timestamp("ms", "UTC")


def test_tables_durations_sizes() -> None:
    assert render_table(["name", "n"], [["a", 1], ["bbb", 100], ["c", None]]).splitlines() == [
        "name    n",
        "a       1",
        "bbb   100",
        "c       -",
    ]
    assert [format_duration(v) for v in (None, 5, 12_300, 302_000, 11_040_000, 2 * 86_400_000 + 3_600_000)] == [
        "-",
        "5 ms",
        "12.3 s",
        "5 m 02 s",
        "3 h 04 m",
        "2 d 01 h",
    ]
    assert [format_bytes(v) for v in (812, 3277, 5 << 30)] == ["812 B", "3.2 KiB", "5.0 GiB"]


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bars_only_on_a_terminal() -> None:
    tty = _Tty()
    with Progress("describing", 4, unit="partitions", stream=tty, delay_s=0, interval_s=0.01) as bar:
        bar.advance(2)
        time.sleep(0.1)
    drawn = tty.getvalue()
    assert "describing [###############...............] 2/4 partitions" in drawn
    assert drawn.endswith("\r\033[K")  # erased at the end
    pipe = io.StringIO()
    with Progress("describing", 4, stream=pipe, delay_s=0, interval_s=0.01) as bar:
        bar.advance(4)
        time.sleep(0.05)
    assert pipe.getvalue() == ""


def test_transactions_abort_one_partitions_hanging_transaction(tmp_path: Path, here: Callable[..., Result]) -> None:
    """KIP-664's per-partition abort: data a transaction wrote where it never registered."""

    url = tmp_path / "log"
    log = txn_core.open_log(str(url))
    log.create_topic("t", 2, SCHEMA)
    p = log.producer("w")
    p.init_transactions()
    p.begin_transaction()
    p.send("t", pa.table({"id": [1], "name": ["a"]}), partition=0)
    p.flush()
    append_data(
        log,
        "t",
        1,
        pa.record_batch({"id": [2], "name": ["b"]}),
        SCHEMA,
        producer_id=p.producer_id,
        epoch=p.epoch,
        txn=p.transaction_id,
    )
    txn = str(p.transaction_id)
    p.commit_transaction()
    p.close()
    found = here("transactions", "find-hanging", url)
    assert f"--topic t --partition 1 --txn {txn}" in found.out
    done = here("transactions", "abort", url, "--topic", "t", "--partition", "1", "--txn", txn)
    assert f"wrote an ABORT marker for {txn} into t-1" in done.out
    assert "no hanging transactions" in here("transactions", "find-hanging", url).out
    bad = here("transactions", "abort", url, "--topic", "t", "--txn", txn, code=1)
    one_error_line(bad, "--topic, --partition and --txn")


def test_json_output_is_strict_json_for_nan_and_infinities(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"file://{tmp_path}/log"
    with txn_core.open_log(url) as log:
        log.create_topic("floats", 1, pa.schema([("x", pa.float64()), ("y", pa.float32())]))
        with log.producer() as producer:
            producer.send(
                "floats",
                pa.table(
                    {
                        "x": [float("nan"), float("inf"), -float("inf"), 1.5],
                        "y": pa.array([float("-inf"), None, 0.0, float("nan")], pa.float32()),
                    }
                ),
            )
    out = txnlog_inprocess(capsys, "dump", url, "floats", "--json").out

    def strict(token: str) -> None:
        raise ValueError(f"not RFC 8259 JSON: {token}")

    rows = [json.loads(line, parse_constant=strict) for line in out.splitlines()]
    assert [(r["x"], r["y"]) for r in rows] == [
        ("NaN", "-Infinity"),
        ("Infinity", None),
        ("-Infinity", 0.0),
        (1.5, "NaN"),
    ]


ALL_TYPES = pa.schema(
    [
        ("id", pa.int64()),
        ("name", pa.string()),
        ("raw", pa.binary()),
        ("day", pa.date32()),
        ("clock", pa.time64("us")),
        ("wait", pa.duration("ms")),
        ("price", pa.decimal128(10, 2)),
        ("tags", pa.map_(pa.string(), pa.int64())),
        ("small", pa.list_(pa.int32())),
        ("inner", pa.struct([("blob", pa.binary()), ("n", pa.int16())])),
        ("at", pa.timestamp("us", tz="UTC")),
        ("ratio", pa.float64()),
        ("when", pa.timestamp("ms")),
    ]
)


NANOS = pa.schema(
    [
        ("id", pa.int64()),
        ("at", pa.timestamp("ns")),
        ("at_utc", pa.timestamp("ns", tz="UTC")),
        ("clock", pa.time64("ns")),
        ("wait", pa.duration("ns")),
        ("ratio", pa.float64()),
    ]
)


@pytest.mark.parametrize("ratio", [0.5, float("nan")])  # NaN: dump spells it "NaN", which pyarrow's reader refuses
def test_a_json_dump_keeps_nanoseconds_through_produce(
    tmp_path: Path, here: Callable[..., Result], ratio: float
) -> None:
    url = tmp_path / "log"
    log = txn_core.open_log(str(url))
    log.create_topic("src", 1, NANOS)
    log.create_topic("dst", 1, NANOS)
    ints = {
        "at": [1_767_225_600_123_456_789, -1],  # -1: a nanosecond before the epoch
        "at_utc": [1_767_225_600_123_456_789, 1],
        "clock": [1, 86_399_999_999_999],
        "wait": [123_456_789_012_345_678, 86_400_000_000_001],  # more digits than a float holds; a day and 1 ns
    }
    table = pa.table(
        {
            "id": [0, 1],
            **{k: pa.array(v, pa.int64()).cast(NANOS.field(k).type) for k, v in ints.items()},
            "ratio": [ratio] * 2,
        }
    )
    with log.producer() as producer:
        producer.send("src", table, partition=0)
    dumped = tmp_path / "src.jsonl"
    dumped.write_text(here("dump", url, "src", "--json").out)
    assert '"clock":"00:00:00.000000001"' in dumped.read_text()
    here("produce", url, "dst", dumped)
    c = txn_core.open_log(str(url)).consumer()
    c.assign([("dst", 0)])
    got = c.poll()
    for name, values in ints.items():
        assert got.column(name).cast(pa.int64()).to_pylist() == values, name


def test_a_json_dump_produced_again_holds_the_same_values(tmp_path: Path, here: Callable[..., Result]) -> None:
    """``dump --json`` writes bytes as base64, dates and times as ISO-8601, durations as seconds, decimals as
    strings and maps as pairs; ``produce`` read them back as text (binary columns got the base64 text as
    their bytes, silently), or refused them with pyarrow's parse errors; and it refused the metadata
    columns the dump adds. Now a dump loads again into the same values; a bad value names its line and column."""
    import datetime as dt
    import decimal

    url = tmp_path / "log"
    log = txn_core.open_log(str(url))
    log.create_topic("src", 1, ALL_TYPES)
    log.create_topic("dst", 1, ALL_TYPES)
    rows = [
        {
            "id": i,
            "name": f"n{i}",
            "raw": bytes([0, 255, i]) + b"hi",
            "day": dt.date(2026, 1, 2 + i),
            "clock": dt.time(10, 0, i, 500),
            "wait": dt.timedelta(milliseconds=1500 + i),
            "price": decimal.Decimal(f"{i}.25"),
            "tags": [("a", i), ("b", -i)],
            "small": [1, 2, i],
            "inner": {"blob": b"\x00\x01", "n": i},
            "at": dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC),
            "ratio": [float("nan"), 0.5, float("inf")][i],  # dump spells NaN and Infinity as strings
            "when": dt.datetime(2026, 1, 2, 3, 4, 5, 123000),  # dump writes it with six digits
        }
        for i in range(3)
    ]
    with log.producer() as producer:
        producer.send("src", pa.Table.from_pylist(rows, schema=ALL_TYPES), partition=0)
    dumped = tmp_path / "src.jsonl"
    dumped.write_text(here("dump", url, "src", "--json").out)
    assert "_offset" in dumped.read_text()
    here("produce", url, "dst", dumped)

    def read(topic: str) -> list[dict[str, Any]]:
        c = txn_core.open_log(str(url)).consumer()
        c.assign([(topic, 0)])
        rows: list[dict[str, Any]] = (
            c.poll().drop_columns(["_topic", "_partition", "_offset", "_timestamp"]).to_pylist()
        )
        return rows

    src, dst = read("src"), read("dst")
    assert str(dst) == str(src) and len(src) == 3  # as text: NaN equals NaN

    # A column of the file's own with a reserved name (not a dump: the other metadata columns are absent) was
    # dropped silently like a dump's; it is refused, naming it.
    own = tmp_path / "own.jsonl"
    own.write_text('{"id": 9, "_timestamp": "2026-01-02T03:04:05Z"}\n')
    one_error_line(here("produce", url, "dst", own, code=1), "['_timestamp']", "Nothing was written")
    assert len(read("dst")) == 3

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 9, "raw": "AP9oaQ=="}\n{"id": 10, "raw": "not base64!"}\n')
    failed = here("produce", url, "dst", bad, code=1)
    one_error_line(failed, "bad.jsonl: line 2, column 'raw'", '"not base64!" is not a binary value')
    for line, why in (  # what would change to fit is refused, as pyarrow's own reader refuses it
        ('{"id": 1, "small": [1.7]}', "expected an integer"),
        ('{"id": 1, "inner": {"n": 1, "other": 2}}', "other are not in the column's type"),
        ('{"id": 1, "wait": 0.0005}', "finer than the column's unit"),
    ):
        bad.write_text(line + "\n")
        one_error_line(here("produce", url, "dst", bad, code=1), "bad.jsonl: line 1", why)


def test_produce_overtaken_by_another_run_of_its_application_says_to_run_it_again(
    tmp_path: Path, here: Callable[..., Result], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two runs of one ``--app-id`` at once (a scheduler's retry overlapping the first attempt): the one
    fenced exited with the producer API's "close this producer", no fix a command-line user can apply."""
    from txn_core.clients.apptxn import AppCommitter

    url = tmp_path / "log"
    txn_core.open_log(str(url)).create_topic("t", 1, SCHEMA)
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"id": 1, "name": "a"}\n')

    def overtaken(*args: Any, **kwargs: Any) -> Any:
        raise txn_core.ProducerFencedError("transactional id 'job': fenced", transactional_id="job")

    monkeypatch.setattr(AppCommitter, "write_once", overtaken)
    failed = here("produce", url, "t", rows, "--app-id", "job", "--version", "3", code=1)
    one_error_line(failed, "another run of application 'job'", "version 3", "Run the same command again")
