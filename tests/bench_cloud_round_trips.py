"""Round trips per operation on GCS and Azure Blob, each on its emulator behind the latency proxy.

fake-gcs-server and Azurite on 127.0.0.1 behind :class:`latency_proxy.LatencyProxy` adding ``--rtt-ms``
(default 25 ms) to every round trip, as ``tests/bench_round_trips.py`` does for S3 on SeaweedFS. The unit is
measured, not assumed: the median of a plain small GET on a warm HTTP connection through the proxy (one
request, one response). Each client of each store is measured on the same operations: the storage primitives
(a create-if-absent of 200 bytes, a whole read, a ranged read, an existence check of a present and of an absent
object, a listing), the transactional ones of ``bench_round_trips.OPS``, and a fresh read_committed consumer
of a small log (``bench_round_trips.measure_fresh_consumer``: its first rows, and caught up; median of 3), in
RTT units (median wall time / unit). Clients: GCS through gcsfs (obstore's GCS store uploads through GCS's XML
API, which fake-gcs-server does not implement: it answers 400, so that client cannot be measured, or its
conditional create proven, here); Azure through obstore (the default) and adlfs (``client=fsspec``); S3
through obstore on SeaweedFS behind the same proxy, the reference the others are compared with.
Figures, not assertions::

    .venv/bin/python tests/bench_cloud_round_trips.py [--rtt-ms 25] [--reps 15]

or as the ``bench`` tier test (``pytest -m bench tests/bench_cloud_round_trips.py -s``).
"""

from __future__ import annotations

import argparse
import http.client
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from bench_round_trips import OPS, PARTITIONS, SCHEMA, measure_fresh_consumer
from bench_round_trips import unit_rtt as s3_unit_rtt
from emulators import AzuriteBlob, Emulator, FakeGcs
from latency_proxy import delayed_endpoint
from servers import SeaweedS3

import txn_core
from txn_core.storage import open_storage
from txn_core.storage.base import Storage

pytestmark = [pytest.mark.bench, pytest.mark.gcs, pytest.mark.azure]


def unit_rtt(endpoint: str, path: str) -> float:
    """The median seconds of a small GET of ``path`` through ``endpoint`` on one warm HTTP connection."""
    host, _, port = endpoint.removeprefix("http://").partition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    times = []
    for _ in range(25):
        t0 = time.perf_counter()
        conn.request("GET", path)
        conn.getresponse().read()
        times.append(time.perf_counter() - t0)
    conn.close()
    return statistics.median(times[5:])


def _primitives(storage: Storage) -> dict[str, Callable[[], object]]:
    storage.create("probe/present", [b"x" * 200])
    counter = iter(range(1_000_000))
    return {
        "create-if-absent, 200 bytes": lambda: storage.create(f"probe/new-{next(counter)}", [b"y" * 200]),
        "read a whole object": lambda: storage.read("probe/present"),
        "read a byte range": lambda: storage.read("probe/present", 10, 20),
        "exists (present)": lambda: storage.exists("probe/present"),
        "exists (absent)": lambda: storage.exists("probe/absent"),
        "list a prefix": lambda: storage.list("probe/"),
    }


def measure(url: str, options: dict[str, Any], unit: float, reps: int) -> dict[str, float]:
    """{operation: RTT units} for one client of one store."""
    storage = open_storage(url, options)
    out: dict[str, float] = {}
    for name, run in _primitives(storage).items():
        run()  # warm: connections open
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            run()
            times.append(time.perf_counter() - t0)
        out[name] = statistics.median(times) / unit
    log = txn_core.Log(storage, allow_non_empty=True)  # beside the primitives' probe/ objects
    log.create_topic("t", PARTITIONS, SCHEMA)
    for op in OPS:
        go = op.prepare(log)
        times = []
        for _ in range(reps):
            settle = getattr(go, "settle", None)
            if settle is not None:
                settle()
            t0 = time.perf_counter()
            go()
            times.append(time.perf_counter() - t0)
        out[op.name] = statistics.median(times) / unit
    log.close()
    firsts, caught = [], []
    for _ in range(3):  # a fresh process's open each time: a new prefix, a new storage client
        fresh = f"{url}-fresh-{uuid.uuid4().hex[:6]}"
        first, caught_up = measure_fresh_consumer(fresh, options, fresh, options, unit)
        firsts.append(first)
        caught.append(caught_up)
    out["fresh read_committed consumer of a small log (72 entries, open included): first rows"] = statistics.median(
        firsts
    )
    out["the same: caught up"] = statistics.median(caught)
    return out


