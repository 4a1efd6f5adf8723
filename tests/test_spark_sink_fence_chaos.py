"""The two-query race on an object store: two copiers on one consumer group, racing while input arrives,
one of them SIGKILLed mid-stream (a zombie's crash), then a third query from the group drains the rest.
The output must be exactly the committed input (txn_core PROTOCOL.md "Offsets fence")."""

from __future__ import annotations

import json
import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from sink_driver import kill_driver, start_driver
from sink_helpers import referenced_keys, staged_objects
from test_scale_out import GROUP, HOSTILE_ENV, committed_rows, copy_config, new_input, run_to_end, wait_for_output
from test_spark_sink_chaos import check_exactly_once

from conftest import make_location
from spark_txn_source import offsets

pytestmark = [pytest.mark.spark, pytest.mark.chaos, pytest.mark.seaweedfs]


def first_batch_start(checkpoint: Path) -> dict[str, Any] | None:
    """The group position a query's first batch started from: the source records it under ``start`` in the
    end offset of batch 0 (Spark's offsets log: a version line, the batch metadata, then one line per
    source). None when the query never planned a batch."""
    path = checkpoint / "offsets" / "0"
    if not path.exists():
        return None
    source = json.loads(path.read_text().splitlines()[2])
    start = source.get(offsets.START)
    return start if isinstance(start, dict) else None


def query_id(checkpoint: Path) -> str | None:
    """The query id Spark keeps in a checkpoint's ``metadata`` file (None before the query started)."""
    path = checkpoint / "metadata"
    return str(json.loads(path.read_text())["id"]) if path.exists() else None


def sweep_unreferenced(log: Any, topic: str, query_ids: list[str]) -> list[str]:
    """Delete the staged objects of these queries' batches that no entry references (what an operator's
    ``txnlog maintenance sweep-staging`` removes for an abandoned checkpoint); returns their keys."""
    refs = referenced_keys(log, topic)
    batch_dirs = tuple(f"/{q}." for q in query_ids)
    swept = [k for k in staged_objects(log) if k not in refs and any(d in k for d in batch_dirs)]
    for key in swept:
        log.storage.delete(key)
    return swept


def committed_a_batch(checkpoint: Path) -> bool:
    """Spark records ``commits/N`` once the sink committed batch N."""
    return any(p.name.isdigit() for p in (checkpoint / "commits").glob("*"))


def wait_until_settled(log: Any, survivor: Any, checkpoint: Path, background: threading.Thread) -> None:
    """Wait (at most a minute) until the survivor has exited, or has committed a batch, the input has stopped
    arriving and the output has not grown for 10 s: by then it has tried to commit from the start it planned
    its first batch at, so a start the victim held has been refused."""
    deadline = time.monotonic() + 60
    rows, since = -1, time.monotonic()
    while time.monotonic() < deadline and survivor.poll() is None:
        count = committed_rows(log)
        if count != rows:
            rows, since = count, time.monotonic()
        quiet = time.monotonic() - since >= 10
        if quiet and not background.is_alive() and committed_a_batch(checkpoint):
            return
        time.sleep(0.5)


def test_two_copiers_racing_on_one_group_on_s3_copy_committed_input_exactly_once(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    rng = random.Random(20261122)
    location = make_location("seaweedfs", request, tmp_path)
    log, producer = new_input(location, 12)
    background = threading.Thread(target=producer.produce, args=(16, 0.3), daemon=True)
    background.start()
    racers = []
    for name in ("a", "b"):  # same job started twice, on two checkpoints, from the group
        cfg = copy_config(location, tmp_path / f"chk-{name}", trigger=1)
        cfg["read"] = {**cfg["read"], "startingOffsets": "group", "consumerGroup": GROUP}
        racers.append((name, start_driver(cfg, tmp_path / f"driver-{name}.log", HOSTILE_ENV)))
    victim_name, victim = racers[rng.randint(0, 1)]
    wait_for_output(log, victim, rows=rng.randint(300, 1200), timeout=300)
    kill_driver(victim)
    survivor_name, survivor = next((n, p) for n, p in racers if p is not victim)
    wait_until_settled(log, survivor, tmp_path / f"chk-{survivor_name}", background)
    for _, proc in racers:
        kill_driver(proc)  # a survivor with trigger=1 never stops by itself
    background.join()
    failures = [
        n for n, _ in racers if "consumer group 'copier'" in (tmp_path / f"driver-{n}.log").read_text(errors="replace")
    ]
    starts = {n: first_batch_start(tmp_path / f"chk-{n}") for n, _ in racers}
    same_start = starts["a"] is not None and starts["a"] == starts["b"]
    if same_start and committed_a_batch(tmp_path / f"chk-{victim_name}"):
        # Both queries planned their first batch from the same group position and the victim committed
        # one: the survivor, alive for a minute after, claimed a start the victim held (or the other way
        # round). Exactly the race the fence exists for: one of them must have been refused. (A victim
        # killed before its first commit, or a survivor that only started from where the victim had got
        # to, never raced: no fence need fire then.)
        assert failures, f"both copiers committed from group position {starts['a']} and no fence fired"
    # A third query from the group (new checkpoint) drains what is left.
    final = copy_config(location, tmp_path / "chk-final")
    final["read"] = {**final["read"], "startingOffsets": "group", "consumerGroup": GROUP}
    run_to_end(final, tmp_path / "driver-final.log")
    # The racers' checkpoints are abandoned: a driver killed between its commit point and the end of its
    # cleanup leaves that batch's manifest (and any failed attempt), which only a replay on the same
    # checkpoint finishes, or the operator's sweep (README: staged objects of an abandoned checkpoint).
    # Those, and only those, are swept here; anything else left would still fail the check below.
    abandoned = [query_id(tmp_path / f"chk-{n}") for n, _ in racers]
    swept = sweep_unreferenced(log, "out", [q for q in abandoned if q])
    counts = check_exactly_once(log, producer, GROUP)
    print(
        f"\ntwo-query race on seaweedfs: {counts}; killed {victim_name}; fenced: {failures or 'none'}; "
        f"swept from abandoned checkpoints: {len(swept)}"
    )
    for name, proc in racers:
        assert proc.returncode in (-9, 1), (
            f"{name}: " + (tmp_path / f"driver-{name}.log").read_text(errors="replace")[-3000:]
        )
