"""Every code example in README.md runs, as written.

* ``python`` blocks run in order as one script in a fresh interpreter (the Spark example starts its own
  session), with the README's example paths moved into a temporary directory; their ``assert``
  statements are the checks. A block whose first line is ``# file: NAME`` is a job script instead: it
  runs as its own process (``python NAME LOG CHECKPOINT``) against the log the examples built, and is
  stopped once its first micro-batch is visible in the output topic.
* ``console`` blocks: every ``$ txnlog ...`` line runs through the real console script afterwards, against
  the log the Python examples built, and must exit 0.
* ``bash`` blocks are the Quickstart and the development commands: ``.ci/run`` executes the Quickstart's
  two lines verbatim (read from this README), and the development commands are CI's tiers.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
PATHS = ("/tmp/txnlog-readme-checkpoint", "/tmp/txnlog-readme")


def blocks(kind: str, *, jobs: bool = False) -> list[str]:
    found = [body for lang, body in FENCE.findall(README.read_text()) if lang == kind]
    return [b for b in found if b.startswith("# file: ") == jobs]


def relocate(text: str, root: Path) -> str:
    for p in PATHS:  # longest first: the checkpoint path contains the log path
        text = text.replace(p, str(root / Path(p).name))
    return text


def test_the_readme_has_the_examples_this_test_runs() -> None:
    assert len(blocks("python")) >= 3 and blocks("console")
    quickstart = blocks("bash")[0].strip().splitlines()
    assert len(quickstart) == 2 and quickstart[0].endswith("txnlog demo") and quickstart[1].endswith("pytest -n auto")


def test_the_core_examples_run_without_spark(tmp_path: Path) -> None:
    """The default tier's share of the next test: the examples before the first Spark one, in a fresh
    interpreter (the whole README, Spark, jobs and console lines, runs in the slow tier)."""
    core = [b for b in blocks("python") if "spark" not in b.lower()]
    assert core and all("spark" not in b.lower() for b in blocks("python")[: len(core)]), "core examples come first"
    script = tmp_path / "readme_core.py"
    script.write_text(relocate("\n\n".join(core), tmp_path))
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    run = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, check=False, timeout=300
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]


@pytest.mark.slow
@pytest.mark.spark
def test_every_readme_example_runs(tmp_path: Path) -> None:
    script = tmp_path / "readme_examples.py"
    script.write_text(relocate("\n\n".join(blocks("python")), tmp_path))
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYTHONWARNINGS": "ignore"}
    run = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, check=False, timeout=600
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]
    for job in blocks("python", jobs=True):
        run_job(job, tmp_path, env)
    txnlog = str(Path(sys.executable).with_name("txnlog"))
    for block in blocks("console"):
        for line in block.splitlines():
            if not line.startswith("$ txnlog "):
                continue
            args = shlex.split(relocate(line[2:], tmp_path))
            out = subprocess.run([txnlog, *args[1:]], env=env, capture_output=True, text=True, timeout=120, check=False)
            assert out.returncode == 0, f"{line}: {out.stderr}"
            assert out.stdout.strip(), f"{line} printed nothing"


def run_job(source: str, root: Path, env: dict[str, str]) -> None:
    """Run a README job script against the local log until its first batch shows up, then stop it."""
    import time

    import txn_core

    name = source.splitlines()[0].split()[2]
    (root / name).write_text(source)
    log_url = str(root / Path(PATHS[1]).name)
    output = root / f"{name}.log"
    with output.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, name, log_url, str(root / "job-checkpoint")],
            cwd=root,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 300
        log = txn_core.open_log(log_url)
        while time.monotonic() < deadline and proc.poll() is None:
            if "orders-copy" in log.list_topics():
                c = log.consumer()
                c.assign([("orders-copy", p) for p in range(log.topics.get("orders-copy").partitions)])
                if c.poll().num_rows:
                    return
            time.sleep(0.5)
        raise AssertionError(f"{name} produced no output: " + output.read_text()[-3000:])
    finally:
        proc.kill()
        proc.wait(timeout=60)
