"""The subscription state as a pure fold of ack records (PROTOCOL.md "Subscriptions", "Replay").

Bitset scenarios from the seed (Pulsar's PendingAckHandle: AND on ack, flip + OR on abort), the conflict
rule, and a seeded randomized run against a per-offset model with ``_check()`` after every step.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from txn_core.clients.subscriptions import bitsets
from txn_core.clients.subscriptions.records import AckOp, AckRecord, EntryAck, entry_acks
from txn_core.clients.subscriptions.state import AckStatus, SubscriptionState
from txn_core.errors import CorruptDataError
from txn_core.format.ids import TxnId

T1, T2, T3 = TxnId(1, 10), TxnId(2, 20), TxnId(3, 30)


class Driver:
    """Feeds records to a state the way the ack log would (one slot each)."""

    def __init__(self, mark_delete: int = 0) -> None:
        self.state = SubscriptionState(mark_delete)

    def ack(
        self,
        entries: list[tuple[int, int, list[int]]],
        txn: TxnId | None = None,
        skips: tuple[tuple[int, int], ...] = (),
    ) -> bool:
        acks = tuple(EntryAck(b, c, bitsets.from_indexes(idx, c)) for b, c, idx in entries)
        rec = AckRecord(AckOp.ACK, acks, 0, skips, "test")
        return self._record(txn, rec)

    def cumulative(self, upto: int, txn: TxnId | None = None) -> bool:
        return self._record(txn, AckRecord(AckOp.CUMULATIVE, (), upto, (), "test"))

    def skip(self, first: int, end: int) -> bool:
        return self._record(None, AckRecord(AckOp.SKIP, (), 0, ((first, end),), "test"))

    def lost(self, upto: int, txn: TxnId | None = None) -> bool:
        return self._record(txn, AckRecord(AckOp.LOST, (), upto, (), "test"))

    def _record(self, txn: TxnId | None, rec: AckRecord) -> bool:
        rec = AckRecord.decode(rec.encode(), "k")  # through the wire format
        v = self.state.apply_record(self.state.slot, txn, rec)
        self.state.slot += 1
        self.state.position += 1
        self.state._check()
        return v.accepted

    def end(self, txn: TxnId, commit: bool) -> None:
        self.state.apply_marker(txn, commit)
        self.state.slot += 1
        self.state.position += 1
        self.state._check()

    def combined(self, base: int) -> str:
        count, bits = self.state.pending[base]
        return format(bits, f"0{count}b").replace("1", "T").replace("0", "F")


def test_abort_restores_exactly_the_bits_the_transaction_cleared() -> None:
    """The seed's example: batch of 4 at <1,1>; txn1 acks indexes 0 and 1, txn2 acks index 2, txn2 aborts."""
    d = Driver()
    assert d.ack([(100, 4, [0])], T1)
    assert d.combined(100) == "TTTF"  # printed like the seed: index 3 .. index 0
    assert d.ack([(100, 4, [1])], T1)
    assert d.combined(100) == "TTFF"  # TTTF AND TTFT
    assert d.ack([(100, 4, [2])], T2)
    assert d.combined(100) == "TFFF"  # TTFF AND TFTT
    d.end(T2, commit=False)  # flip(TFTT) = FTFF; TFFF OR FTFF = TTFF
    assert d.combined(100) == "TTFF"
    assert d.state.status(102) is AckStatus.UNACKED
    assert [d.state.status(o) for o in (100, 101)] == [AckStatus.PENDING] * 2
    d.end(T1, commit=True)
    assert not d.state.pending and d.state.mark_delete == 0
    assert [d.state.status(o) for o in range(100, 104)] == [AckStatus.ACKED] * 2 + [AckStatus.UNACKED] * 2


