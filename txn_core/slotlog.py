"""A dense sequence of immutable objects ``<prefix><020d slot>`` (PROTOCOL.md "Slot logs").

Slot logs carry every ordered record stream in txnlog: partition entries, coordinator records, producer-id
blocks, topic metadata versions. Slot ``n+1`` is only ever created by a writer that has read slot ``n``,
and objects are complete-or-absent, so above a known lower bound the existing slots form a gap-free
prefix. That lets :meth:`SlotLog.find_tail` find the first free slot with O(log n) existence checks
(galloping, then bisection) and no LIST, and lets readers poll with one GET of the next slot.
"""

from __future__ import annotations

from txn_core.paths import slot_name
from txn_core.storage.base import Storage


class SlotLog:
    """Slots under ``prefix`` (which ends with ``/``)."""

    __slots__ = ("prefix", "storage")

    def __init__(self, storage: Storage, prefix: str) -> None:
        self.storage = storage
        self.prefix = prefix

    def key(self, slot: int) -> str:
        return self.prefix + slot_name(slot)

    def read(self, slot: int, start: int | None = None, end: int | None = None) -> bytes:
        return self.storage.read(self.key(slot), start, end)

    def exists(self, slot: int) -> bool:
        return self.storage.exists(self.key(slot))

    def find_tail(self, lower: int) -> int:
        """The first absent slot at or above ``lower``, given that slots ``[lower, tail)`` all exist.

        O(log(tail - lower)) existence checks: gallop 1, 2, 4, ... then bisect.
        """
        if not self.exists(lower):
            return lower
        present, step = lower, 1
        while True:
            probe = lower + step
            if self.exists(probe):
                present, step = probe, step * 2
            else:
                absent = probe
                break
        while absent - present > 1:
            mid = (present + absent) // 2
            if self.exists(mid):
                present = mid
            else:
                absent = mid
        return absent

    def list_slots(self) -> list[int]:
        """All slots present (a LIST; used by maintenance, never on a hot path)."""
        out = []
        for name in self.storage.list(self.prefix):
            if name.endswith("/"):
                continue
            try:
                out.append(int(name))
            except ValueError:
                continue
        return out
