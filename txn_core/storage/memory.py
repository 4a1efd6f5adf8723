"""In-process memory storage for tests (``memory://name``): one dict per name, guarded by a lock.

Create-if-absent is a check-and-insert under the lock, so it is atomic and complete-or-absent within
the process. Objects are not shared between processes.
"""

from __future__ import annotations

import threading
import time

from txn_core.errors import ObjectExistsError, ObjectNotFoundError
from txn_core.storage.base import Chunks, Storage

_STORES: dict[str, tuple[dict[str, tuple[bytes, int]], threading.Lock]] = {}
_STORES_LOCK = threading.Lock()


def _store(name: str) -> tuple[dict[str, tuple[bytes, int]], threading.Lock]:
    with _STORES_LOCK:
        if name not in _STORES:
            _STORES[name] = ({}, threading.Lock())
        return _STORES[name]


def drop_memory_store(name: str) -> None:
    """Forget a memory store (tests)."""
    with _STORES_LOCK:
        _STORES.pop(name, None)


class MemoryStorage(Storage):
    """Objects live in a process-wide dict keyed by the URL's name."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.url = f"memory://{name}"

    def __getstate__(self) -> dict[str, object]:
        return {"name": self.name}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__init__(str(state["name"]))  # type: ignore[misc]

    def create(self, key: str, chunks: Chunks) -> None:
        data = b"".join(bytes(c) for c in chunks)
        objects, lock = _store(self.name)
        with lock:
            if key in objects:
                raise ObjectExistsError(f"{key} already exists")
            objects[key] = (data, int(time.time() * 1000))

    def read(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        objects, lock = _store(self.name)
        with lock:
            try:
                data = objects[key][0]
            except KeyError as exc:
                raise ObjectNotFoundError(f"{key} does not exist") from exc
        if start is None and end is None:
            return data
        return data[start or 0 : end]

    def exists(self, key: str) -> bool:
        objects, lock = _store(self.name)
        with lock:
            return key in objects

    def size(self, key: str) -> int:
        return len(self.read(key))

    def mtime_ms(self, key: str) -> int | None:
        objects, lock = _store(self.name)
        with lock:
            try:
                return objects[key][1]
            except KeyError as exc:
                raise ObjectNotFoundError(f"{key} does not exist") from exc

    def list(self, prefix: str) -> list[str]:
        if prefix and not prefix.endswith("/"):  # the contract (Storage.list): a local directory lists nothing else
            raise ValueError(f"list({prefix!r}): a prefix ends in '/'")
        objects, lock = _store(self.name)
        with lock:
            keys = [k for k in objects if k.startswith(prefix)]
        children: set[str] = set()
        for k in keys:
            rest = k[len(prefix) :]
            head, sep, _ = rest.partition("/")
            children.add(head + sep)
        return sorted(children)

    def delete(self, key: str) -> None:
        objects, lock = _store(self.name)
        with lock:
            objects.pop(key, None)
