"""The two-query race on an object store: two copiers on one consumer group, racing while input arrives,
one of them SIGKILLed mid-stream (a zombie's crash), then a third query from the group drains the rest.
The output must be exactly the committed input (txn_core PROTOCOL.md "Offsets fence")."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import pytest
from sink_driver import kill_driver, start_driver
from test_scale_out import GROUP, HOSTILE_ENV, copy_config, new_input, run_to_end, wait_for_output
from test_spark_sink_chaos import check_exactly_once

from conftest import make_location

pytestmark = [pytest.mark.spark, pytest.mark.chaos, pytest.mark.seaweedfs]


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
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and any(p.poll() is None for _, p in racers):
        time.sleep(0.5)
    for _, proc in racers:
        kill_driver(proc)  # a survivor with trigger=1 never stops by itself
    background.join()
    failures = [
        n for n, _ in racers if "consumer group 'copier'" in (tmp_path / f"driver-{n}.log").read_text(errors="replace")
    ]
    # A third query from the group (new checkpoint) drains what is left.
    final = copy_config(location, tmp_path / "chk-final")
    final["read"] = {**final["read"], "startingOffsets": "group", "consumerGroup": GROUP}
    run_to_end(final, tmp_path / "driver-final.log")
    counts = check_exactly_once(log, producer, GROUP)
    print(f"\ntwo-query race on seaweedfs: {counts}; killed {victim_name}; fenced: {failures or 'none'}")
    for name, proc in racers:
        assert proc.returncode in (-9, 1), (
            f"{name}: " + (tmp_path / f"driver-{name}.log").read_text(errors="replace")[-3000:]
        )
