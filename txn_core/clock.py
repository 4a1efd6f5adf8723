"""The one clock of a log: wall time for what is written, monotonic time for how long a cache is trusted.

Everything time-based in txnlog asks the clock the :class:`~txn_core.log.Log` was opened with:

* ``clock()``: milliseconds since the epoch. Stamped into what is written (entry and record timestamps,
  snapshot and topic times, group commit times) and compared with what was written (transaction timeouts,
  the completion grace, retention and compaction ages). Participants on different machines disagree about
  it; PROTOCOL.md "Timeouts without a server" says why that only ever costs an early abort.
* :func:`monotonic` of it: seconds that only move forward, for process-local staleness (a cached log start
  or tail re-checked after a few seconds, a coordinator view idle for half the compaction age).

Two things stay on real time on purpose: blocking waits that sleep (a consumer's poll timeout, a group's
``require_stable`` wait), which a fake clock could never end, and the times a store puts on its objects
(``mtime``), which are the store's.

A clock is any callable returning milliseconds. One that also has a ``monotonic()`` method (the tests'
``FakeClock``) drives both, so a test that moves time moves every cache with it; a plain callable uses
the process's monotonic clock for durations.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol, runtime_checkable

#: Milliseconds since the epoch.
Clock = Callable[[], int]


@runtime_checkable
class _HasMonotonic(Protocol):
    def monotonic(self) -> float: ...


def system_clock() -> int:
    """The machine's wall clock in milliseconds."""
    return int(time.time() * 1000)


def monotonic(clock: Clock | None) -> Callable[[], float]:
    """The monotonic seconds that go with ``clock`` (its own ``monotonic()``, else the process's)."""
    if isinstance(clock, _HasMonotonic):
        return clock.monotonic
    return time.monotonic
