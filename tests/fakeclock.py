"""A settable clock for tests: ``Log(storage, clock=FakeClock())`` and move ``.now`` by hand.

It drives wall time and monotonic time alike (``txn_core.clock``), so moving ``.now`` also ages every
process-local cache (a log start, a tail, a coordinator view) by the same amount.
"""

from __future__ import annotations


class FakeClock:
    def __init__(self, now: int = 1_800_000_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now

    def monotonic(self) -> float:
        return self.now / 1000
