"""Subscription benchmark (issue 7): acknowledgements per second, transactional vs plain, in one run.

Run: ``pytest -m bench tests/bench_subscriptions.py -s`` (``TXNLOG_BENCH_ACKS`` sets the number of records
acknowledged per case, default 2000). Reports figures only; asserts nothing about time.

Cases, each on a fresh subscription of the same topic (entries of 100 records), records already received:

* one record per acknowledgement (one ack-log entry each), plain vs inside transactions of 10 acks;
* 100 records per acknowledgement (one batch-index bitset per entry), plain vs one transaction per ack
  (the consume-process-produce shape: receive a batch, acknowledge it, commit) and vs 10 acks per
  transaction.

A transactional case pays, per transaction, the coordinator's begin/add record, the prepare and complete
records and one COMMIT marker in the ack log; per acknowledgement, the same append and verdict replay as a
plain one.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pytest

import txn_core

pytestmark = pytest.mark.bench

N = int(os.environ.get("TXNLOG_BENCH_ACKS", "2000"))
SCHEMA = pa.schema([("id", pa.int64()), ("payload", pa.string())])


def _log(backend: str, tmp_path: Path) -> txn_core.Log:
    url = f"file://{tmp_path}/bench-log" if backend == "local" else f"memory://{uuid.uuid4().hex}"
    log = txn_core.open_log(url)
    log.create_topic("in", 1, SCHEMA)
    p = log.producer()
    for i in range(0, N, 100):
        ids = list(range(i, min(N, i + 100)))
        p.send("in", pa.table({"id": ids, "payload": [f"record-{x}" for x in ids]}), partition=0)
        p.flush()
    p.close()
    return log


def _consumer(log: txn_core.Log, name: str) -> tuple[txn_core.SubscriptionConsumer, list[int]]:
    c = log.subscribe("in", 0, name, range_size=N + 100, max_unacked=N + 1, ack_timeout_ms=3_600_000)
    got = c.receive(N).column("_offset").to_pylist()
    if len(got) != N:
        raise AssertionError(f"received {len(got)} of {N}")
    return c, got


def _plain(log: txn_core.Log, per_ack: int) -> float:
    c, offsets = _consumer(log, f"plain-{per_ack}")
    t0 = time.perf_counter()
    for i in range(0, N, per_ack):
        c.acknowledge(offsets[i : i + per_ack])
    dt = time.perf_counter() - t0
    if c.state().mark_delete != N:
        raise AssertionError("not everything was acknowledged")
    return dt


def _transactional(log: txn_core.Log, per_ack: int, acks_per_txn: int) -> float:
    c, offsets = _consumer(log, f"txn-{per_ack}-{acks_per_txn}")
    p = log.producer(f"bench-{per_ack}-{acks_per_txn}")
    p.init_transactions()
    t0 = time.perf_counter()
    step = per_ack * acks_per_txn
    for i in range(0, N, step):
        p.begin_transaction()
        for j in range(i, min(N, i + step), per_ack):
            c.acknowledge(offsets[j : j + per_ack], transaction=p)
        p.commit_transaction()
    p.wait_for_completion()
    dt = time.perf_counter() - t0
    if c.state().mark_delete != N:
        raise AssertionError("not everything was acknowledged")
    p.close()
    return dt


@pytest.mark.parametrize("backend", ["memory", "local"])
def test_acknowledgements_per_second_transactional_vs_plain(backend: str, tmp_path: Path) -> None:
    log = _log(backend, tmp_path)
    rows = []
    plain_times: dict[int, float] = {}
    for per_ack, acks_per_txn in ((1, 10), (100, 1), (100, 10)):
        if per_ack not in plain_times:
            plain_times[per_ack] = _plain(log, per_ack)
        plain = plain_times[per_ack]
        txn = _transactional(log, per_ack, acks_per_txn)
        requests = N / per_ack
        rows.append((per_ack, acks_per_txn, N / plain, requests / plain, N / txn, requests / txn, txn / plain))
    print(f"\nsubscription acknowledgements, {backend} backend, {N} records per case")
    print(
        f"{'records/ack':>11} {'acks/txn':>8} | {'plain rec/s':>12} {'plain req/s':>11} | "
        f"{'txn rec/s':>12} {'txn req/s':>10} | {'txn cost':>8}"
    )
    for per_ack, apt, prs, pqs, trs, tqs, ratio in rows:
        print(f"{per_ack:>11} {apt:>8} | {prs:>12,.0f} {pqs:>11,.0f} | {trs:>12,.0f} {tqs:>10,.0f} | {ratio:>7.2f}x")


def _drain(consumers: list[txn_core.SubscriptionConsumer], batch: int) -> float:
    """Receive and acknowledge every record, the consumers taking turns; the seconds it took."""
    t0 = time.perf_counter()
    done = 0
    while done < N:
        for c in consumers:
            got = c.receive(batch)
            if got.num_rows:
                c.acknowledge(got)
                done += got.num_rows
    return time.perf_counter() - t0


@pytest.mark.parametrize("backend", ["memory", "local"])
def test_key_shared_receive_and_acknowledge_against_shared(backend: str, tmp_path: Path) -> None:
    """Records received and acknowledged per second by one and by two consumers of a Key_Shared subscription
    (keys: the payload, N distinct values) against a Shared one, in one run: a Key_Shared consumer reads
    every record of the partition and hashes each key; it delivers its slices' records."""
    log = _log(backend, tmp_path)
    print(f"\nreceive + acknowledge, {backend} backend, {N} records, batches of 100")
    print(f"{'consumers':>9} | {'shared rec/s':>12} | {'key_shared rec/s':>16} | {'ratio':>6}")
    for n in (1, 2):
        shared = [log.subscribe("in", 0, f"s{n}", consumer_name=f"c{i}", max_unacked=N + 1) for i in range(n)]
        keyed = [
            log.subscribe("in", 0, f"k{n}", consumer_name=f"c{i}", subscription_type="key_shared",
                          key_column="payload", max_unacked=N + 1)
            for i in range(n)
        ]  # fmt: skip
        s, k = _drain(shared, 100), _drain(keyed, 100)
        print(f"{n:>9} | {N / s:>12,.0f} | {N / k:>16,.0f} | {s / k:>5.2f}x")
        for c in shared + keyed:
            c.close()
