"""A storage wrapper that makes every request cost one simulated round trip, and counts requests.

Local disk answers in microseconds, which hides every sequential round trip a path pays. Wrapping the
storage in :class:`DelayedStorage` makes each request sleep ``rtt_s`` (outside any lock, so overlapped
requests overlap their delays as they would on a network), so the wall time of an operation divided by
``rtt_s`` is the number of round trips it pays one after another. ``counts`` holds the requests by kind.

This is the in-process stand-in for the latency tier (a delaying proxy in front of a real S3 server):
cheap enough for the default test tier, and exact about ordering, but it knows nothing of a client
library's own extra round trips (``Expect: 100-continue`` and the like).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from txn_core.storage.base import LIST_PAGE, Chunks, ListPage, Storage


class DelayedStorage(Storage):
    """Every request sleeps ``rtt_s`` and is counted by kind (``create``, ``read``, ``exists``, ...)."""

    def __init__(self, inner: Storage, rtt_s: float = 0.0) -> None:
        self.inner = inner
        self.url = inner.url
        self.rtt_s = rtt_s
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def _request(self, kind: str) -> None:
        with self._lock:
            self.counts[kind] += 1
        if self.rtt_s:
            time.sleep(self.rtt_s)

    def create(self, key: str, chunks: Chunks) -> None:
        self._request("create")
        self.inner.create(key, chunks)

    def read(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        self._request("read")
        return self.inner.read(key, start, end)

    def read_buffer(self, key: str) -> Any:
        self._request("read")
        return self.inner.read_buffer(key)

    def exists(self, key: str) -> bool:
        self._request("exists")
        return self.inner.exists(key)

    def list(self, prefix: str) -> list[str]:
        self._request("list")
        return self.inner.list(prefix)

    def list_page(self, prefix: str, limit: int = LIST_PAGE) -> ListPage | None:
        self._request("list")
        return self.inner.list_page(prefix, limit)

    def delete(self, key: str) -> None:
        self._request("delete")
        self.inner.delete(key)

    def size(self, key: str) -> int:
        self._request("size")
        return self.inner.size(key)

    def mtime_ms(self, key: str) -> int | None:
        self._request("mtime")
        return self.inner.mtime_ms(key)

    def describe(self) -> str:
        return f"Delayed({self.inner.describe()}, rtt={self.rtt_s * 1000:.0f}ms)"

    def total(self) -> int:
        """Requests so far, all kinds."""
        with self._lock:
            return sum(self.counts.values())

    @contextmanager
    def measure(self) -> Iterator[dict[str, float]]:
        """Measure a block: yields a dict filled on exit with ``requests``, ``seconds`` and ``rtts``
        (wall time in units of ``rtt_s``; meaningful when ``rtt_s`` dominates the local work)."""
        out: dict[str, float] = {}
        before = self.total()
        t0 = time.perf_counter()
        try:
            yield out
        finally:
            seconds = time.perf_counter() - t0
            out["requests"] = self.total() - before
            out["seconds"] = seconds
            out["rtts"] = seconds / self.rtt_s if self.rtt_s else float("nan")
