"""Real processes: concurrent transactional producers, fencing races, a reader running throughout."""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import workers

from conftest import EMULATED, PROCESS_BACKENDS

SCHEMA = pa.schema([("id", pa.int64()), ("worker", pa.int64())])


def _run(location: Any, tmp_path: Path, jobs: list[tuple[Any, tuple[Any, ...]]]) -> tuple[list[Any], list[int]]:
    log = location.open()
    log.create_topic("t", 3, SCHEMA)
    stop = str(tmp_path / "stop")
    ctx = mp.get_context("spawn")
    with ctx.Pool(len(jobs) + 1) as pool:
        reader = pool.apply_async(workers.reader_until, (location.url, location.storage_options, "t", stop))
        results = [pool.apply_async(fn, args) for fn, args in jobs]
        outs = [r.get(timeout=600) for r in results]
        Path(stop).touch()
        seen = reader.get(timeout=600)
    return outs, seen


@pytest.mark.parametrize("shared_location", [b for b in PROCESS_BACKENDS if b not in EMULATED], indirect=True)
def test_concurrent_transactional_producers_with_aborts(shared_location: Any, tmp_path: Path) -> None:
    start = time.time() + 4
    jobs = [
        (
            workers.transactional_copier,
            (shared_location.url, shared_location.storage_options, "t", f"tx-{w}", w, 12, 9, 3, start),
        )
        for w in range(3)
    ]
    outs, seen = _run(shared_location, tmp_path, jobs)
    committed = {i for o in outs for i in o["committed"]}
    aborted = {i for o in outs for i in o["aborted"]}
    assert len(seen) == len(set(seen)), "a committed record was delivered twice"
    assert not set(seen) & aborted, "an aborted record was visible"
    assert set(seen) == committed, "a committed record was lost"


@pytest.mark.parametrize("shared_location", PROCESS_BACKENDS, indirect=True)
def test_two_producers_racing_on_one_transactional_id(shared_location: Any, tmp_path: Path) -> None:
    start = time.time() + 4
    jobs = [
        (workers.fencing_worker, (shared_location.url, shared_location.storage_options, "t", "shared-id", w, 10, start))
        for w in range(2)
    ]
    outs, seen = _run(shared_location, tmp_path, jobs)
    committed = {i for o in outs for i in o["committed"]}
    fenced = {i for o in outs for i in o["fenced"]}
    assert fenced, "the race should fence at least one transaction"
    assert len(seen) == len(set(seen))
    assert set(seen) == committed
    assert not set(seen) & fenced


@pytest.mark.chaos
@pytest.mark.parametrize(
    "shared_location",
    ["local", pytest.param("moto", marks=pytest.mark.soak), pytest.param("seaweedfs", marks=pytest.mark.seaweedfs)],
    indirect=True,
)
def test_many_producers_and_readers_for_longer(shared_location: Any, tmp_path: Path) -> None:
    """Four copiers, two fencing workers and a reader at once. CI runs it on local disk and SeaweedFS (a
    real S3 server); on moto's in-process server, five times slower, it is a soak."""
    start = time.time() + 5
    rows = 17  # ids per transaction
    jobs: list[tuple[Callable[..., dict[str, list[int]]], tuple[Any, ...]]] = [
        (
            workers.transactional_copier,
            (shared_location.url, shared_location.storage_options, "t", f"tx-{w}", w, 40, rows, 4, start),
        )
        for w in range(4)
    ]
    jobs += [
        (
            workers.fencing_worker,
            (shared_location.url, shared_location.storage_options, "t", "shared", 10 + w, 25, start),
        )
        for w in range(2)
    ]
    outs, seen = _run(shared_location, tmp_path, jobs)
    committed = {i for o in outs for i in o["committed"]}
    timed_out = {i for o in outs for i in o.get("timed_out", [])}
    if timed_out:  # a stalled store (see workers.transactional_copier): aborted, so never visible
        print(f"{len(timed_out) // rows} transactions outlived their timeout and were aborted by a reader")
    assert all(o["committed"] for o in outs), "every copier committed transactions"
    assert len(seen) == len(set(seen))
    assert set(seen) == committed
    assert not set(seen) & timed_out
