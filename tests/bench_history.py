"""Reading a partition's history before and after rolling it into segments (PROTOCOL.md "Segments").

One partition holds ``--txns`` committed small transactions (one row each) and one aborted transaction
with data for every ten, written by several transactional producers at once: about ``2.2 * txns`` entries
(a data entry and a marker per transaction). Then, on SeaweedFS behind the latency proxy (``--rtt-ms``,
default 25 ms per round trip) and on local disk:

* a fresh read_committed consumer reads the partition from offset 0 (the loose entries);
* ``maintenance.roll_segments`` rolls it (minimum age 0: the loose entries are deleted at once);
* a fresh read_committed consumer reads it again, and must return the same rows.

Reported: entries per round trip (wall time over the measured unit: a plain small GET with boto3 through
the proxy), requests (SeaweedFS's own count), and objects under the partition's prefix. Figures, not
assertions about time::

    .venv/bin/python tests/bench_history.py [--txns 10000] [--rtt-ms 25]

or as the ``bench`` tier test (``pytest -m bench tests/bench_history.py -s``), which checks that the rolled
partition reads the same rows and holds at most one object per 1,000 entries plus the loose tail, and
reports entries per round trip against their targets (1,000 rolled, 50 loose): rolled, a good part of the
read is the reader's CPU, so that figure moves with the machine and is a figure, not an assertion.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

sys.path.insert(0, str(Path(__file__).parent))

from bench_round_trips import unit_rtt
from latency_proxy import delayed_endpoint_process
from latency_storage import DelayedStorage
from servers import SeaweedS3

import txn_core
from txn_core.format import paths
from txn_core.ops import maintenance
from txn_core.storage import open_storage

pytestmark = [pytest.mark.bench, pytest.mark.seaweedfs]

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string())])
PATH = paths.partition_log_path("h", 0)
WRITERS = 4


def write_history(url: str, options: dict[str, Any] | None, txns: int) -> int:
    """``txns`` committed transactions and ``txns // 10`` aborted ones on partition 0; returns entries."""
    log = txn_core.open_log(url, options)
    log.create_topic("h", 1, SCHEMA)
    errors: list[BaseException] = []

    def writer(w: int) -> None:
        try:
            # markers alone: the history ISSUE 34 item 2 is defined on (a data entry and a marker each)
            p = log.producer(f"history-{w}", transaction_timeout_ms=120_000, marker_linger_ms=0)
            p.init_transactions()
            for i in range(w, txns, WRITERS):
                p.begin_transaction()
                p.send("h", pa.table({"id": [i], "name": [f"row-{i}"]}, schema=SCHEMA), partition=0)
                p.commit_transaction()
                if i % 10 == 0:
                    p.begin_transaction()
                    p.send("h", pa.table({"id": [-i - 1], "name": ["aborted"]}, schema=SCHEMA), partition=0)
                    p.flush()
                    p.abort_transaction()
            p.close()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(WRITERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    end = log.describe_topic("h").partitions[0]
    log.close()
    return int(end.log_end_offset)  # one offset per row and per marker: the entry count here


@dataclass
class Read:
    rows: int
    seconds: float
    requests: int
    ids: int  # sum of ids: the same rows before and after


def read_all(url: str, options: dict[str, Any] | None) -> Read:
    counted = DelayedStorage(open_storage(url, options))
    t0 = time.perf_counter()
    log = txn_core.Log(counted)
    c = log.consumer()
    c.assign([("h", 0)])
    rows = total = 0
    while (got := c.poll()).num_rows:
        rows += got.num_rows
        total += sum(got.column("id").to_pylist())
    seconds = time.perf_counter() - t0
    c.close()
    return Read(rows, seconds, counted.total(), total)


def objects(url: str, options: dict[str, Any] | None) -> int:
    """Objects under the partition's prefix (entries, segments, snapshots, log start markers)."""
    storage = open_storage(url, options)
    todo, n = [PATH + "/"], 0
    while todo:
        prefix = todo.pop()
        for name in storage.list(prefix):
            if name.endswith("/"):
                todo.append(prefix + name)
            else:
                n += 1
    return n


def loose(url: str, options: dict[str, Any] | None) -> int:
    return len(open_storage(url, options).list(paths.entries(PATH)))


def roll(url: str, options: dict[str, Any] | None) -> tuple[float, Any]:
    t0 = time.perf_counter()
    log = txn_core.open_log(url, options)
    result = maintenance.roll_segments(log, "h", min_age_ms=0, check_min_age=False)[0]
    return time.perf_counter() - t0, result


def report(txns: int = 10_000, rtt_ms: float = 25.0) -> tuple[str, dict[str, float]]:
    lines: list[str] = []
    figures: dict[str, float] = {}
    server = SeaweedS3().start()
    try:
        bucket = server.new_bucket()
        # The proxy runs in a process of its own: the network is not part of the reader's interpreter.
        with delayed_endpoint_process(server.endpoint, rtt_ms / 1000) as endpoint:
            fast = server.storage_options()
            slow = {**fast, "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"}}
            unit = unit_rtt(server, endpoint, bucket)
            lines.append(
                f"unit: a plain small GET (boto3) through the proxy = {unit * 1000:.1f} ms (added {rtt_ms:.0f} ms)"
            )
            url = f"s3://{bucket}/history-{uuid.uuid4().hex[:8]}"
            t0 = time.perf_counter()
            entries = write_history(url, fast, txns)
            lines.append(
                f"history: {txns} committed + {txns // 10 + (1 if txns % 10 else 0)} aborted transactions, one row "
                f"each, on one partition: {entries} entries (written in {time.perf_counter() - t0:.0f} s)"
            )
            lines.append("")
            lines.append(
                "| read_committed from offset 0 | entries per RTT | RTT | requests | seconds | objects in partition |"
            )
            lines.append("|---|---:|---:|---:|---:|---:|")
            before_objects = objects(url, fast)
            before = read_all(url, slow)
            lines.append(_row("SeaweedFS + 25 ms, loose entries", entries, before, unit, before_objects))
            roll_s, result = roll(url, fast)
            after_objects = objects(url, fast)
            after = read_all(url, slow)
            if (after.rows, after.ids) != (before.rows, before.ids):
                raise AssertionError(f"the rolled partition reads differently: {before} vs {after}")
            lines.append(_row("SeaweedFS + 25 ms, rolled", entries, after, unit, after_objects))
            tail = loose(url, fast)
            figures.update(
                per_rtt_before=entries / (before.seconds / unit),
                per_rtt=entries / (after.seconds / unit),
                objects=after_objects,
                allowed=entries / 1000 + tail,
            )

        with tempfile.TemporaryDirectory() as local_dir:
            local = f"file://{local_dir}/log"
            write_history(local, None, txns)
            local_objects = objects(local, None)
            local_before = read_all(local, None)
            local_roll_s, _ = roll(local, None)
            local_after = read_all(local, None)
            if (local_after.rows, local_after.ids) != (local_before.rows, local_before.ids):
                raise AssertionError("the rolled partition reads differently on local disk")
            lines.append(_row("local disk, loose entries", entries, local_before, None, local_objects))
            lines.append(_row("local disk, rolled", entries, local_after, None, objects(local, None)))
        lines.append("")
        lines.append(
            f"roll (SeaweedFS, no added latency): {result.segments} segments of up to 8192 entries, {result.entries} "
            f"entries rolled, {result.deleted_entries} loose entries deleted, in {roll_s:.1f} s; loose tail "
            f"{tail} entries; local disk roll {local_roll_s:.1f} s"
        )
        lines.append(
            f"objects in the partition after rolling: {after_objects} (target: <= {entries} / 1000 + the loose "
            f"tail {tail} = {entries / 1000 + tail:.0f})"
        )
    finally:
        server.stop()
    return "\n".join(lines), figures


def _row(name: str, entries: int, read: Read, unit: float | None, objs: int) -> str:
    if unit is None:
        return f"| {name} | - | - | {read.requests} | {read.seconds:.2f} | {objs} |"
    rtts = read.seconds / unit
    return f"| {name} | {entries / rtts:.0f} | {rtts:.0f} | {read.requests} | {read.seconds:.2f} | {objs} |"


def test_history_report() -> None:
    text, figures = report()
    print("\n" + text)
    for name, key, target in (("after rolling", "per_rtt", 1000), ("loose", "per_rtt_before", 50)):
        verdict = "met" if figures[key] >= target else "NOT met"
        print(f"entries per round trip {name}: {figures[key]:.0f} (target >= {target}: {verdict})")
    assert figures["objects"] <= figures["allowed"], figures


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--txns", type=int, default=10_000)
    ap.add_argument("--rtt-ms", type=float, default=25.0)
    args = ap.parse_args()
    print(report(args.txns, args.rtt_ms)[0])


if __name__ == "__main__":
    main()
