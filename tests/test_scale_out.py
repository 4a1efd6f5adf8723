"""Scale-out proof: the exactly-once Spark copy on a real S3 server, hard-killed, on one and on several processes.

A streaming txnlog -> txnlog copy (``consumerGroup`` set, so every micro-batch commits output, source offsets
and the sink's progress in one transaction) runs as its own driver process (``tests/sink_driver.py``) against
``s3://`` on SeaweedFS, a real Go S3 server bound to 127.0.0.1. Input transactions (some aborted) are produced
by this process, before and while the copy runs. The driver is SIGKILLed -- with its JVM, its executors and
every Python worker -- mid-stream, then restarted on the same checkpoint, and finally drained. Then the
exactly-once check: the output is exactly the committed input (no duplicate, no aborted row, nothing lost),
the group's offsets are at the input's end, no transaction is left open and no staged object is garbage.

Storage settings reach Spark only as ``storage.*`` options (``storage.key``, ``storage.secret``,
``storage.client_kwargs.endpoint_url``...): the driver's environment, which its executors inherit, carries
wrong AWS credentials and a dead ``AWS_ENDPOINT_URL``, so anything that fell back to the environment fails.

* ``seaweedfs`` tier: Spark ``local[2]``; one kill from outside at a random moment once output is visible,
  one inside the sink's commit (after its commit point, before Spark records the batch). The soak tier runs
  the same on fake-gcs-server and Azurite (about 6 min each); the ``latency`` tier on SeaweedFS behind a
  proxy adding 25 ms to every round trip.
* ``cluster`` tier: Spark ``local-cluster[2,1,1024]``: two executor JVMs, each with its own Python workers and
  working directory; the test checks the tasks really ran there (not in the driver's JVM or directory),
  then kills the driver inside a commit, restarts and drains.

Spark's checkpoint is on local disk: only the driver reads and writes it (Spark's own checkpoint files and
the sink's read of ``offsets/<batch>``); executors never see it.
"""

from __future__ import annotations

import json
import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from sink_driver import kill_driver, start_driver, wait_driver
from sink_helpers import read_topic
from test_spark_sink_chaos import SCHEMA, InputProducer, check_exactly_once, next_batch

import txn_core
from conftest import LogLocation, make_location

GROUP = "copier"
TRANSACTIONAL_ID = f"spark-sink-group-{GROUP}"  # the sink's default with consumerGroup
#: The driver's environment: credentials and an endpoint that do not work, so only storage.* options can.
HOSTILE_ENV: dict[str, str | None] = {
    "AWS_ACCESS_KEY_ID": "not-the-key",
    "AWS_SECRET_ACCESS_KEY": "not-the-secret",
    "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
    "AWS_ENDPOINT_URL_S3": "http://127.0.0.1:9",
    "AWS_CONFIG_FILE": "/nonexistent",
    "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
    "AWS_EC2_METADATA_DISABLED": "true",
    "AWS_PROFILE": None,
    "AWS_SESSION_TOKEN": None,
    "AWS_DEFAULT_REGION": None,
    "AWS_REGION": None,
}


