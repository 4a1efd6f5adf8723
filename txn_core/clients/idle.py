"""How often a consumer asks a caught-up partition for more (PROTOCOL.md "Reading", "Idle partitions").

A caught-up partition costs one request per poll (a GET of the next slot, answered "not found"): on an
object store a consumer of many quiet partitions polling in a loop would pay for a request per partition
per poll. :class:`IdleBackoff` spaces those requests out per partition: the first ``FREE_POLLS`` empty
polls in a row each read (so a poll right after a send sees it), then the partition is read at most once
per interval, the interval doubling from ``FIRST_INTERVAL_S`` up to the consumer's ``idle_backoff_max_ms``
(opt-in: 0 by default).
Records found (or a seek) reset it.

Invariants:

* At most one request per partition per poll, and none for a partition in its back-off interval.
* Nothing is skipped or reordered: a partition in back-off is only read later; what it holds is
  delivered in offset order by its next read.
* The delay a quiet partition adds to a record that arrives is at most ``idle_backoff_max_ms`` (plus the
  caller's own poll interval); ``idle_backoff_max_ms=0`` turns the back-off off.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass

#: The longest a quiet partition waits between reads, unless the consumer says otherwise: 0, no back-off, so
#: that an empty poll means every partition was asked (a loop polling until one comes back empty relies on it).
DEFAULT_IDLE_BACKOFF_MAX_MS = 0
#: Empty polls in a row that each read before the back-off begins.
FREE_POLLS = 2
#: The first back-off interval; each further empty read doubles it, up to the consumer's maximum.
FIRST_INTERVAL_S = 0.01


@dataclass(slots=True)
class _Quiet:
    streak: int = 0  # empty reads in a row
    due: float = 0.0  # monotonic time of the next read


class IdleBackoff:
    """Per-key back-off of reads of quiet partitions (see module doc). Not thread-safe: the consumer's lock
    guards it."""

    def __init__(self, max_ms: int, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.max_s = max(0, max_ms) / 1000
        self.monotonic = monotonic
        self._quiet: dict[Hashable, _Quiet] = {}

    def due(self, key: Hashable) -> bool:
        """Whether ``key`` may be read now."""
        quiet = self._quiet.get(key)
        return quiet is None or self.monotonic() >= quiet.due

    def found(self, key: Hashable) -> None:
        """Records were found (or the position moved by a seek): read it at every poll again."""
        self._quiet.pop(key, None)

    def empty(self, key: Hashable) -> None:
        """A read of ``key`` found nothing new: the next one waits per the schedule (module doc)."""
        if self.max_s <= 0:
            return
        quiet = self._quiet.setdefault(key, _Quiet())
        quiet.streak += 1
        if quiet.streak > FREE_POLLS:
            interval = min(self.max_s, FIRST_INTERVAL_S * 2 ** (quiet.streak - FREE_POLLS - 1))
            quiet.due = self.monotonic() + interval

    def reset(self) -> None:
        self._quiet.clear()