def test_interleaved_transactions_on_one_entry_each_get_back_only_their_own_bits() -> None:
    d = Driver()
    assert d.ack([(0, 6, [0])], T1)
    assert d.ack([(0, 6, [3])], T2)
    assert d.ack([(0, 6, [1, 5])], T1)
    assert d.ack([(0, 6, [4])], T2)
    assert d.ack([(0, 6, [2])])  # a plain ack of a record nobody holds
    d.end(T1, commit=False)
    assert {o for o in range(6) if d.state.status(o) is AckStatus.UNACKED} == {0, 1, 5}
    d.end(T2, commit=True)
    assert {o for o in range(6) if d.state.status(o) is AckStatus.ACKED} == {2, 3, 4}
    assert d.ack([(0, 6, [0, 1, 5])])
    assert d.state.mark_delete == 6 and not d.state.acked and not d.state.pending


def test_the_first_acknowledgement_in_log_order_wins_and_the_loser_has_no_effect() -> None:
    d = Driver()
    assert d.ack([(0, 4, [1])], T1)
    assert not d.ack([(0, 4, [0, 1])], T2)  # 1 is pending in T1: the whole request is void
    assert d.state.status(0) is AckStatus.UNACKED
    assert not d.ack([(0, 4, [1])])  # a plain ack of a pending record is refused too
    assert d.ack([(0, 4, [1])], T1)  # the holder acking again changes nothing
    d.end(T1, commit=True)
    assert not d.ack([(0, 4, [1])], T2)  # already acknowledged: a second processing
    assert d.ack([(0, 4, [1])])  # a plain duplicate is harmless
    assert d.state.void_count == 3


def test_acks_of_a_transaction_after_its_marker_are_void() -> None:
    d = Driver()
    d.end(T1, commit=False)  # marker of a transaction with nothing here yet
    assert not d.ack([(0, 1, [0])], T1)  # the zombie's write
    assert d.state.status(0) is AckStatus.UNACKED


def test_cumulative_acks_plain_and_transactional() -> None:
    d = Driver()
    assert d.ack([(5, 3, [1])], T1)  # offset 6 pending in T1
    assert not d.cumulative(8)  # plain cumulative over a pending record
    assert not d.cumulative(7, T2)
    assert d.cumulative(6, T2)  # below T1's record: fine
    assert not d.ack([(0, 5, [2])], T3)  # 2 is under T2's pending cumulative ack
    d.end(T2, commit=True)
    assert d.state.mark_delete == 6
    assert not d.cumulative(3, T3)  # everything below 3 is already acknowledged
    d.end(T1, commit=False)
    assert d.cumulative(8)
    assert d.state.mark_delete == 8 and not d.state.acked


def test_records_acknowledged_above_the_mark_delete_do_not_count_those_of_their_entry_below_it() -> None:
    d = Driver()
    assert d.ack([(0, 10, [0, 1, 2, 3])])  # one entry of ten records: its first four, in one record
    assert d.state.mark_delete == 4 and d.state.acked_above_mark_delete() == 0
    assert d.ack([(0, 10, [6, 8])])
    assert d.state.mark_delete == 4 and d.state.acked_above_mark_delete() == 2
    assert d.ack([(0, 10, [4, 5])])
    assert d.state.mark_delete == 7 and d.state.acked_above_mark_delete() == 1  # offset 8


def test_skips_let_the_mark_delete_pass_offsets_that_are_never_delivered() -> None:
    d = Driver()
    assert d.ack([(0, 2, [0, 1])])
    assert d.state.mark_delete == 2
    assert d.ack([(3, 2, [0, 1])], skips=((2, 3),))  # 2 is a commit marker in the topic
    assert d.state.mark_delete == 5
    assert d.skip(7, 9)
    assert d.state.mark_delete == 5 and dict(d.state.skipped) == {7: 9}
    assert d.ack([(5, 2, [0, 1])])
    assert d.state.mark_delete == 9 and not d.state.skipped


