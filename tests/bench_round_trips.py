"""Round trips per operation on an object store with real latency (the latency tier's benchmark).

SeaweedFS on 127.0.0.1 behind :class:`latency_proxy.LatencyProxy`, which adds ``--rtt-ms`` (default 25 ms,
what S3, GCS and Azure give inside a region) to every round trip. The unit is measured, not assumed: the
median of a plain small GET with boto3 on a warm connection (one request, one response, outside txnlog's
storage layer, whose cost is part of what is measured). Each operation is reported

* in RTT units (median wall time / unit), which do not depend on the machine,
* in S3 requests per operation, counted by SeaweedFS itself (its Prometheus metrics), background work
  included (markers, Complete records), and
* on local disk, in storage operations per operation (no latency: the request count a path pays).

S3 runs through both clients: obstore (the default for ``s3://``) and s3fs (``storage.client=fsspec``).
The Spark row is the driver's side of a steady-state micro-batch of a txnlog -> txnlog stream copy
(``latestOffset`` + ``partitions`` + the sink's commit, :mod:`spark_batch_rtt`) on the same server.
Figures, not assertions: run as a report::

    .venv/bin/python tests/bench_round_trips.py [--rtt-ms 25] [--history 300]

or as the ``bench`` tier test (``pytest -m bench tests/bench_round_trips.py -s``).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

sys.path.insert(0, str(Path(__file__).parent))

import spark_batch_rtt
from latency_proxy import delayed_endpoint
from latency_storage import DelayedStorage
from servers import SeaweedS3

import txn_core
from txn_core.storage import open_storage

pytestmark = [pytest.mark.bench, pytest.mark.seaweedfs]

SCHEMA = pa.schema([("id", pa.int64())])
TEN = pa.table({"id": list(range(10))}, schema=SCHEMA)
ONE = pa.table({"id": [1]}, schema=SCHEMA)
PARTITIONS = 4


def unit_rtt(server: SeaweedS3, endpoint: str, bucket: str) -> float:
    """The median seconds of a small GET through ``endpoint`` (boto3, warm connection)."""
    import boto3
    from servers import ACCESS_KEY, SECRET_KEY

    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        region_name="us-east-1",
    )
    client.put_object(Bucket=bucket, Key="rtt-probe", Body=b"x" * 200)
    times = []
    for _ in range(25):
        t0 = time.perf_counter()
        client.get_object(Bucket=bucket, Key="rtt-probe")["Body"].read()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[5:])


class Op:
    """One measured operation: ``setup(log)`` once, then ``run()`` repeated."""

    def __init__(self, name: str, prepare: Callable[[txn_core.Log], Callable[[], None]]) -> None:
        self.name = name
        self.prepare = prepare


def _warm_txn(parts: int, settled: bool = False) -> Callable[[txn_core.Log], Callable[[], None]]:
    """Transactions back to back, or (``settled``) each after the previous one's markers landed, as when
    the application does anything between two transactions: a begin waits for the previous transaction's
    markers, since its record carries that transaction's Complete."""

    def prepare(log: txn_core.Log) -> Callable[[], None]:
        topic = "t" if parts <= PARTITIONS else f"wide-{parts}"
        if topic not in log.list_topics():
            log.create_topic(topic, parts, SCHEMA)
        p = log.producer(f"warm-{parts}-{uuid.uuid4().hex[:6]}")
        p.init_transactions()

        def run() -> None:
            p.begin_transaction()
            for part in range(parts):
                p.send(topic, TEN, partition=part)
            p.commit_transaction()

        for _ in range(3):  # warm: tails known, previous Complete pending as in steady state
            run()
        if settled:
            run.settle = p.wait_for_markers  # type: ignore[attr-defined]  # untimed, before each run
        return run

    return prepare


def _idempotent(log: txn_core.Log) -> Callable[[], None]:
    p = log.producer()

    def run() -> None:
        p.send("t", ONE, partition=2)
        p.flush()

    run()
    return run


