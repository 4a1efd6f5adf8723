"""The Quickstart demo: produce, stream with the exactly-once sink, crash the driver, restart, verify."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_txn_sink.demo import run_demo

pytestmark = pytest.mark.spark


@pytest.mark.slow
def test_demo_crashes_the_job_mid_commit_and_still_outputs_every_committed_row_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_demo(str(tmp_path / "demo")) == 0
    printed = capsys.readouterr().out
    assert "18 committed (18,000 rows), 6 aborted (6,000 rows)" in printed
    assert "run 1: driver SIGKILLed (exit -9) inside the commit of micro-batch 2" in printed
    assert "txnlog says batch 2 is committed, Spark's checkpoint has no record of batch 2" in printed
    assert "output rows 18,000; duplicates 0; aborted rows in output 0; committed rows missing 0" in printed
    assert printed.rstrip().endswith("exactly-once: OK")