def test_a_lost_record_gives_up_everything_below_it_whatever_was_held() -> None:
    d = Driver()
    assert d.ack([(0, 4, [0, 1])])  # 0-1 acknowledged
    assert d.ack([(4, 4, [1, 2])], T1)  # 5-6 held by T1
    assert d.cumulative(12, T2) is False  # over T1's records
    assert d.ack([(8, 4, [1, 3])], T2)  # 9 and 11 held by T2
    assert d.skip(12, 14)
    assert not d.lost(10, T1)  # never transactional
    assert d.lost(10)
    assert d.state.mark_delete == 10 and [d.state.status(o) for o in range(10)] == [AckStatus.ACKED] * 10
    assert d.lost(6) and d.state.mark_delete == 10  # below the mark-delete: nothing changes
    assert not d.state.pending.get(4) and d.state.open_transactions() == [T2]  # T1 holds nothing now
    d.end(T1, commit=True)  # what it held lies below the mark-delete: nothing to apply
    d.end(T2, commit=False)  # 11 is unacknowledged again; 9 was given up
    assert d.state.mark_delete == 10 and not d.state.acked and not d.state.pending
    assert d.state.status(11) is AckStatus.UNACKED and d.state.status(9) is AckStatus.ACKED
    assert d.lost(13)  # lands inside a skipped range: passes it
    assert d.state.mark_delete == 14 and not d.state.skipped
    assert not d.ack([(8, 4, [0])], T3)  # below the mark-delete: already settled
    assert d.ack([(14, 2, [0, 1])]) and d.state.mark_delete == 16


def test_an_entry_with_other_bounds_than_the_known_one_is_refused() -> None:
    d = Driver()
    assert d.ack([(10, 4, [0])], T1)
    assert not d.ack([(10, 2, [1])])
    assert not d.ack([(12, 4, [0])], T2)


@pytest.mark.parametrize(
    "payload",
    [
        b"{",
        b"[]",
        b'{"v":1,"op":"nope"}',
        b'{"v":1,"op":"ack","acks":[]}',
        b'{"v":1,"op":"ack","acks":[[0,4,"f"]]}',  # acknowledges nothing
        b'{"v":1,"op":"ack","acks":[[0,4,"1f"]]}',  # bits beyond the entry
        b'{"v":1,"op":"ack","acks":[[4,2,"0"],[0,8,"0"]]}',
        b'{"v":1,"op":"cumulative","upto":0}',
        b'{"v":1,"op":"skip","skips":[[5,5]]}',
        b'{"v":1,"op":"lost"}',
        b'{"v":1,"op":"lost","upto":-3}',
    ],
)
def test_malformed_ack_records_are_corrupt_data(payload: bytes) -> None:
    with pytest.raises(CorruptDataError):
        AckRecord.decode(payload, "subscriptions/t/00000/s/acks/log/00000000000000000007")


def test_entry_acks_group_offsets_into_bitsets() -> None:
    bounds = {0: (0, 4), 1: (0, 4), 3: (0, 4), 4: (4, 1), 9: (5, 10)}
    acks = entry_acks([3, 0, 9, 4, 1, 0], bounds.__getitem__)
    assert [(a.base, a.count, format(a.ack_set, f"0{a.count}b")) for a in acks] == [
        (0, 4, "0100"),
        (4, 1, "0"),
        (5, 10, "1111101111"),
    ]
    assert acks[0].offsets() == [0, 1, 3]


# --- randomized, against a per-offset model -----------------------------------------------------------