def storage_flags(options: dict[str, Any], prefix: str = "storage.") -> dict[str, str]:
    """fsspec storage options as flat Spark options: ``{"client_kwargs": {"endpoint_url": u}}`` ->
    ``{"storage.client_kwargs.endpoint_url": u}``."""
    out: dict[str, str] = {}
    for key, value in options.items():
        if isinstance(value, dict):
            out.update(storage_flags(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = str(value)
    return out


def copy_config(location: LogLocation, chk: Path, **kw: Any) -> dict[str, Any]:
    flags = storage_flags(location.storage_options or {})
    base = {
        "log": location.url,
        "checkpoint": str(chk),
        "source": "txnlog",
        "input": "in",
        "topic": "out",
        "read": {"startingOffsets": "earliest", "maxOffsetsPerTrigger": 600, **flags},
        "sink": {"partitions": 2, "keyColumn": "key", "consumerGroup": GROUP, **flags},
    }
    base.update(kw)
    return base


def committed_rows(log: txn_core.Log) -> int:
    return read_topic(log, "out").num_rows if "out" in log.list_topics() else 0


def wait_for_output(log: txn_core.Log, proc: Any, rows: int, timeout: float) -> int:
    """Wait until the copy has committed at least ``rows`` rows; returns how many it has."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        n = committed_rows(log)
        if n >= rows or proc.poll() is not None:
            return n
        time.sleep(0.5)
    return committed_rows(log)


def run_to_end(cfg: dict[str, Any], log_file: Path, timeout: float = 600) -> None:
    code = wait_driver(start_driver(cfg, log_file, HOSTILE_ENV), timeout)
    assert code == 0, log_file.read_text(errors="replace")[-4000:]


def kill_in_commit(log: txn_core.Log, cfg: dict[str, Any], chk: Path, log_file: Path, batch: int) -> None:
    """Run until the sink has decided ``batch`` (PrepareCommit durable) and SIGKILL the whole driver there."""
    cfg = {**cfg, "sink": {**cfg["sink"], "testing.fault": f"after_prepare:kill@{batch}"}}
    code = wait_driver(start_driver(cfg, log_file, HOSTILE_ENV), timeout=600)
    assert code == -9, f"the driver was not killed in commit({batch}): " + log_file.read_text(errors="replace")[-4000:]
    progress = log.transaction_metadata(TRANSACTIONAL_ID)
    assert progress is not None and progress["batch_id"] == batch, "the batch was decided before the kill"
    assert not (chk / "commits" / str(batch)).exists(), "but Spark never recorded it: the restart replays it"


def new_input(location: LogLocation, txns: int) -> tuple[txn_core.Log, InputProducer]:
    log = location.open()
    log.create_topic("in", 3, SCHEMA)
    producer = InputProducer(log)
    producer.produce(txns)
    return log, producer


@pytest.mark.spark
@pytest.mark.parametrize(
    "backend",
    [
        # CI runs the latency form (SeaweedFS behind 25 ms: the same server, every answer later); this one
        # adds faster interleavings of the same kill points for 42 s of CI's tiers: the soak tier's
        pytest.param("seaweedfs", marks=[pytest.mark.chaos, pytest.mark.seaweedfs, pytest.mark.soak]),
        # about 6 min each on 2 cores (SeaweedFS: 1.5): the soak tier's, not CI's
        pytest.param("gcs", marks=[pytest.mark.chaos, pytest.mark.gcs, pytest.mark.soak]),
        pytest.param("azure", marks=[pytest.mark.chaos, pytest.mark.azure, pytest.mark.soak]),
        pytest.param("latency", marks=pytest.mark.latency),
    ],
)
def test_copy_on_s3_killed_mid_stream_and_in_a_commit_is_exactly_once(
    request: pytest.FixtureRequest, tmp_path: Path, backend: str
) -> None:
    """On SeaweedFS as it is, on the GCS and Azure emulators (gs:// through gcsfs, abfs:// through obstore, their
    options as storage.* options), and (latency tier) on SeaweedFS behind 25 ms of added round-trip time, where
    every request of the driver, the tasks and the commit answers late."""
    rng = random.Random(20261121)
    location = make_location(backend, request, tmp_path)
    log, producer = new_input(location, 20)
    chk = tmp_path / "chk"
    base = copy_config(location, chk)
    # Run 1: a batch a second while input keeps arriving; SIGKILL from outside once output is visible.
    background = threading.Thread(target=producer.produce, args=(16, 0.3), daemon=True)
    background.start()
    proc = start_driver({**base, "trigger": 1}, tmp_path / "driver-1.log", HOSTILE_ENV)
    seen = wait_for_output(log, proc, rows=rng.randint(600, 1800), timeout=300)
    kill_driver(proc)
    assert proc.returncode == -9, (tmp_path / "driver-1.log").read_text(errors="replace")[-4000:]
    assert seen > 0, "the first run committed output before it was killed"
    background.join()
    # Run 2: killed inside the sink's commit of the batch after the next (the next may be a replay of a batch
    # the sink committed but Spark did not record), right after its commit point. AvailableNow: the backlog
    # left is several batches long (at most ~3,000 of the input's ~5,500 offsets were copied in run 1).
    kill_in_commit(log, base, chk, tmp_path / "driver-2.log", next_batch(chk) + 1)
    # Run 3: drain everything (Trigger.AvailableNow) and stop.
    run_to_end(base, tmp_path / "driver-3.log")
    counts = check_exactly_once(log, producer, GROUP)
    print(f"\n{backend} local[2]: {counts}, {next_batch(chk)} batches, first kill after {seen} output rows")


@pytest.mark.spark
@pytest.mark.cluster
@pytest.mark.parametrize("killed", [False, pytest.param(True, marks=pytest.mark.soak)], ids=["whole", "killed"])
def test_copy_with_executors_in_separate_processes_killed_in_a_commit_is_exactly_once(
    request: pytest.FixtureRequest, tmp_path: Path, killed: bool
) -> None:
    """A copy whose tasks run in two executor JVMs (their Python workers in other working directories than
    the driver's). Its soak form is killed inside the sink's commit first: the kill at a commit step is CI's
    in the SeaweedFS test above, and the executors' separation is what only this test shows."""
    location = make_location("seaweedfs", request, tmp_path)
    log, producer = new_input(location, 24 if killed else 8)
    chk = tmp_path / "chk"
    base = copy_config(location, chk, master="local-cluster[2,1,1024]")
    if killed:
        kill_in_commit(log, {**base, "probe": True}, chk, tmp_path / "driver-1.log", batch=2)
    else:
        run_to_end({**base, "probe": True}, tmp_path / "driver-1.log")
    probe_lines = [
        line
        for line in (tmp_path / "driver-1.log").read_text(errors="replace").splitlines()
        if line.startswith("PROBE ")
    ]
    assert probe_lines, "the driver printed where its tasks ran"
    probe = json.loads(probe_lines[0][len("PROBE ") :])
    jvms = {t[0] for t in probe["tasks"]}
    assert len(jvms) == 2 and probe["driver_jvm"] not in jvms and None not in jvms, (
        f"tasks ran in two executor JVMs, not the driver's: {probe}"
    )
    assert all(t[2] != probe["driver_cwd"] for t in probe["tasks"]), (
        f"executors' Python workers do not share the driver's working directory: {probe}"
    )
    if killed:
        producer.produce(6)  # more input while the copier is down
        run_to_end(base, tmp_path / "driver-2.log")
    counts = check_exactly_once(log, producer, GROUP)
    print(
        f"\nseaweedfs local-cluster[2,1,1024]: {counts}, {next_batch(chk)} batches; executor JVMs {sorted(jvms)} "
        f"(driver JVM {probe['driver_jvm']})"
    )
