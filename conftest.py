"""Shared test fixtures: log URLs on every backend, S3 servers on 127.0.0.1, a Spark session.

Backends: ``local`` (a temporary directory), ``memory`` (an in-process store), ``moto`` (moto's S3 server
in-process, default tier), ``seaweedfs`` (a real SeaweedFS server, tests marked ``seaweedfs``),
``latency`` (that server behind a proxy adding 25 ms per round trip, tests marked ``latency``), ``gcs``
(fake-gcs-server, tests marked ``gcs``) and ``azure`` (Azurite's blob service, tests marked ``azure``).
"""

from __future__ import annotations

import logging
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent / "tests"))

import jvm_archive
from emulators import AzuriteBlob, Emulator, FakeGcs
from servers import MotoS3, SeaweedS3

pytest_plugins = ["tiers"]  # the default run samples the exhaustive matrices (tests/tiers.py)

logging.getLogger("werkzeug").setLevel(logging.ERROR)
os.environ.setdefault("PYARROW_IGNORE_TIMEZONE", "1")
# Spark binds its driver, block managers and (local-cluster) master, worker and executors to this address;
# unset, it picks the machine's network interface and some sockets listen on every interface.
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

#: The other object stores the README offers, each on its emulator (tests/emulators.py).
EMULATED = [pytest.param("gcs", marks=pytest.mark.gcs), pytest.param("azure", marks=pytest.mark.azure)]
BACKENDS = ["local", "memory", "moto", pytest.param("seaweedfs", marks=pytest.mark.seaweedfs), *EMULATED]
FILE_BACKENDS = ["local", "moto", pytest.param("seaweedfs", marks=pytest.mark.seaweedfs), *EMULATED]
#: For tests whose writers are separate processes: S3 is SeaweedFS, a server in its own process. moto's
#: server runs inside the test process, so every worker's request waits on that one interpreter: the same
#: test is about ten times slower there and shows nothing SeaweedFS does not; that form is the soak tier's.
PROCESS_BACKENDS = [
    "local",
    pytest.param("moto", marks=pytest.mark.soak),
    pytest.param("seaweedfs", marks=pytest.mark.seaweedfs),
    *EMULATED,
]


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[MotoS3]:
    server = MotoS3().start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def seaweed_s3() -> Iterator[SeaweedS3]:
    server = SeaweedS3().start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def fake_gcs() -> Iterator[FakeGcs]:
    """fake-gcs-server on 127.0.0.1 (``gs://`` logs)."""
    server = FakeGcs().start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def azurite() -> Iterator[AzuriteBlob]:
    """Azurite's blob service on 127.0.0.1 (``abfs://`` logs); installed with npm on first use."""
    server = AzuriteBlob().start()
    yield server
    server.stop()


#: Round-trip time the latency tier adds in front of SeaweedFS (S3, GCS, Azure inside a region: 20-30 ms).
LATENCY_RTT_S = 0.025


@pytest.fixture(scope="session")
def latency_s3(seaweed_s3: SeaweedS3) -> Iterator[SeaweedS3]:
    """The SeaweedFS server seen through a proxy adding :data:`LATENCY_RTT_S` to every round trip (the
    latency tier: every sequential request shows as wall time, as on a real object store)."""
    from latency_proxy import delayed_endpoint

    with delayed_endpoint(seaweed_s3.endpoint, LATENCY_RTT_S) as proxy:
        delayed = SeaweedS3.__new__(SeaweedS3)
        delayed.__dict__.update(seaweed_s3.__dict__)
        delayed.endpoint = proxy.endpoint
        yield delayed


class LogLocation:
    """A fresh, empty log location on one backend."""

    def __init__(self, backend: str, url: str, storage_options: dict[str, Any] | None) -> None:
        self.backend = backend
        self.url = url
        self.storage_options = storage_options

    def open(self, **kwargs: Any) -> Any:
        import txn_core

        return txn_core.open_log(self.url, self.storage_options, **kwargs)

    def __repr__(self) -> str:
        return f"LogLocation({self.backend}, {self.url})"


def make_location(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> LogLocation:
    if backend == "local":
        return LogLocation("local", f"file://{tmp_path}/log", None)
    if backend == "memory":
        return LogLocation("memory", f"memory://{uuid.uuid4().hex}", None)
    if backend in ("gcs", "azure"):
        emulator: Emulator = request.getfixturevalue({"gcs": "fake_gcs", "azure": "azurite"}[backend])
        bucket = emulator.shared_bucket or emulator.new_bucket()
        emulator.shared_bucket = bucket
        url = f"{emulator.scheme}://{bucket}/log-{uuid.uuid4().hex[:12]}"
        return LogLocation(backend, url, emulator.storage_options())
    if backend == "moto":
        server = request.getfixturevalue("moto_s3")
    elif backend == "seaweedfs":
        server = request.getfixturevalue("seaweed_s3")
    elif backend == "latency":
        server = request.getfixturevalue("latency_s3")
    else:  # pragma: no cover
        raise ValueError(backend)
    # One bucket per server, a fresh prefix per test: SeaweedFS allots volumes per bucket, and a few
    # dozen buckets would exhaust a small test server.
    bucket = getattr(server, "shared_bucket", None) or server.new_bucket()
    server.shared_bucket = bucket
    return LogLocation(backend, f"s3://{bucket}/log-{uuid.uuid4().hex[:12]}", server.storage_options())


@pytest.fixture(params=BACKENDS)
def location(request: pytest.FixtureRequest, tmp_path: Path) -> LogLocation:
    """A fresh log location on every backend."""
    return make_location(request.param, request, tmp_path)


@pytest.fixture(params=FILE_BACKENDS)
def shared_location(request: pytest.FixtureRequest, tmp_path: Path) -> LogLocation:
    """A fresh log location other processes can reach (no memory backend)."""
    return make_location(request.param, request, tmp_path)


@pytest.fixture
def local_location(tmp_path: Path) -> LogLocation:
    return LogLocation("local", f"file://{tmp_path}/log", None)


@pytest.fixture
def log(local_location: LogLocation) -> Any:
    """A log on local disk."""
    return local_location.open()


@pytest.fixture
def mem_log() -> Any:
    import txn_core

    return txn_core.open_log(f"memory://{uuid.uuid4().hex}")


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One classic SparkSession (local[2]) for the whole run, with the txnlog format registered."""
    from pyspark.sql import SparkSession

    import spark_txn_source

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # Python workers need this venv's packages
    session = (
        SparkSession.builder.master("local[2]")
        .appName("txnlog-tests")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.python.filterPushdown.enabled", "true")
        .config("spark.python.worker.reuse", "true")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    spark_txn_source.register(session)
    jvm_archive.warm_up(session)  # its one-time costs are the session's, not the first test's
    yield session
    session.stop()