@contextmanager
def _slow(emulator: Emulator | SeaweedS3, rtt_s: float) -> Iterator[tuple[dict[str, Any], float, str]]:
    """``emulator``'s storage options through a proxy adding ``rtt_s``, the measured unit, and a new bucket."""
    bucket = emulator.new_bucket()
    with delayed_endpoint(emulator.endpoint, rtt_s) as proxy:
        if isinstance(emulator, SeaweedS3):
            client_kwargs = {"endpoint_url": proxy.endpoint, "region_name": "us-east-1"}
            options = {**emulator.storage_options(), "client_kwargs": client_kwargs}
            unit = s3_unit_rtt(emulator, proxy.endpoint, bucket)
        elif isinstance(emulator, FakeGcs):
            options = {**emulator.storage_options(), "endpoint_url": proxy.endpoint}
            unit = unit_rtt(proxy.endpoint, f"/storage/v1/b/{bucket}")
        else:
            assert isinstance(emulator, AzuriteBlob)
            options = {"connection_string": emulator.connection_string.replace(emulator.endpoint, proxy.endpoint)}
            emulator.service().get_container_client(bucket).upload_blob("rtt-probe", b"x" * 200)
            unit = unit_rtt(proxy.endpoint, f"/devstoreaccount1/{bucket}/rtt-probe")
        yield options, unit, bucket


def report(rtt_ms: float = 25.0, reps: int = 15) -> str:
    columns: dict[str, dict[str, float]] = {}
    units: list[str] = []
    stores: tuple[tuple[Emulator | SeaweedS3, tuple[str, ...]], ...] = (
        (SeaweedS3(), ("auto",)),  # the reference: S3's default client on a real S3 server
        (FakeGcs(), ("auto",)),
        (AzuriteBlob(), ("auto", "fsspec")),
    )
    for emulator, clients in stores:
        emulator.start()
        try:
            with _slow(emulator, rtt_ms / 1000) as (options, unit, bucket):
                units.append(f"{type(emulator).__name__} {unit * 1000:.1f} ms")
                for client in clients:
                    scheme = "s3" if isinstance(emulator, SeaweedS3) else emulator.scheme
                    name = {
                        ("s3", "auto"): "S3 obstore (SeaweedFS)",
                        ("gs", "auto"): "GCS gcsfs",
                        ("abfs", "auto"): "Azure obstore (default)",
                        ("abfs", "fsspec"): "Azure adlfs",
                    }[(scheme, client)]
                    url = f"{scheme}://{bucket}/rtt-{client}-{uuid.uuid4().hex[:6]}"
                    columns[name] = measure(url, {**options, "client": client}, unit, reps)
        finally:
            emulator.stop()
    rows = list(next(iter(columns.values())))
    lines = [
        f"unit: a plain small GET on a warm connection through the proxy (added {rtt_ms:.0f} ms): " + "; ".join(units),
        "",
        "| operation (RTT) | " + " | ".join(columns) + " |",
        "|---|" + "---:|" * len(columns),
    ]
    lines += [f"| {row} | " + " | ".join(f"{columns[c][row]:.2f}" for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def test_cloud_round_trips_report() -> None:
    text = report(reps=8)
    print("\n" + text)
    assert "idempotent send" in text


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rtt-ms", type=float, default=25.0)
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args()
    print(report(args.rtt_ms, args.reps))


if __name__ == "__main__":
    main()
