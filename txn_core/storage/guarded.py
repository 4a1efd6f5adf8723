"""The conditional-write self-test before a process's first write, and read-only stores (PROTOCOL.md "Storage").

Reading never writes. :func:`txn_core.storage.open_storage` returns a :class:`WriteCheckedStorage`: reads go
straight to the backend; the first ``create`` or ``delete`` of a process on a URL first runs the self-test
(:func:`txn_core.storage.factory.self_test_storage`: a backend that silently overwrites is refused before
anything of txnlog's is written). A process that only reads never runs it, so a read-only mount, read-only
credentials or a mistyped path see no write at all.

Writes a reader makes only to help others (buffer, group and coordinator snapshots) go through
:func:`opportunistic`: on a store that refuses them for permission they are skipped, and the storage
remembers that it is read-only so later ones are not even tried.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from txn_core.errors import StoragePermissionError
from txn_core.logs import get_logger
from txn_core.storage.base import Chunks, DelegatingStorage, Storage

logger = get_logger("txnlog.storage")
_verified: set[str] = set()
_verified_lock = threading.Lock()


class WriteCheckedStorage(DelegatingStorage):
    """``inner`` with the self-test run before the first write of this process to its URL."""

    def __init__(self, inner: Storage, check: Callable[[Storage], None]) -> None:
        super().__init__(inner)
        self._check = check

    def _before_write(self) -> None:
        with _verified_lock:
            if self.url in _verified:
                return
        self._check(self.inner)
        with _verified_lock:
            _verified.add(self.url)

    def create(self, key: str, chunks: Chunks) -> None:
        self._before_write()
        self.inner.create(key, chunks)

    def create_gated(self, key: str, chunks: Chunks, gate: Callable[[], bool]) -> None:
        self._before_write()
        self.inner.create_gated(key, chunks, gate)

    def delete(self, key: str) -> None:
        self._before_write()
        self.inner.delete(key)


def opportunistic(storage: Storage, what: str, write: Callable[[], object]) -> bool:
    """Run ``write`` (a write that only helps later readers); skip it on a read-only store. True if written."""
    if storage.read_only:
        return False
    try:
        write()
    except StoragePermissionError as exc:
        storage.read_only = True
        logger.info("%s: %s not written, the store is read-only for this process (%s)", storage.url, what, exc)
        return False
    return True
