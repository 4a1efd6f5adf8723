"""Spark drivers in their own processes: task retries, and a driver killed inside the sink's commit.

Each run is ``tests/sink_driver.py`` in a new session; a ``kill`` fault SIGKILLs the whole session (driver,
JVM and Python workers) at an exact point of the commit protocol, and the next run resumes from the same
checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sink_driver import start_driver, wait_driver
from sink_helpers import duplicates, garbage, ids, read_topic

import txn_core

pytestmark = pytest.mark.spark


def config(log: txn_core.Log, tmp_path: Path, **kw: Any) -> dict[str, Any]:
    base = {
        "log": log.url,
        "checkpoint": str(tmp_path / "chk"),
        "source": "counter",
        "topic": "out",
        "read": {"total": 60, "perBatch": 20},
        "sink": {"partitions": 2, "keyColumn": "key"},
    }
    base.update(kw)
    return base


def run(cfg: dict[str, Any], tmp_path: Path, timeout: float = 240) -> tuple[int, str]:
    log_file = tmp_path / "driver.log"
    code = wait_driver(start_driver(cfg, log_file), timeout)
    return code, log_file.read_text(errors="replace")


@pytest.mark.slow
def test_a_failed_task_attempt_is_retried_and_contributes_nothing(log: txn_core.Log, tmp_path: Path) -> None:
    cfg = config(log, tmp_path, master="local[2,4]")  # local[N,F]: F attempts per task
    cfg["sink"] = {**cfg["sink"], "testing.fault": "write@0"}
    code, output = run(cfg, tmp_path)
    assert code == 0, output[-3000:]
    assert "injected fault 'write' in batch 0" in output, "attempt 0 failed and Spark retried the task"
    out = read_topic(log, "out")
    assert ids(out) == list(range(60)), duplicates(ids(out))
    assert garbage(log, "out") == [], "the failed attempt's staged objects were removed by the commit"


@pytest.mark.chaos  # the same crash as the Quickstart demo's, which CI runs and checks: a soak
@pytest.mark.soak
def test_a_driver_killed_after_the_commit_point_resumes_exactly_once(log: txn_core.Log, tmp_path: Path) -> None:
    cfg = config(log, tmp_path)
    cfg["sink"] = {**cfg["sink"], "testing.fault": "after_prepare:kill@1"}
    code, output = run(cfg, tmp_path)
    assert code == -9, f"the driver was SIGKILLed inside commit(1): {output[-2000:]}"
    query_id = json.loads((tmp_path / "chk" / "metadata").read_text())["id"]
    progress = log.transaction_metadata(f"spark-sink-{query_id}")
    assert progress is not None and progress["batch_id"] == 1, "batch 1 was decided before the kill"
    assert not (tmp_path / "chk" / "commits" / "1").exists(), "but Spark never recorded it"
    assert ids(read_topic(log, "out")) == list(range(40))
    code, output = run(config(log, tmp_path), tmp_path)
    assert code == 0, output[-3000:]
    out = read_topic(log, "out")
    assert ids(out) == list(range(60)), duplicates(ids(out))
    assert garbage(log, "out") == [], "the replay of batch 1 finished the killed run's cleanup"
