"""The replayed state of one subscription: cursor plus pending acknowledgements (PROTOCOL.md
"Subscriptions", "Replay").

:class:`SubscriptionState` is a pure function of the subscription's ack log: a fold of its entries in slot
order with :meth:`SubscriptionState.apply`. Two replicas that applied the same prefix are equal, so every
process reaches the same verdict on every acknowledgement ("first in log order wins") without talking to
anyone. It holds:

* the **cursor** (committed acknowledgements): ``mark_delete`` (every offset below it is acknowledged),
  ``acked`` (topic entry base -> ``[count, ack set]`` for entries above it with some committed acks) and
  ``skipped`` (ranges of offsets read_committed never delivers: markers, aborted data);
* the **pending acks** (Pulsar's PendingAckHandle): ``txns`` (open transaction -> its acks per entry, and
  its cumulative bound; Pulsar's ``individualAckOfTransaction``), ``pending`` (entry base -> ``[count,
  combined ack set]``: the committed ack set ANDed with every open transaction's; Pulsar's
  ``individualAckPositions``) and ``holders`` (entry base -> the open transactions holding bits of it);
* ``ended``: the newest outcomes of transactions whose marker this log has (a later ack of one of them is
  a zombie write, and void).

**Ownership invariant** (checked by :meth:`_check`): every cleared bit of a combined ack set is cleared by
exactly one party, the cursor or one open transaction. Conflict checks keep it (an acknowledgement of a
bit someone else holds is refused), and it is what makes the abort procedure exact: flip the aborted
transaction's ack set and OR it into the combined one (:func:`bitsets.restore`) — only its own bits come
back, whatever other transactions did to the same entry.

Complexity: an acknowledgement of ``k`` entries costs O(k log n) (``n`` = entries above the mark-delete);
a marker costs O(entries its transaction touched).
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from sortedcontainers import SortedDict

from txn_core.clients.subscriptions import bitsets
from txn_core.clients.subscriptions.records import AckOp, AckRecord, EntryAck
from txn_core.errors import CorruptDataError
from txn_core.format.entry import EntryHeader, EntryKind
from txn_core.format.ids import TxnId

#: Ended-transaction outcomes kept (memory and snapshots); older zombies are found via the coordinator.
ENDED_KEPT = 10_000
STATE_VERSION = 1


class AckStatus(enum.Enum):
    UNACKED = "unacked"
    PENDING = "pending"  # held by an open transaction's acknowledgement
    ACKED = "acked"


@dataclass(frozen=True, slots=True)
class Conflict:
    """Why one offset of an acknowledgement could not be applied."""

    offset: int
    holder: TxnId | None  # the open transaction holding it; None: already acknowledged

    def __str__(self) -> str:
        if self.holder is None:
            return f"{self.offset} (already acknowledged)"
        return f"{self.offset} (pending in transaction {self.holder})"


@dataclass(frozen=True, slots=True)
class Verdict:
    """The outcome of one ack record, decided by replay at its position in the ack log."""

    slot: int
    txn: TxnId | None
    accepted: bool
    reason: str = ""
    conflicts: tuple[Conflict, ...] = ()


@dataclass
class PendingTxn:
    """The acknowledgements an open transaction holds (Pulsar's ``individualAckOfTransaction``)."""

    txn: TxnId
    first_slot: int
    acks: dict[int, list[int]] = field(default_factory=dict)  # base -> [count, ack set of this txn]
    cumulative: int = 0  # a pending cumulative ack of every offset below this (0: none)


def _overlapping(d: SortedDict, first: int, end: int) -> Iterator[tuple[int, list[int]]]:
    """Items ``base -> [count, ...]`` of ``d`` whose extent overlaps ``[first, end)``."""
    i = max(d.bisect_right(first) - 1, 0)
    keys = d.keys()
    while i < len(keys):
        base = keys[i]
        if base >= end:
            return
        value = d[base]
        if base + value[0] > first:
            yield base, value
        i += 1


class SubscriptionState:
    """See module doc. Not thread-safe; owned by one :class:`~txn_core.clients.subscriptions.acklog.AckLog`."""

    def __init__(self, mark_delete: int, *, slot: int = 0, position: int = 0) -> None:
        self.mark_delete = mark_delete
        self.acked: SortedDict = SortedDict()  # base -> [count, committed ack set]
        self.skipped: SortedDict = SortedDict()  # first -> end
        self.pending: SortedDict = SortedDict()  # base -> [count, combined ack set]
        self.holders: dict[int, list[TxnId]] = {}
        self.txns: dict[TxnId, PendingTxn] = {}
        self.ended: OrderedDict[TxnId, bool] = OrderedDict()
        self.slot = slot  # next ack-log slot to apply
        self.position = position  # next ack-log offset
        self.accepted_count = 0
        self.void_count = 0

    # --- queries --------------------------------------------------------------------------------

    def status(self, offset: int) -> AckStatus:
        """Whether topic ``offset`` is acknowledged, held by an open transaction, or neither."""
        if self._committed_acked(offset):
            return AckStatus.ACKED
        return AckStatus.PENDING if self.holder_of(offset) is not None else AckStatus.UNACKED

    def holder_of(self, offset: int) -> TxnId | None:
        """The open transaction whose acknowledgement holds ``offset``, if any."""
        for base, (count, _combined) in _overlapping(self.pending, offset, offset + 1):
            bit = 1 << (offset - base)
            for t in self.holders.get(base, ()):
                if not self.txns[t].acks[base][1] & bit and offset - base < count:
                    return t
        for pt in self.txns.values():
            if offset < pt.cumulative and not self._committed_acked(offset):
                return pt.txn
        return None

    def first_unacked(self, first: int, end: int) -> int | None:
        """The first offset in ``[first, end)`` not acknowledged by the cursor (pending ones count as
        unacknowledged), or None."""
        o = max(first, self.mark_delete)
        while o < end:
            i = self.skipped.bisect_right(o) - 1
            if i >= 0:
                s, e = self.skipped.peekitem(i)
                if s <= o < e:
                    o = e
                    continue
            i = self.acked.bisect_right(o) - 1
            if i >= 0:
                base, (count, ack_set) = self.acked.peekitem(i)
                if base <= o < base + count:
                    rest = ack_set >> (o - base)
                    if rest == 0:
                        o = base + count
                        continue
                    return int(o + ((rest & -rest).bit_length() - 1))
            return o
        return None

    def open_transactions(self) -> list[TxnId]:
        return list(self.txns)

    def pending_offsets(self, txn: TxnId) -> list[int]:
        """Offsets individually acknowledged by open transaction ``txn`` (not its cumulative range)."""
        t = self.txns.get(txn)
        if t is None:
            return []
        return [
            base + i for base, (count, s) in sorted(t.acks.items()) for i in bitsets.indexes(bitsets.cleared(s, count))
        ]

    def acked_above_mark_delete(self) -> int:
        """Records acknowledged individually at or above the mark-delete position (skips excluded). An entry's
        ack set may begin below it (the mark-delete moved into the entry): those records are not counted."""
        total = 0
        for base, (count, ack_set) in self.acked.items():
            acked = bitsets.cleared(ack_set, count) >> max(0, self.mark_delete - base)
            total += bin(acked).count("1")
        return total

    # --- committed bits ---------------------------------------------------------------------------

    def _committed_acked(self, offset: int) -> bool:
        if offset < self.mark_delete:
            return True
        i = self.skipped.bisect_right(offset) - 1
        if i >= 0 and offset < self.skipped.peekitem(i)[1]:
            return True
        i = self.acked.bisect_right(offset) - 1
        if i >= 0:
            base, (count, ack_set) = self.acked.peekitem(i)
            if offset < base + count:
                return not (ack_set >> (offset - base)) & 1
        return False

    def _committed_cleared(self, base: int, count: int) -> int:
        """Mask of the records of entry ``[base, base + count)`` the cursor has acknowledged."""
        mask = bitsets.below(count, self.mark_delete - base)
        entry = self.acked.get(base)
        if entry is not None:
            mask |= bitsets.cleared(entry[1], count)
        for s, e in self._skips_overlapping(base, base + count):
            mask |= bitsets.below(count, e - base) & ~bitsets.below(count, s - base)
        return mask

    def _committed_set(self, base: int, count: int) -> int:
        return bitsets.full(count) & ~self._committed_cleared(base, count)

    def _skips_overlapping(self, first: int, end: int) -> Iterator[tuple[int, int]]:
        i = max(0, self.skipped.bisect_right(first) - 1)
        keys = self.skipped.keys()
        while i < len(keys) and keys[i] < end:
            s = keys[i]
            e = self.skipped[s]
            if e > first:
                yield s, e
            i += 1

    def _extent_problem(self, a: EntryAck) -> str | None:
        for d in (self.acked, self.pending):
            for base, value in _overlapping(d, a.base, a.end):
                if base != a.base or value[0] != a.count:
                    return f"entry [{a.base}, {a.end}) disagrees with the known entry [{base}, {base + value[0]})"
        return None

    def _held_by_others(self, base: int, count: int, txn: TxnId | None, committed: int) -> list[tuple[int, TxnId]]:
        """(mask, holder) for every open transaction other than ``txn`` holding records of the entry."""
        out = []
        for t in self.holders.get(base, ()):
            if t != txn:
                out.append((bitsets.cleared(self.txns[t].acks[base][1], count), t))
        for pt in self.txns.values():
            if pt.txn != txn and pt.cumulative > base:
                mask = bitsets.below(count, pt.cumulative - base) & ~committed
                if mask:
                    out.append((mask, pt.txn))
        return out

    # --- replay ---------------------------------------------------------------------------------

    def apply(self, slot: int, header: EntryHeader, record: AckRecord | None, key: str) -> Verdict | None:
        """Apply the entry at ``slot`` (the next one); returns the verdict of an ack record."""
        if slot != self.slot or header.base_offset != self.position:
            raise CorruptDataError(
                f"{key}: entry at slot {slot} offset {header.base_offset}, but the subscription state is at "
                f"slot {self.slot} offset {self.position}",
                key,
            )
        verdict: Verdict | None = None
        if header.carried is not None:  # applied first, as a partition's buffer does
            self.apply_marker(header.carried.txn, header.carried.committed)
        if header.kind in (EntryKind.COMMIT, EntryKind.ABORT):
            if header.txn is None:
                raise CorruptDataError(f"{key}: a marker without a transaction", key)
            self.apply_marker(header.txn, header.kind == EntryKind.COMMIT)
        elif header.kind == EntryKind.DATA and record is not None:
            verdict = self.apply_record(slot, header.txn, record)
        else:
            raise CorruptDataError(f"{key}: entry kind {header.kind.name} does not belong in an ack log", key)
        self.slot = slot + 1
        self.position = header.next_offset
        return verdict

    def apply_marker(self, txn: TxnId, committed: bool) -> None:
        """COMMIT applies the transaction's acks to the cursor; ABORT discards them (flip + OR)."""
        if txn in self.ended:
            return
        t = self.txns.pop(txn, None)
        if t is not None:
            if committed:
                self._commit(t)
            else:
                self._abort(t)
        self._remember_end(txn, committed)
        self._advance()

    def _remember_end(self, txn: TxnId, committed: bool) -> None:
        self.ended[txn] = committed
        while len(self.ended) > ENDED_KEPT:
            self.ended.popitem(last=False)

    def _commit(self, t: PendingTxn) -> None:
        for base, (count, tset) in t.acks.items():
            entry = self.acked.get(base)
            self.acked[base] = [count, bitsets.merge(entry[1] if entry else bitsets.full(count), tset)]
            self._release(base, t.txn)
        self.mark_delete = max(self.mark_delete, t.cumulative)

    def _abort(self, t: PendingTxn) -> None:
        for base, (count, tset) in t.acks.items():
            entry = self.pending[base]
            entry[1] = bitsets.restore(entry[1], tset, count)  # the seed's flip + OR
            self._release(base, t.txn)

    def _release(self, base: int, txn: TxnId) -> None:
        holders = self.holders[base]
        holders.remove(txn)
        if not holders:
            del self.holders[base]
            del self.pending[base]

    def apply_record(self, slot: int, txn: TxnId | None, record: AckRecord) -> Verdict:
        """Apply one acknowledgement request; it is void (no effect but its skips) on any conflict."""
        for first, end in record.skips:
            self._add_skip(first, end)
        if txn is not None and txn in self.ended:
            return self._void(slot, txn, f"transaction {txn} already ended in this ack log (a zombie write)")
        if record.op is AckOp.SKIP:
            return self._accept(slot, txn)
        if record.op is AckOp.LOST:
            if txn is not None:
                return self._void(slot, txn, "giving up offsets removed by retention is never transactional")
            self._give_up(record.upto)
            return self._accept(slot, txn)
        if record.op is AckOp.CUMULATIVE:
            return self._apply_cumulative(slot, txn, record.upto)
        plans: list[tuple[EntryAck, int]] = []
        conflicts: list[Conflict] = []
        own = self.txns.get(txn) if txn is not None else None
        for a in record.acks:
            problem = self._extent_problem(a)
            if problem is not None:
                return self._void(slot, txn, problem)
            want = a.cleared
            committed = self._committed_cleared(a.base, a.count)
            if txn is not None and want & committed:
                conflicts.extend(Conflict(a.base + i, None) for i in bitsets.indexes(want & committed))
            for mask, holder in self._held_by_others(a.base, a.count, txn, committed):
                conflicts.extend(Conflict(a.base + i, holder) for i in bitsets.indexes(want & mask))
            mine = 0
            if own is not None:
                entry = own.acks.get(a.base)
                if entry is not None:
                    mine |= bitsets.cleared(entry[1], a.count)
                mine |= bitsets.below(a.count, own.cumulative - a.base) & ~committed
            plans.append((a, want & ~committed & ~mine))
        if conflicts:
            return self._void(
                slot, txn, "conflicting acknowledgement", tuple(sorted(conflicts, key=lambda c: c.offset))
            )
        for a, new in plans:
            if not new:
                continue
            if txn is None:
                entry = self.acked.get(a.base)
                self.acked[a.base] = [a.count, (entry[1] if entry else bitsets.full(a.count)) & ~new]
                if a.base in self.pending:
                    self.pending[a.base][1] &= ~new
            else:
                pt = self.txns.get(txn)
                if pt is None:
                    pt = self.txns[txn] = PendingTxn(txn, slot)
                entry = pt.acks.get(a.base)
                pt.acks[a.base] = [a.count, (entry[1] if entry else bitsets.full(a.count)) & ~new]
                combined = self.pending.get(a.base)
                if combined is None:
                    self.pending[a.base] = [a.count, self._committed_set(a.base, a.count) & ~new]
                    self.holders[a.base] = [txn]
                else:
                    combined[1] &= ~new
                    if txn not in self.holders[a.base]:
                        self.holders[a.base].append(txn)
        self._advance()
        return self._accept(slot, txn)

    def _apply_cumulative(self, slot: int, txn: TxnId | None, upto: int) -> Verdict:
        md = self.mark_delete
        if upto <= md:
            if txn is None:
                return self._accept(slot, txn)
            return self._void(
                slot, txn, "everything below the cumulative bound is already acknowledged", (Conflict(upto - 1, None),)
            )
        conflicts: list[Conflict] = []
        for base, (count, _comb) in _overlapping(self.pending, md, upto):
            for t in self.holders[base]:
                if t != txn:
                    mask = bitsets.cleared(self.txns[t].acks[base][1], count) & bitsets.below(count, upto - base)
                    conflicts.extend(Conflict(base + i, t) for i in bitsets.indexes(mask))
        for pt in self.txns.values():
            if pt.txn != txn and pt.cumulative > md:
                o = self.first_unacked(md, min(upto, pt.cumulative))
                if o is not None:
                    conflicts.append(Conflict(o, pt.txn))
        if conflicts:
            return self._void(
                slot, txn, "conflicting cumulative acknowledgement", tuple(sorted(conflicts, key=lambda c: c.offset))
            )
        if txn is None:
            self.mark_delete = upto
        else:
            own = self.txns.get(txn)
            if own is None:
                own = self.txns[txn] = PendingTxn(txn, slot)
            own.cumulative = max(own.cumulative, upto)
        self._advance()
        return self._accept(slot, txn)

    def _give_up(self, upto: int) -> None:
        """Move the mark-delete position to ``upto``: retention removed the offsets below it (a ``lost``
        record). Acknowledgements below it, committed or held by open transactions, are dropped; such a
        transaction still commits or aborts as before, with what it holds above ``upto``."""
        if upto <= self.mark_delete:
            return
        self.mark_delete = upto
        for txn, pt in list(self.txns.items()):  # what open transactions hold below it is no longer theirs
            for base in [b for b in pt.acks if b < upto]:
                count, tset = pt.acks[base]
                tset |= bitsets.below(count, upto - base)
                if tset == bitsets.full(count):
                    del pt.acks[base]
                    self._release(base, txn)
                else:
                    pt.acks[base] = [count, tset]
            if pt.cumulative <= upto:
                pt.cumulative = 0
            if not pt.acks and not pt.cumulative:
                del self.txns[txn]  # holds nothing now; its marker, when it lands, changes nothing
        self._advance()  # drops what lies below it, and passes a skipped range it lands in

    def _accept(self, slot: int, txn: TxnId | None) -> Verdict:
        self.accepted_count += 1
        return Verdict(slot, txn, True)

    def _void(self, slot: int, txn: TxnId | None, reason: str, conflicts: tuple[Conflict, ...] = ()) -> Verdict:
        self.void_count += 1
        return Verdict(slot, txn, False, reason, conflicts)

    def _add_skip(self, first: int, end: int) -> None:
        """Mark ``[first, end)`` as never delivered, except offsets of entries the state already knows."""
        first = max(first, self.mark_delete)
        if first >= end:
            return
        pieces = [(first, end)]
        for d in (self.acked, self.pending):
            for base, (count, _bits) in _overlapping(d, first, end):
                nxt = []
                for s, e in pieces:
                    if base + count <= s or base >= e:
                        nxt.append((s, e))
                        continue
                    if s < base:
                        nxt.append((s, base))
                    if base + count < e:
                        nxt.append((base + count, e))
                pieces = nxt
        for piece in pieces:
            lo, hi = piece
            for os, oe in list(self._skips_overlapping(lo - 1, hi + 1)):  # merge overlapping and adjacent
                del self.skipped[os]
                lo, hi = min(lo, os), max(hi, oe)
            self.skipped[lo] = hi
        self._advance()

    def _advance(self) -> None:
        """Move the mark-delete position over acknowledged entries and skipped ranges; drop what it passed."""
        while True:
            md = self.mark_delete
            if self.skipped:
                s, e = self.skipped.peekitem(0)
                if s <= md:
                    del self.skipped[s]
                    self.mark_delete = max(md, e)
                    continue
            if self.acked:
                base, (count, ack_set) = self.acked.peekitem(0)
                if base + count <= md:
                    del self.acked[base]
                    continue
                if base <= md:
                    rest = ack_set >> (md - base)
                    if rest == 0:
                        del self.acked[base]
                        self.mark_delete = base + count
                        continue
                    if rest & 1 == 0:  # into the entry, up to its first unacknowledged record
                        self.mark_delete = md + (rest & -rest).bit_length() - 1
                        continue
            break
        md = self.mark_delete
        for d in (self.acked, self.pending):
            for base, value in _overlapping(d, 0, md):
                value[1] &= ~bitsets.below(value[0], md - base)

    # --- snapshots ------------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "slot": self.slot,
            "position": self.position,
            "mark_delete": self.mark_delete,
            "acked": [[b, c, bitsets.to_hex(s)] for b, (c, s) in self.acked.items()],
            "skipped": [[s, e] for s, e in self.skipped.items()],
            "pending": [
                [
                    str(pt.txn),
                    pt.first_slot,
                    pt.cumulative,
                    [[b, c, bitsets.to_hex(s)] for b, (c, s) in pt.acks.items()],
                ]
                for pt in self.txns.values()
            ],
            "ended": [[str(t), c] for t, c in self.ended.items()],
            "accepted": self.accepted_count,
            "void": self.void_count,
        }

    @classmethod
    def from_json(cls, v: dict[str, Any], key: str) -> SubscriptionState:
        try:
            if int(v["version"]) != STATE_VERSION:
                raise CorruptDataError(f"{key}: subscription state version {v['version']} is not supported", key)
            st = cls(int(v["mark_delete"]), slot=int(v["slot"]), position=int(v["position"]))
            for b, c, s in v["acked"]:
                st.acked[int(b)] = [int(c), bitsets.from_hex(s, int(c), key)]
            for s, e in v["skipped"]:
                st.skipped[int(s)] = int(e)
            for txn_text, first_slot, cumulative, acks in v["pending"]:
                txn = TxnId.parse(txn_text)
                pt = st.txns[txn] = PendingTxn(txn, int(first_slot), {}, int(cumulative))
                for b, c, s in acks:
                    base, count = int(b), int(c)
                    tset = bitsets.from_hex(s, count, key)
                    pt.acks[base] = [count, tset]
                    st.holders.setdefault(base, []).append(txn)
            for base in st.holders:
                count = st.txns[st.holders[base][0]].acks[base][0]
                combined = st._committed_set(base, count)
                for t in st.holders[base]:
                    combined &= st.txns[t].acks[base][1]
                st.pending[base] = [count, combined]
            st.ended = OrderedDict((TxnId.parse(t), bool(c)) for t, c in v["ended"])
            st.accepted_count, st.void_count = int(v.get("accepted", 0)), int(v.get("void", 0))
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptDataError(f"{key}: malformed subscription state: {exc!r}", key) from exc
        return st

    # --- invariants -----------------------------------------------------------------------------

    def _check(self) -> None:
        """Assert every invariant (called by the randomized tests after each step)."""
        md = self.mark_delete
        if md < 0 or self.slot < 0 or self.position < 0:
            raise AssertionError("negative position")
        prev_end = -1
        for base, (count, ack_set) in self.acked.items():
            if base < prev_end or base + count <= md or not 0 <= ack_set < bitsets.full(count) + 1:
                raise AssertionError(f"acked entry {base}+{count} out of order, below md or bad bits")
            if ack_set & bitsets.below(count, md - base):
                raise AssertionError(f"acked entry {base} has unacked bits below the mark-delete {md}")
            if base <= md and not (ack_set >> (md - base)) & 1:
                raise AssertionError(f"acked entry {base}: the record at the mark-delete {md} is acknowledged")
            prev_end = base + count
        prev_end = -1
        for s, e in self.skipped.items():
            if not md < s < e or s <= prev_end:
                raise AssertionError(f"skip range [{s}, {e}) overlaps, touches another or is at/below md {md}")
            for d in (self.acked, self.pending):
                if any(True for _ in _overlapping(d, s, e)):
                    raise AssertionError(f"skip range [{s}, {e}) overlaps a known entry")
            prev_end = e
        if set(self.pending) != set(self.holders):
            raise AssertionError("pending and holders disagree")
        for base, (count, combined) in self.pending.items():
            holders = self.holders[base]
            if not holders or len(set(holders)) != len(holders):
                raise AssertionError(f"entry {base}: bad holders {holders}")
            committed = self._committed_cleared(base, count)
            expect = bitsets.full(count) & ~committed
            seen = committed
            for t in holders:
                tc, tset = self.txns[t].acks[base]
                if tc != count:
                    raise AssertionError(f"entry {base}: {t} records count {tc}, expected {count}")
                mine = bitsets.cleared(tset, count)
                if not mine or mine & seen:
                    raise AssertionError(f"entry {base}: bits of {t} empty or also cleared by another party")
                seen |= mine
                expect &= tset
            if combined != expect:
                raise AssertionError(f"entry {base}: combined ack set {combined:b} != {expect:b}")
        for txn, pt in self.txns.items():
            if txn in self.ended:
                raise AssertionError(f"{txn} is both open and ended")
            if not pt.acks and not pt.cumulative:
                raise AssertionError(f"{txn} holds nothing")
            for base in pt.acks:
                if txn not in self.holders.get(base, ()):
                    raise AssertionError(f"{txn} not among the holders of entry {base}")
            if pt.cumulative:
                for base, (count, _c) in _overlapping(self.pending, 0, pt.cumulative):
                    for other in self.holders[base]:
                        if other != txn and bitsets.cleared(self.txns[other].acks[base][1], count) & bitsets.below(
                            count, pt.cumulative - base
                        ):
                            raise AssertionError(f"{other} holds bits below {txn}'s cumulative ack")
        if len(self.ended) > ENDED_KEPT:
            raise AssertionError("ended cache over its bound")
