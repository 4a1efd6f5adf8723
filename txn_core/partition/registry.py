"""One :class:`PartitionLog` and one shared :class:`PartitionState` per path of a log.

A partition log caches what it learned of its slots (start, tail, the offset index), so every client of
one log URL in a process shares one per path: a consumer's reads and a producer's appends then teach each
other. Shared states serve queries run from one thread at a time (describe, stable offsets, expiry); a
reader that keeps its position keeps a state of its own (``shared=False``).
"""

from __future__ import annotations

import threading
from typing import Protocol

from txn_core.clock import Clock
from txn_core.partition.partition import PartitionLog
from txn_core.partition.state import PartitionState, Resolver
from txn_core.storage import Storage


class PartitionLogs:
    """The partition logs of one storage, created on first use, one per path. Thread-safe."""

    def __init__(self, storage: Storage, *, clock: Clock) -> None:
        self.storage = storage
        self.clock = clock
        self._logs: dict[str, PartitionLog] = {}
        self._lock = threading.Lock()

    def forget(self, prefix: str) -> None:
        """Drop the partition logs under ``prefix`` (a topic made anew): the next use starts from storage."""
        with self._lock:
            for path in [p for p in self._logs if p.startswith(prefix)]:
                del self._logs[path]

    def get(self, path: str) -> PartitionLog:
        with self._lock:
            plog = self._logs.get(path)
            if plog is None:
                plog = PartitionLog(self.storage, path, clock=self.clock)
                self._logs[path] = plog
            return plog


class Deciding(Protocol):
    """Who decides transactions: the coordinator (the layer above), through its ``resolve``."""

    @property
    def resolve(self) -> Resolver: ...


class PartitionStates:
    """The transaction states of partition logs, each deciding transactions through ``decider.resolve`` as
    it is when the state is made. Creating one is thread-safe; a shared state itself is not
    (:class:`PartitionState`)."""

    def __init__(self, logs: PartitionLogs, decider: Deciding) -> None:
        self.logs = logs
        self.decider = decider
        self._states: dict[str, PartitionState] = {}
        self._lock = threading.Lock()

    def forget(self, prefix: str) -> None:
        """Drop the shared states and partition logs under ``prefix`` (a topic made anew)."""
        with self._lock:
            for path in [p for p in self._states if p.startswith(prefix)]:
                del self._states[path]
        self.logs.forget(prefix)

    def get(self, path: str, *, shared: bool = True) -> PartitionState:
        """The shared state of ``path`` (one per registry), or a fresh one of the caller's own."""
        if not shared:
            return PartitionState(self.logs.get(path), self.decider.resolve)
        with self._lock:
            state = self._states.get(path)
        if state is None:
            state = PartitionState(self.logs.get(path), self.decider.resolve)
            with self._lock:
                state = self._states.setdefault(path, state)
        return state
