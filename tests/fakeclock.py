"""A settable clock for tests: ``Log(storage, clock=FakeClock())`` and move ``.now`` by hand."""

from __future__ import annotations


class FakeClock:
    def __init__(self, now: int = 1_800_000_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now
