"""A fault-injecting storage wrapper for crash-point tests.

``FaultyStorage(inner, crash_at=k, landed=...)`` counts storage operations. At operation ``k`` it
"kills the process": it raises :class:`SimulatedCrash` (a ``BaseException``, so no library code can
swallow it) -- after performing the operation if ``landed`` (the write reached storage, the process died
before learning it), else before. From then on every operation raises, as a dead process does nothing.
The participant objects that used it are abandoned; recovery runs with fresh objects on ``inner``.

``ambiguous_at`` instead makes operation ``k`` land and then report :class:`UnknownOutcomeError`, the
"timed out but actually written" case the storage contract resolves by reading back.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from txn_core.errors import UnknownOutcomeError
from txn_core.storage.base import Chunks, Storage


class SimulatedCrash(BaseException):
    """The process died here."""


@dataclass
class OpRecord:
    index: int
    op: str
    key: str


@dataclass
class FaultyStorage(Storage):
    inner: Storage
    crash_at: int | None = None
    landed: bool = False
    ambiguous_at: int | None = None
    only_writes: bool = False
    ops: list[OpRecord] = field(default_factory=list)
    dead: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.url = self.inner.url

    def _tick(self, op: str, key: str) -> tuple[bool, bool]:
        """(crash now, ambiguous now) for this operation."""
        with self._lock:
            if self.dead:
                raise SimulatedCrash(f"dead process touched {op} {key}")
            if self.only_writes and op not in ("create", "delete"):
                return False, False
            i = len(self.ops)
            self.ops.append(OpRecord(i, op, key))
            crash = self.crash_at is not None and i == self.crash_at
            if crash:
                self.dead = True
            return crash, self.ambiguous_at is not None and i == self.ambiguous_at

    def create(self, key: str, chunks: Chunks) -> None:
        crash, ambiguous = self._tick("create", key)
        if crash and not self.landed:
            raise SimulatedCrash(f"crash before create {key}")
        self.inner.create(key, chunks)
        if crash:
            raise SimulatedCrash(f"crash after create {key}")
        if ambiguous:
            raise UnknownOutcomeError(f"injected: create of {key} timed out (it landed)")

    @property
    def stages_creates(self) -> bool:  # type: ignore[override]
        return self.inner.stages_creates

    def create_gated(self, key: str, chunks: Chunks, gate: Callable[[], bool]) -> None:
        """A gated create is one storage operation, counted (and crashed) like a create."""
        crash, ambiguous = self._tick("create", key)
        if crash and not self.landed:
            raise SimulatedCrash(f"crash before create {key}")
        self.inner.create_gated(key, chunks, gate)
        if crash:
            raise SimulatedCrash(f"crash after create {key}")
        if ambiguous:
            raise UnknownOutcomeError(f"injected: create of {key} timed out (it landed)")

    def read(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        crash, _ = self._tick("read", key)
        if crash:
            raise SimulatedCrash(f"crash at read {key}")
        return self.inner.read(key, start, end)

    def exists(self, key: str) -> bool:
        crash, _ = self._tick("exists", key)
        if crash:
            raise SimulatedCrash(f"crash at exists {key}")
        return self.inner.exists(key)

    def list(self, prefix: str) -> list[str]:
        crash, _ = self._tick("list", prefix)
        if crash:
            raise SimulatedCrash(f"crash at list {prefix}")
        return self.inner.list(prefix)

    def delete(self, key: str) -> None:
        crash, _ = self._tick("delete", key)
        if crash and not self.landed:
            raise SimulatedCrash(f"crash before delete {key}")
        self.inner.delete(key)
        if crash:
            raise SimulatedCrash(f"crash after delete {key}")

    def mtime_ms(self, key: str) -> int | None:
        return self.inner.mtime_ms(key)