@dataclass
class Model:
    acked: set[int] = field(default_factory=set)
    pending: dict[int, TxnId] = field(default_factory=dict)
    cumulative: dict[TxnId, int] = field(default_factory=dict)
    ended: set[TxnId] = field(default_factory=set)

    @property
    def mark_delete(self) -> int:
        o = 0
        while o in self.acked:
            o += 1
        return o

    def held(self, o: int, exclude: TxnId | None = None) -> TxnId | None:
        if o in self.acked:
            return None
        h = self.pending.get(o)
        if h is not None and h != exclude:
            return h
        for t, c in self.cumulative.items():
            if t != exclude and o < c:
                return t
        return None

    def status(self, o: int) -> AckStatus:
        if o in self.acked:
            return AckStatus.ACKED
        return AckStatus.PENDING if self.held(o) is not None else AckStatus.UNACKED

    def ack(self, offsets: list[int], txn: TxnId | None) -> bool:
        if txn is not None and txn in self.ended:
            return False
        if txn is None:
            if any(self.held(o) is not None for o in offsets):
                return False
            self.acked.update(offsets)
            return True
        if any(o in self.acked or self.held(o, exclude=txn) is not None for o in offsets):
            return False
        for o in offsets:
            if o < self.cumulative.get(txn, 0):
                continue
            self.pending.setdefault(o, txn)
        return True

    def cumulate(self, upto: int, txn: TxnId | None) -> bool:
        if txn is not None and txn in self.ended:
            return False
        md = self.mark_delete
        if upto <= md:
            return txn is None
        if any(self.held(o, exclude=txn) is not None for o in range(md, upto)):
            return False
        if txn is None:
            self.acked.update(range(upto))
        else:
            self.cumulative[txn] = max(self.cumulative.get(txn, 0), upto)
        return True

    def lost(self, upto: int) -> None:
        self.acked.update(range(upto))  # given up: nothing below it can be delivered or held again

    def end(self, txn: TxnId, commit: bool) -> None:
        if txn in self.ended:
            return
        self.ended.add(txn)
        mine = [o for o, t in self.pending.items() if t == txn]
        for o in mine:
            del self.pending[o]
        c = self.cumulative.pop(txn, 0)
        if commit:
            self.acked.update(mine)
            self.acked.update(range(c))


@pytest.mark.matrix(keep=8)
@pytest.mark.parametrize("seed", range(40))
def test_random_acks_and_markers_match_a_per_offset_model(seed: int) -> None:
    rng = random.Random(seed)
    entries: list[tuple[int, int]] = []
    o = 0
    while o < 60:
        n = rng.choice([1, 1, 2, 3, 4, 7])
        entries.append((o, n))
        o += n
    end = o
    hidden = {e for e in entries if rng.random() < 0.15}  # markers / aborted data: never delivered
    visible = [e for e in entries if e not in hidden]
    d, m = Driver(), Model()
    txns = [TxnId(rng.randrange(4), s) for s in range(1, 1000)]
    live: list[TxnId] = []
    ended: list[TxnId] = []
    for _step in range(400):
        op = rng.random()
        if op < 0.45 and visible:
            base, count = rng.choice(visible)
            idx = sorted(rng.sample(range(count), rng.randint(1, count)))
            txn = rng.choice([None, *live, txns[0]]) if live or rng.random() < 0.5 else None
            if txn is None and rng.random() < 0.3 and txns:
                txn = txns.pop(0)
                live.append(txn)
            if rng.random() < 0.05 and ended:
                txn = rng.choice(ended)  # a zombie's late write
            expect = m.ack([base + i for i in idx], txn)
            assert d.ack([(base, count, idx)], txn) == expect, (seed, _step, "ack", base, idx, txn)
        elif op < 0.55:
            upto = rng.randint(1, end)
            txn = rng.choice([None, *live]) if live else None
            expect = m.cumulate(upto, txn)
            assert d.cumulative(upto, txn) == expect, (seed, _step, "cumulative", upto, txn)
        elif op < 0.58:
            upto = rng.randint(1, end)
            m.lost(upto)
            assert d.lost(upto), (seed, _step, "lost", upto)
        elif op < 0.65 and hidden:
            base, count = rng.choice(sorted(hidden))
            m.acked.update(o for o in range(base, base + count) if o >= m.mark_delete)
            assert d.skip(base, base + count)
        elif live:
            txn = rng.choice(live)
            live.remove(txn)
            ended.append(txn)
            commit = rng.random() < 0.6
            m.end(txn, commit)
            d.end(txn, commit)
        assert d.state.mark_delete == m.mark_delete, (seed, _step)
        assert [d.state.status(o) for o in range(end + 2)] == [m.status(o) for o in range(end + 2)], (seed, _step)
        if _step % 17 == 0:  # a snapshot round trip is the same state
            again = SubscriptionState.from_json(d.state.to_json(), "snap")
            again._check()
            assert again.to_json() == d.state.to_json()
            d.state = again
