"""A dense sequence of immutable objects ``<prefix><020d slot>`` (PROTOCOL.md "Slot logs").

Slot logs carry every ordered record stream in txnlog: partition entries, coordinator records, producer-id
blocks, topic metadata versions. Slot ``n+1`` is only ever created by a writer that has read slot ``n``,
and objects are complete-or-absent, so above a known lower bound the existing slots form a gap-free
prefix. That lets :meth:`SlotLog.find_tail` find the first free slot with O(log n) existence checks
(galloping, then bisection) and no LIST, and lets readers poll with one GET of the next slot.
"""

from __future__ import annotations

from txn_core.format.paths import slot_name, slot_names
from txn_core.storage.base import Storage
from txn_core.storage.parallel import parallel_map

#: Galloping probes overlapped in one round of :meth:`SlotLog.find_tail` (the first reaches ``lower + 2**5``,
#: each further one 6 powers of 2 more).
GALLOP = 6
#: Probes per bisection round of :meth:`SlotLog.find_tail` (each round narrows the bracket 8-fold).
SPLIT = 7


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

    def find_tail(self, lower: int, *, near: bool = False, seen: dict[int, bool] | None = None) -> int:
        """The first absent slot at or above ``lower``, given that slots ``[lower, tail)`` all exist.

        Existence checks overlapped in rounds: the first round probes ``lower`` and ``lower + 2**i`` for
        ``i < GALLOP`` together, further rounds the next ``GALLOP`` powers of 2 until one is absent; then
        each round splits the bracket ``(present, absent)`` into ``SPLIT + 1`` parts. A tail ``n`` slots
        above ``lower`` costs about ``log2(n)/6 + log8(n)`` round trips (5 for a thousand slots, 10 for a
        million) instead of ``2 log2(n)`` one after another.

        Concurrent appends only add slots at the tail, so a probe may see a slot that an earlier probe
        of a higher slot missed; the bracket keeps the highest slot seen present and the lowest absent
        slot above it, which is always a valid bracket (the present slots form a prefix at any instant).

        ``near``: the caller expects the tail at ``lower`` or just above (a known version or a hint), so
        the first round probes only ``lower`` and ``lower + 1``.

        ``seen``: filled with every slot probed and whether it existed (a caller checking for a hole, a
        missing slot with a later one present, needs no second probe of a slot already answered).
        """
        present, absent = lower - 1, None
        reach = 1 if near else GALLOP
        probes = [lower] + [lower + (1 << i) for i in range(reach)]
        while True:
            if absent is not None:
                span = absent - present
                if span <= 1:
                    return absent
                step = max(1, span // (SPLIT + 1))
                probes = list(range(present + step, absent, step))[:SPLIT]
            results = list(zip(probes, parallel_map(self.exists, probes, leaf=True), strict=True))
            if seen is not None:
                seen.update(results)
            present = max([present] + [slot for slot, found in results if found])
            above = [slot for slot, found in results if not found and slot > present]
            if above:
                absent = min(above) if absent is None else min(absent, *above)
            elif absent is None:  # the tail lies further: gallop on from where the last round reached
                probes = [lower + (1 << i) for i in range(reach, reach + GALLOP)]
                reach += GALLOP

    def listed_end(self) -> tuple[int, bool] | None:
        """One past the greatest slot the first page of a LIST shows (0: none), and whether that page listed
        every slot (else the slot is only a lower bound of the end); None when the store cannot list one page
        alone. A hint: the listing may be stale or eventually consistent, so the caller checks the slot it
        names (PROTOCOL.md "Slot logs", "Listing"). One request, however many slots there are."""
        page = self.storage.list_page(self.prefix)
        if page is None:
            return None
        names = slot_names(page[0])
        return (int(names[-1]) + 1 if names else 0), page[1]

    def list_slots(self) -> list[int]:
        """All slots present (a LIST; used by maintenance, never on a hot path)."""
        return [int(name) for name in slot_names(self.storage.list(self.prefix))]
