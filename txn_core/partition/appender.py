"""Appending to a partition log: claiming a slot and creating its entry (PROTOCOL.md "Partition log" "Append",
"Damage").

Holds :class:`AppendResult` (where an entry landed) and :class:`Appender`, any number of which (in any number
of processes) append to one partition at once:

1. Know the tail ``(slot, next_offset)``: cached from this process's last append or read, else found by the
   tail search (:mod:`txn_core.partition.tail`).
2. ``create_resolving`` the entry at ``slot`` with ``base_offset = next_offset``.
3. Lost the race: read the winner's header, advance to ``(slot + 1, winner.next_offset)``, go to 2 with the
   same payload and writer id. An unknown outcome is resolved by reading the slot back.

A second append of this process while one is in flight claims the slot after it and starts its create at
once, visible only after the first landed (:mod:`txn_core.partition.appendchain`); if the first did not land,
it claims again at step 1.

Invariants: offsets never collide (one slot, one winner) and no append is lost (the loser moves on). An
appender never fills a hole (a missing slot with a later one present): after a lost race it probes past the
next slot, and goes on at the tail past a hole it finds there. An entry of kind LOST is never written.

Locking: the index's lock (:attr:`SlotIndex.lock`) guards this appender's chain (its last append in flight)
together with the cached tail, so a claim and the tail it extends are read and set as one. It is held to
claim (with the tail search's requests when no append of this process is in flight ahead:
:meth:`TailSearch.tail_locked`), to settle, and to move the tail past the winner of a lost race (its header
read and the probes past it), never across a create.

Crash windows: a crash before the create leaves nothing; the create is atomic, so a crash during it leaves
either the whole entry or nothing (on local disk without ``O_TMPFILE``, possibly a ``.tmp-*`` file nobody
lists). A crash with appends in flight in a chain leaves a prefix of the chain: never a slot missing below a
present one. A claim is settled whatever ends its append (an error, an interrupt), so appends claimed
behind it never wait for ever.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from txn_core.errors import ObjectExistsError
from txn_core.format.entry import EntryHeader
from txn_core.format.slotlog import SlotLog
from txn_core.partition.appendchain import ChainGate, Claim
from txn_core.partition.fetch import EntryFetcher
from txn_core.partition.holes import HOLE_PROBES_CHEAP, probe_after
from txn_core.partition.index import SlotIndex
from txn_core.partition.tail import TailSearch
from txn_core.storage.base import GateClosedError, Storage, create_resolving


@dataclass(frozen=True, slots=True)
class AppendResult:
    slot: int
    base_offset: int
    record_count: int
    timestamp_ms: int

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.record_count


class Appender:
    """Appends entries to one partition log. Given the storage and its slot log, the index (the cached tail,
    the lock, where entries are), the tail search, the fetcher whose header reads remember, and the
    monotonic clock (when the tail was last confirmed)."""

    def __init__(
        self,
        storage: Storage,
        entries: SlotLog,
        index: SlotIndex,
        tail: TailSearch,
        fetcher: EntryFetcher,
        *,
        monotonic: Callable[[], float],
    ) -> None:
        self.storage = storage
        self.entries = entries
        self.index = index
        self.tail = tail
        self.fetcher = fetcher
        self.monotonic = monotonic
        self._chain: Claim | None = None  # this process's last append in flight; guarded by index.lock

    def append(
        self, template: EntryHeader, chunks: Sequence[bytes | memoryview], gate: Callable[[], bool] | None
    ) -> AppendResult:
        """Append the entry ``template`` describes (its base offset is set where it lands) with the payload
        ``chunks``; returns where it landed. ``gate``: see :meth:`PartitionLog.append`."""
        index = self.index
        record_count, wid, ts = template.record_count, template.writer_id, template.timestamp_ms
        while True:
            with index.lock:
                # Behind this process's append in flight, if any (txn_core.partition.appendchain), else at the tail.
                prev = self._chain
                slot, offset = (prev.slot + 1, prev.next_offset) if prev is not None else self.tail.tail_locked(False)
                header = template.with_base_offset(offset).encode()  # may raise: before anything is claimed
                claim = self._chain = Claim(slot, offset + record_count)
            try:
                chain_gate = ChainGate(prev, gate)
                try:
                    create_resolving(
                        self.storage,
                        self.entries.key(slot),
                        [header, *chunks],
                        header,
                        gate=chain_gate if prev is not None or gate is not None else None,
                    )
                except GateClosedError:
                    self._settle(claim, False)
                    if chain_gate.prev_failed:
                        continue  # the append ahead did not land: claim again
                    raise
                except ObjectExistsError:
                    if chain_gate.opened:
                        gate = None  # it opened: the data may be visible from now on
                    with index.lock:
                        self._settle_locked(claim, False)
                        ours = self._after_lost_race_locked(slot, wid)
                    if ours is not None:
                        return AppendResult(slot, ours.base_offset, record_count, ts)
                    continue
                with index.lock:
                    index.advance_to(slot + 1, offset + record_count)
                    index.tail_checked = self.monotonic()
                    index.note(offset, slot, record_count)
                    self._settle_locked(claim, True)
                return AppendResult(slot, offset, record_count, ts)
            finally:
                if not claim.settled:
                    # An error or an interrupt anywhere above (a crash, a failed create, Ctrl-C): appends claimed
                    # behind this one must not wait for ever; they claim again.
                    self._settle(claim, False)

    def _settle(self, claim: Claim, landed: bool) -> None:
        with self.index.lock:
            self._settle_locked(claim, landed)

    def _settle_locked(self, claim: Claim, landed: bool) -> None:
        """Settle ``claim``. The next append claims from the tail when it was the last of the chain, or when it
        failed: whatever was claimed behind it fails too and claims again. (A failure can so end the chain while
        a newer claim is in flight; the next append then asks the tail, which does not include that claim, and
        may try its slot: the create lets one of them win, as between processes, and the loser moves on.)"""
        if self._chain is claim or not landed:
            self._chain = None
        claim.settle(landed)

    def _after_lost_race_locked(self, slot: int, wid: bytes) -> EntryHeader | None:
        """Another entry is at ``slot``: the winner's header when it is this append's own earlier attempt
        (resolved on a later round); else None, with the tail moved past the winner (and past a hole after it,
        which is never filled)."""
        # Beside the winner's header: is the next slot free, and is anything present past it?
        nxt = probe_after(self.entries, slot, (1, *(1 + d for d in HOLE_PROBES_CHEAP)), {})
        winner = self.fetcher.read_header(slot)
        if winner.writer_id == wid:
            self.index.advance_to(slot + 1, winner.next_offset)
            return winner
        self.index.remember(slot, winner)
        slot, offset = slot + 1, winner.next_offset
        later = [p for p, f in nxt[1:] if f.result()]
        if later and not nxt[0][1].result() and not self.entries.exists(slot):
            # The next slot is missing while a later one is present (asked again after that one was seen: no
            # racing append explains it): a hole. Never fill it: go on past it.
            slot = self.tail.free_slot(max(later))
            offset = self.fetcher.read_header(slot - 1).next_offset
        self.index.advance_to(slot, offset)
        return None
