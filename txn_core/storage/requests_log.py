"""Request-level logging of a :class:`Storage` (logger ``txnlog.storage.requests``, DEBUG).

:func:`txn_core.storage.open_storage` wraps a storage in :class:`RequestLoggingStorage` when that logger
is enabled for DEBUG at open time, so a process that does not ask for it pays nothing. Every request is
logged after it ends: operation, key, bytes moved, milliseconds, and the error class when it failed.
Keys are logged, contents and credentials never.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from txn_core.logs import get_logger
from txn_core.storage.base import LIST_PAGE, Chunks, DelegatingStorage, ListPage

logger = get_logger("txnlog.storage.requests")
T = TypeVar("T")


def wanted() -> bool:
    """Whether request logging is on."""
    return logger.isEnabledFor(10)


class RequestLoggingStorage(DelegatingStorage):
    """Logs every request of ``inner`` at DEBUG (see module doc)."""

    def _timed(
        self, op: str, key: str, call: Callable[[], T], size: Callable[[T], int] | None = None, sent: int | None = None
    ) -> T:
        started = time.perf_counter()
        try:
            result = call()
        except Exception as exc:
            logger.debug(
                "%s %s failed after %.1f ms: %s", op, key, (time.perf_counter() - started) * 1000, type(exc).__name__
            )
            raise
        moved = sent if sent is not None else (size(result) if size is not None else 0)
        logger.debug("%s %s %d B %.1f ms", op, key, moved, (time.perf_counter() - started) * 1000)
        return result

    def create(self, key: str, chunks: Chunks) -> None:
        self._timed("create", key, lambda: self.inner.create(key, chunks), sent=sum(len(c) for c in chunks))

    def create_gated(self, key: str, chunks: Chunks, gate: Callable[[], bool]) -> None:
        self._timed("create", key, lambda: self.inner.create_gated(key, chunks, gate), sent=sum(len(c) for c in chunks))

    def read(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        return self._timed("read", key, lambda: self.inner.read(key, start, end), len)

    def read_buffer(self, key: str) -> Any:
        return self._timed("read", key, lambda: self.inner.read_buffer(key), lambda b: int(b.size))

    def exists(self, key: str) -> bool:
        return self._timed("exists", key, lambda: self.inner.exists(key))

    def list(self, prefix: str) -> list[str]:
        return self._timed("list", prefix, lambda: self.inner.list(prefix))

    def list_page(self, prefix: str, limit: int = LIST_PAGE) -> ListPage | None:
        return self._timed("list", prefix, lambda: self.inner.list_page(prefix, limit))

    def delete(self, key: str) -> None:
        self._timed("delete", key, lambda: self.inner.delete(key))

    def size(self, key: str) -> int:
        return self._timed("size", key, lambda: self.inner.size(key))

    def mtime_ms(self, key: str) -> int | None:
        return self._timed("mtime", key, lambda: self.inner.mtime_ms(key))