OPS = [
    Op("warm transaction, 10 rows, 1 partition, back to back", _warm_txn(1)),
    Op("warm transaction, 10 rows, 2 partitions, back to back", _warm_txn(2)),
    Op("warm transaction, 10 rows, 1 partition, previous markers landed", _warm_txn(1, settled=True)),
    Op("warm transaction, 10 rows, 2 partitions, previous markers landed", _warm_txn(2, settled=True)),
    Op("warm transaction, 10 rows, 64 partitions, back to back", _warm_txn(64)),
    Op("warm transaction, 10 rows, 64 partitions, previous markers landed", _warm_txn(64, settled=True)),
    Op("idempotent send 1 row + flush", _idempotent),
]


def measure_ops(
    url: str,
    options: dict[str, Any] | None,
    unit: float | None,
    server: SeaweedS3 | None,
    bucket: str | None,
    reps: int,
) -> dict[str, tuple[float, float]]:
    """{op: (RTT units or storage operations, requests per op)}. With ``unit`` None: local disk, where
    the first figure is storage operations on the critical path and the second all of them."""
    out = {}
    storage: Any = open_storage(url, options)
    counter = DelayedStorage(storage, 0.0)
    log = txn_core.Log(counter)
    if "t" not in log.list_topics():
        log.create_topic("t", PARTITIONS, SCHEMA)
    for op in OPS:
        run = op.prepare(log)
        times = []
        s3_before = server.request_counts(bucket) if server else None
        all_before = counter.total()
        critical = 0
        for _ in range(reps):
            settle = getattr(run, "settle", None)
            if settle is not None:
                settle()
            before = counter.total()
            t0 = time.perf_counter()
            run()
            times.append(time.perf_counter() - t0)
            critical += counter.total() - before
        time.sleep(0.3)  # let background markers land before counting
        if server is not None and unit is not None and s3_before is not None:
            s3 = sum((server.request_counts(bucket) - s3_before).values()) / reps
            out[op.name] = (statistics.median(times) / unit, s3)
        else:
            out[op.name] = (critical / reps, (counter.total() - all_before) / reps)
    log.close()
    return out


