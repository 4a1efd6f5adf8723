"""Test hooks: fault injection at named points of the sink protocol, and storage request counting.

Both are inert unless a test sets the sink option; no production code path depends on them.

``testing.fault`` = comma-separated ``point[:action][@batch]``:

=================  ==============================================================================
point              where it fires
=================  ==============================================================================
``write``          in a write task, after it staged its rows, before it returns; Spark partition 0, attempt 0
                   (so a retried attempt succeeds)
``before_init``    commit: before ``init_transactions`` (nothing of this commit is durable)
``before_commit``  commit: staged refs and offsets sent, transaction still Ongoing
``after_prepare``  commit: PrepareCommit durable (the commit point), markers possibly still being written
``after_commit``   commit: every marker written (Complete comes with the next begin), garbage not cleaned
``abort``          at the start of ``abort``
=================  ==============================================================================

``action`` is ``raise`` (default: :class:`InjectedFaultError`, so Spark sees a failing task or commit) or
``kill``: SIGKILL every process of this process's session -- the whole Spark driver with its executors
and Python workers, as a power cut would. ``kill`` acts only when the environment variable
``TXNLOG_SINK_TEST_SESSION`` equals the session id (a harness that started the driver with
``start_new_session=True`` sets it); otherwise it raises, so it can never kill a shell or a test runner.
``@batch`` restricts the fault to one streaming batch id.

``testing.stats`` = a local directory: each commit writes ``<batch>.json`` there with the number of
storage requests (create, read, exists, list, delete) the driver's commit made.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Any

from txn_core import ConfigurationError, TxnLogError
from txn_core.storage.base import Chunks, Storage

POINTS = ("write", "before_init", "before_commit", "after_prepare", "after_commit", "abort")
ACTIONS = ("raise", "kill")
SESSION_ENV = "TXNLOG_SINK_TEST_SESSION"


class InjectedFaultError(TxnLogError):
    """A fault injected by the ``testing.fault`` option."""


@dataclass(frozen=True, slots=True)
class Fault:
    point: str
    action: str
    batch: int | None


def parse_faults(spec: str | None) -> tuple[Fault, ...]:
    """Parse a ``testing.fault`` value (see module doc)."""
    if not spec:
        return ()
    out = []
    for raw in spec.split(","):
        item = raw.strip()
        if not item:
            continue
        head, _, batch = item.partition("@")
        point, _, action = head.partition(":")
        action = action or "raise"
        if point not in POINTS or action not in ACTIONS:
            raise ConfigurationError(
                f"testing.fault item {item!r}: expected point[:action][@batch] with point in {POINTS} and "
                f"action in {ACTIONS}"
            )
        try:
            batch_id = int(batch) if batch else None
        except ValueError:
            raise ConfigurationError(f"testing.fault item {item!r}: batch must be an integer") from None
        out.append(Fault(point, action, batch_id))
    return tuple(out)


class Faults:
    """The faults armed for one batch (``batch_id`` None: a batch write)."""

    def __init__(self, spec: str | None, batch_id: int | None) -> None:
        self.faults = tuple(f for f in parse_faults(spec) if f.batch is None or f.batch == batch_id)
        self.batch_id = batch_id

    def __bool__(self) -> bool:
        return bool(self.faults)

    def hit(self, point: str) -> None:
        for f in self.faults:
            if f.point == point:
                if f.action == "kill":
                    kill_session()
                raise InjectedFaultError(f"injected fault {point!r} in batch {self.batch_id}")


def kill_session() -> None:
    """SIGKILL every process in this process's session, this one last (see module doc)."""
    sid = os.getsid(0)
    if os.environ.get(SESSION_ENV) != str(sid):
        raise InjectedFaultError(f"kill fault refused: {SESSION_ENV} does not name this session ({sid})")
    me = os.getpid()
    for pid in session_pids(sid):
        if pid != me:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    os.kill(me, signal.SIGKILL)


def session_pids(sid: int) -> list[int]:
    """Every live process of session ``sid`` (Linux /proc)."""
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", encoding="ascii", errors="replace") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if len(fields) > 3 and int(fields[3]) == sid:
            pids.append(int(name))
    return pids


class CountingStorage(Storage):
    """A :class:`Storage` that counts requests by operation (for ``testing.stats``)."""

    def __init__(self, inner: Storage) -> None:
        self.inner = inner
        self.url = inner.url
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    @property
    def overlap_reads(self) -> bool:  # type: ignore[override]
        return self.inner.overlap_reads

    def _count(self, op: str) -> None:
        with self._lock:
            self.counts[op] += 1

    def create(self, key: str, chunks: Chunks) -> None:
        self._count("create")
        self.inner.create(key, chunks)

    def read(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        self._count("read")
        return self.inner.read(key, start, end)

    def exists(self, key: str) -> bool:
        self._count("exists")
        return self.inner.exists(key)

    def list(self, prefix: str) -> list[str]:
        self._count("list")
        return self.inner.list(prefix)

    def delete(self, key: str) -> None:
        self._count("delete")
        self.inner.delete(key)

    def size(self, key: str) -> int:
        self._count("size")
        return self.inner.size(key)

    def mtime_ms(self, key: str) -> int | None:
        return self.inner.mtime_ms(key)

    def describe(self) -> str:
        return self.inner.describe()

    def write_stats(self, directory: str, name: str, extra: dict[str, Any]) -> None:
        os.makedirs(directory, exist_ok=True)
        body = {"requests": dict(self.counts), "total": sum(self.counts.values()), **extra}
        with open(os.path.join(directory, f"{name}.json"), "w", encoding="utf-8") as f:
            json.dump(body, f)