def measure_shared(url: str, options: dict[str, Any] | None, unit: float, producers: int = 8, txns: int = 8) -> float:
    """``producers`` transactional producers of one process whose ids share one coordinator partition, each
    running ``txns`` transactions back to back on its own partition: RTT units per transaction as each
    producer sees it (group commit puts their concurrent coordinator records into shared ones)."""
    import threading

    from txn_core.coordinator.service import coordinator_for

    log = txn_core.Log(open_storage(url, options))
    if "s" not in log.list_topics():
        log.create_topic("s", producers, SCHEMA)
    tids = [t for t in (f"shared-{i}" for i in range(10_000)) if coordinator_for(t, log.coordinator_partitions) == 0]
    group = [log.producer(t) for t in tids[:producers]]
    for p in group:
        p.init_transactions()

    def work(p: txn_core.Producer, part: int) -> None:
        for _ in range(txns):
            p.begin_transaction()
            p.send("s", TEN, partition=part)
            p.commit_transaction()

    threads = [threading.Thread(target=work, args=(p, i)) for i, p in enumerate(group)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - t0
    for p in group:
        p.close()
    log.close()
    return seconds / txns / unit


def _committed_history(url: str, options: dict[str, Any] | None, topic: str, txn_id: str, txns: int) -> None:
    """Topic ``topic`` of PARTITIONS partitions holding ``txns`` committed one-row transactions, each over every
    partition (a data entry and a marker per partition per transaction), written by producer ``txn_id``."""
    log = txn_core.open_log(url, options)
    log.create_topic(topic, PARTITIONS, SCHEMA)
    p = log.producer(txn_id, marker_linger_ms=0)  # markers alone: the entries ISSUE 34 items 1 and 2 count
    p.init_transactions()
    for i in range(txns):
        p.begin_transaction()
        for part in range(PARTITIONS):
            p.send(topic, pa.table({"id": [i]}, schema=SCHEMA), partition=part)
        p.commit_transaction()
    p.close()


def measure_catch_up(
    url: str,
    options: dict[str, Any] | None,
    fast_url: str,
    fast_options: dict[str, Any] | None,
    unit: float | None,
    txns: int,
) -> tuple[float, int, float, int]:
    """A fresh read_committed consumer reading 4 partitions of history from offset 0:
    (entries per RTT, entries, RTT, peak RSS MiB)."""
    _committed_history(fast_url, fast_options, "h", "history", txns)
    entries = 2 * txns * PARTITIONS  # a data entry and a marker per partition per transaction
    log = txn_core.open_log(url, options)
    c = log.consumer()
    t0 = time.perf_counter()
    c.assign([("h", part) for part in range(PARTITIONS)])
    rows = 0
    while (got := c.poll()).num_rows:
        rows += got.num_rows
    seconds = time.perf_counter() - t0
    assert rows == txns * PARTITIONS, (rows, txns)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    rtts = seconds / unit if unit else float("nan")
    return entries / rtts if unit else float("nan"), entries, rtts, rss


def measure_idle_tailing(partitions: int = 1000, backoff_ms: int = 1000) -> tuple[int, float]:
    """ISSUE 34 item 4: a consumer of ``partitions`` caught-up partitions polling back to back: (most requests
    in one poll, requests per hour), measured over twice the back-off after a warm-up that lets it reach its
    maximum. Requests, not time, are what an idle consumer costs: counted on memory."""
    storage = DelayedStorage(open_storage(f"memory://idle-{uuid.uuid4().hex}"))
    log = txn_core.Log(storage)
    log.create_topic("idle", partitions, SCHEMA)
    c = log.consumer(idle_backoff_max_ms=backoff_ms)
    c.assign([("idle", part) for part in range(partitions)])
    window = max(4.0, 2 * backoff_ms / 1000)
    started, most = time.monotonic(), 0
    while time.monotonic() - started < max(8.0, backoff_ms / 1000):  # the warm-up: the back-off at its maximum
        c.poll()
    before, started = storage.total(), time.monotonic()
    while time.monotonic() - started < window:
        ahead = storage.total()
        c.poll()
        most = max(most, storage.total() - ahead)
    return most, (storage.total() - before) / (time.monotonic() - started) * 3600


def measure_fresh_consumer(
    url: str,
    options: dict[str, Any] | None,
    fast_url: str,
    fast_options: dict[str, Any] | None,
    unit: float,
    txns: int = 9,
) -> tuple[float, float]:
    """ISSUE 34 item 1: a fresh read_committed consumer (a new process's open: format, topic, partitions) of a
    small log, 4 partitions of ``txns`` one-row transactions each (72 entries for 9): (RTT to its first rows,
    RTT until a poll finds nothing more). The snapshot it leaves is written behind its records."""
    _committed_history(fast_url, fast_options, "small", "small", txns)
    t0 = time.perf_counter()
    c = txn_core.open_log(url, options).consumer()
    c.assign([("small", part) for part in range(PARTITIONS)])
    rows = c.poll().num_rows
    first = time.perf_counter() - t0
    while (got := c.poll()).num_rows:
        rows += got.num_rows
    caught_up = time.perf_counter() - t0
    assert rows == txns * PARTITIONS, (rows, txns)
    return first / unit, caught_up / unit


def spark_batch(url: str, options: dict[str, Any], unit: float) -> tuple[float, int]:
    """The driver's round trips and requests of a steady-state micro-batch (mean of batches 2-4)."""
    results = spark_batch_rtt.run(rtt_s=unit, batches=5, url=url, storage_options=options)
    steady = results[2:]
    driver = ("latestOffset", "partitions", "commit")
    rtt = statistics.mean(sum(b[p].rtt for p in driver) for b in steady)
    requests = round(statistics.mean(sum(b[p].total for p in driver) for b in steady))
    return rtt, requests


def report(rtt_ms: float = 25.0, history: int = 300, reps: int = 15) -> str:
    lines = []
    server = SeaweedS3().start()
    try:
        bucket = server.new_bucket()
        with delayed_endpoint(server.endpoint, rtt_ms / 1000) as proxy:
            slow = {
                **server.storage_options(),
                "client_kwargs": {"endpoint_url": proxy.endpoint, "region_name": "us-east-1"},
            }
            unit = unit_rtt(server, proxy.endpoint, bucket)
            lines.append(
                f"unit: a plain small GET (boto3, warm connection) through the proxy = "
                f"{unit * 1000:.1f} ms (added {rtt_ms:.0f} ms)"
            )
            lines.append("")
            lines.append(
                "| operation | obstore RTT | obstore S3 requests | s3fs RTT | s3fs S3 requests | "
                "local disk ops (critical path / all) |"
            )
            lines.append("|---|---:|---:|---:|---:|---:|")
            rows: dict[str, list[str]] = {op.name: [] for op in OPS}
            for client in ("obstore", "fsspec"):
                url = f"s3://{bucket}/ops-{client}-{uuid.uuid4().hex[:6]}"
                got = measure_ops(url, {**slow, "client": client}, unit, server, bucket, reps)
                for name, (rtt, req) in got.items():
                    rows[name] += [f"{rtt:.2f}", f"{req:.1f}"]
            with tempfile.TemporaryDirectory() as local_dir:
                local = measure_ops(f"file://{local_dir}/log", None, None, None, None, reps)
            for name, (crit, total) in local.items():
                rows[name].append(f"{crit:.1f} / {total:.1f}")
            lines += [f"| {name} | {' | '.join(cells)} |" for name, cells in rows.items()]

            shared = measure_shared(f"s3://{bucket}/shared-{uuid.uuid4().hex[:6]}", slow, unit)
            lines.append("")
            lines.append(
                f"8 transactional producers of one process sharing one coordinator partition, back to back: "
                f"{shared:.2f} RTT per transaction per producer (group commit)"
            )

            catch = []
            for client in ("obstore", "fsspec"):
                prefix = f"s3://{bucket}/history-{client}-{uuid.uuid4().hex[:6]}"
                per_rtt, entries, rtts, rss = measure_catch_up(
                    prefix,
                    {**slow, "client": client},
                    prefix,
                    {**server.storage_options(), "client": client},
                    unit,
                    history,
                )
                catch.append(
                    f"{client}: {per_rtt:.1f} entries per RTT ({entries} entries in {rtts:.0f} RTT; peak RSS {rss} MiB)"
                )
            lines.append("")
            lines.append(
                f"fresh read_committed consumer, 4 partitions, {history} transactions each: " + "; ".join(catch)
            )

            fresh = []
            for client in ("obstore", "fsspec"):
                prefix = f"s3://{bucket}/small-{client}-{uuid.uuid4().hex[:6]}"
                first, caught_up = measure_fresh_consumer(
                    prefix,
                    {**slow, "client": client},
                    prefix,
                    {**server.storage_options(), "client": client},
                    unit,
                )
                fresh.append(f"{client}: first rows {first:.1f} RTT, caught up {caught_up:.1f} RTT")
            lines.append("")
            lines.append(
                "fresh read_committed consumer of a small log (4 partitions, 72 entries; open included): "
                + "; ".join(fresh)
            )

            idle = []
            for backoff_ms in (1000, 10_000):
                most, hourly = measure_idle_tailing(backoff_ms=backoff_ms)
                idle.append(
                    f"idle_backoff_max_ms={backoff_ms}: {hourly / 1e6:.2f}M requests/hour, at most {most} per poll"
                )
            lines.append("")
            lines.append("a consumer of 1,000 idle partitions polling back to back: " + "; ".join(idle))

            rtt, requests = spark_batch(f"s3://{bucket}/spark-{uuid.uuid4().hex[:6]}", slow, unit)
            lines.append("")
            lines.append(
                f"Spark txnlog -> txnlog micro-batch (8,000 rows, 4 partitions), driver side "
                f"(latestOffset + partitions + commit), obstore: {rtt:.1f} RTT, {requests} requests"
            )
    finally:
        server.stop()
    return "\n".join(lines)


def test_round_trips_report() -> None:
    text = report(history=100, reps=8)
    print("\n" + text)
    assert "entries per RTT" in text
    assert "caught up" in text


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rtt-ms", type=float, default=25.0)
    ap.add_argument("--history", type=int, default=300, help="transactions of history per partition")
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args()
    print(report(args.rtt_ms, args.history, args.reps))


if __name__ == "__main__":
    main()
