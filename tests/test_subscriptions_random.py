"""Seeded randomized runs of consumers, plain and transactional acknowledgements, aborts, negative
acknowledgements, crashes and clock jumps on one subscription, against a simple model.

After every step: the replayed state satisfies ``_check()``; every record the model knows acknowledged
is acknowledged; no record is delivered while it is acknowledged or pending, nor to a second consumer
while the first still holds it with time left; at the end everything is acknowledged exactly once.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable, Sequence

import pyarrow as pa
import pytest
from fakeclock import FakeClock

import txn_core
from txn_core import AckStatus, DeadLetterPolicy, RedeliveryBackoff, TransactionConflictError
from txn_core.storage import MemoryStorage

SCHEMA = pa.schema([("id", pa.int64())])
T = 10_000


def _log_with_input(seed: int, rng: random.Random, clock: FakeClock) -> tuple[txn_core.Log, int]:
    """A log whose topic ``in`` holds plain entries and transactions, some aborted (markers and aborted data
    to skip); returns it and the partition's end offset."""
    log = txn_core.Log(MemoryStorage(f"rand-{seed}-{uuid.uuid4().hex}"), clock=clock)
    log.create_topic("in", 1, SCHEMA)
    plain, inp = log.producer(), log.producer("input", transaction_timeout_ms=T)
    inp.init_transactions()
    for i in range(0, 120, 6):
        ids = list(range(i, i + rng.randint(1, 6)))
        if rng.random() < 0.25:
            inp.begin_transaction()
            inp.send("in", pa.table({"id": ids}), partition=0)
            (inp.abort_transaction if rng.random() < 0.4 else inp.commit_transaction)()
        else:
            plain.send("in", pa.table({"id": ids}), partition=0)
            plain.flush()
    inp.wait_for_completion()
    return log, log.partition_log("topics/in/00000").end_offset()


def _drain_to_the_end(last: txn_core.SubscriptionConsumer, acked: set[int], end: int) -> None:
    """Receive and acknowledge everything left: nothing acknowledged comes again; the state ends empty."""
    for _ in range(200):
        got = last.receive(50)
        if not got.num_rows and last.state().mark_delete == end:
            break
        assert not set(got.column("_offset").to_pylist()) & acked
        last.acknowledge(got)
        acked.update(got.column("_offset").to_pylist())
    st = last.state()
    st._check()
    assert st.mark_delete == end and not st.txns and not st.acked and not st.pending


@pytest.mark.matrix(keep=3)
@pytest.mark.parametrize("seed", range(10))
def test_random_consumers_and_transactions_keep_every_invariant(seed: int) -> None:
    rng = random.Random(seed)
    clock = FakeClock()
    log, end = _log_with_input(seed, rng, clock)

    size = rng.choice([4, 8, 16])

    def consumer(i: int) -> txn_core.SubscriptionConsumer:
        return log.subscribe(
            "in", 0, "s", consumer_name=f"c{i}", ack_timeout_ms=T, nack_delay_ms=rng.choice([0, 3000]), range_size=size
        )

    consumers = [consumer(i) for i in range(3)]

    def producer(i: int) -> txn_core.Producer:
        p = log.producer(f"t{i}", transaction_timeout_ms=T)
        p.init_transactions()
        return p

    def end_txn(pi: int, commit: bool) -> None:
        offs = in_txn.pop(pi)
        try:
            (txns[pi].commit_transaction if commit else txns[pi].abort_transaction)()
            txns[pi].wait_for_completion()
        except txn_core.ProducerFencedError:  # it timed out meanwhile (clock jumps): aborted
            txns[pi] = producer(pi)
            return
        if commit:
            acked.update(offs)

    txns = [producer(i) for i in range(2)]
    in_txn: dict[int, list[int]] = {}  # producer index -> offsets it acknowledged in its open transaction
    acked: set[int] = set()
    held: dict[int, tuple[int, int]] = {}  # offset -> (consumer index, delivery time)

    for step in range(300):
        ci = rng.randrange(len(consumers))
        c = consumers[ci]
        op = rng.random()
        if op < 0.3:
            got = c.receive(rng.randint(1, 6)).column("_offset").to_pylist()
            st = c.state()
            for o in got:
                assert o not in acked and st.status(o) is AckStatus.UNACKED, (seed, step, o)
                other = held.get(o)
                if other is not None and other[0] != ci and o in consumers[other[0]].unacknowledged():
                    assert clock.now - other[1] >= T // 2, f"{o} delivered to c{other[0]} and c{ci} at once"
                held[o] = (ci, clock.now)
        elif op < 0.45 and c.unacknowledged():
            offs = rng.sample(c.unacknowledged(), rng.randint(1, len(c.unacknowledged())))
            try:
                c.acknowledge(offs)
                acked.update(offs)
            except TransactionConflictError:
                pass  # some were pending in a transaction
        elif op < 0.65 and c.unacknowledged():
            pi = rng.randrange(len(txns))
            p = txns[pi]
            if pi not in in_txn:
                p.begin_transaction()
                in_txn[pi] = []
            offs = rng.sample(c.unacknowledged(), rng.randint(1, len(c.unacknowledged())))
            try:
                c.acknowledge(offs, transaction=p)
                in_txn[pi] += offs
            except TransactionConflictError:  # lost to an earlier acknowledgement, or timed out meanwhile
                end_txn(pi, commit=False)
            except txn_core.ProducerFencedError:
                del in_txn[pi]
                txns[pi] = producer(pi)
        elif op < 0.75 and in_txn:
            end_txn(rng.choice(sorted(in_txn)), commit=rng.random() < 0.6)
        elif op < 0.8 and c.unacknowledged():
            c.negative_acknowledge(rng.sample(c.unacknowledged(), 1))
        elif op < 0.9:
            clock.now += rng.choice([1000, T // 2, T])
        elif op < 0.95:
            if rng.random() < 0.5:
                c.close()
            consumers[ci] = consumer(ci)  # a restart (closed, or crashed and left to its lease)
        else:
            c.redeliver_unacknowledged()
        st = consumers[0].state()
        st._check()
        assert all(st.status(o) is AckStatus.ACKED for o in acked), (seed, step)

    for pi in list(in_txn):
        end_txn(pi, commit=True)
    clock.now += 2 * T
    _drain_to_the_end(consumer(9), acked, end)


SESSION = 4_000


def _typed_run(
    seed: int, kind: str
) -> tuple[random.Random, FakeClock, txn_core.Log, int, Callable[[int], txn_core.SubscriptionConsumer]]:
    """The seeded input and a ``subscribe(i)`` opening consumer ``c<i>`` of a subscription of type ``kind``
    (created, with no consumer)."""
    rng = random.Random(seed)
    clock = FakeClock()
    log, end = _log_with_input(seed, rng, clock)
    size = rng.choice([4, 16])

    def subscribe(i: int) -> txn_core.SubscriptionConsumer:
        return log.subscribe(
            "in", 0, kind, consumer_name=f"c{i}", ack_timeout_ms=T, range_size=size,
            subscription_type=kind, session_timeout_ms=SESSION,
        )  # fmt: skip

    subscribe(9).close()
    return rng, clock, log, end, subscribe


class _Acks:
    """Plain and transactional acknowledgements of one transactional producer, with the model of what is
    acknowledged (``acked``: plain ones that succeeded, transactional ones whose transaction committed)."""

    def __init__(self, log: txn_core.Log, rng: random.Random) -> None:
        self.log, self.rng = log, rng
        self.acked: set[int] = set()
        self.open: list[int] | None = None  # offsets acknowledged in the open transaction
        self.txn = self._producer()

    def _producer(self) -> txn_core.Producer:
        p = self.log.producer("t", transaction_timeout_ms=T)
        p.init_transactions()
        return p

    def act(self, c: txn_core.SubscriptionConsumer) -> None:
        """One random step: acknowledge plainly, or in the transaction, or end the transaction."""
        r = self.rng.random()
        if r < 0.4 and c.unacknowledged():
            self.plain(c)
        elif r < 0.8 and c.unacknowledged():
            self.in_transaction(c)
        elif self.open is not None:
            self.end(commit=self.rng.random() < 0.6)

    def plain(self, c: txn_core.SubscriptionConsumer) -> None:
        offs = self.rng.sample(c.unacknowledged(), self.rng.randint(1, len(c.unacknowledged())))
        try:
            c.acknowledge(offs)
            self.acked.update(offs)
        except TransactionConflictError:
            pass  # held by the transaction (after a takeover, a record can reach two consumers)

    def in_transaction(self, c: txn_core.SubscriptionConsumer) -> None:
        if self.open is None:
            self.txn.begin_transaction()
            self.open = []
        offs = self.rng.sample(c.unacknowledged(), 1)
        try:
            c.acknowledge(offs, transaction=self.txn)
            self.open += offs
        except TransactionConflictError:
            self.end(commit=False)
        except txn_core.ProducerFencedError:  # timed out meanwhile
            self.open, self.txn = None, self._producer()

    def finish(self, consumers: Sequence[txn_core.SubscriptionConsumer | None], clock: FakeClock) -> None:
        """Commit the open transaction, close the consumers, let every lease lapse."""
        if self.open is not None:
            self.end(commit=True)
        for c in consumers:
            if c is not None:
                c.close()
        clock.now += 2 * T

    def end(self, commit: bool) -> None:
        offs, self.open = self.open or [], None
        try:
            (self.txn.commit_transaction if commit else self.txn.abort_transaction)()
            self.txn.wait_for_completion()
        except txn_core.ProducerFencedError:  # timed out meanwhile: aborted
            self.txn = self._producer()
            return
        if commit:
            self.acked.update(offs)


@pytest.mark.matrix(keep=3)
@pytest.mark.parametrize("seed", range(10))
def test_random_exclusive_consumers_joining_leaving_and_killed_keep_one_holder(seed: int) -> None:
    """Three consumer processes of an Exclusive subscription start, close, are killed (left to their hold)
    and pause past their session; they acknowledge plainly and in transactions. A model of the hold says who
    may subscribe and receive: a subscribe or receive succeeds exactly when the model says so, a refusal
    names the model's holder, and no record comes while acknowledged or pending."""
    rng, clock, log, end, subscribe = _typed_run(seed, "exclusive")
    session = SESSION
    procs: list[txn_core.SubscriptionConsumer | None] = [None, None, None]
    holder: tuple[str, int, int] | None = None  # model: (consumer id, acquired, expires)
    acks = _Acks(log, rng)
    acked = acks.acked

    def valid_holder() -> str | None:
        return holder[0] if holder is not None and clock.now < holder[2] else None

    def take(cid: str) -> None:
        nonlocal holder
        if holder is None or holder[0] != cid or clock.now >= holder[2] or clock.now >= holder[1] + session // 2:
            holder = (cid, clock.now, clock.now + session)

    for step in range(250):
        i = rng.randrange(3)
        c = procs[i]
        op = rng.random()
        if c is None:
            if op < 0.5:
                expected = valid_holder()
                try:
                    procs[i] = c = subscribe(i)
                except txn_core.ConsumerBusyError as exc:
                    assert expected is not None and exc.holder == expected, (seed, step)
                    continue
                assert expected is None, (seed, step, expected)
                take(c.consumer_id)
        elif op < 0.35:
            expected = valid_holder()
            try:
                got = c.receive(rng.randint(1, 6)).column("_offset").to_pylist()
            except txn_core.ConsumerBusyError as exc:
                assert expected not in (None, c.consumer_id) and exc.holder == expected, (seed, step)
                continue
            assert expected in (None, c.consumer_id), (seed, step, expected)
            take(c.consumer_id)
            st = c.state()
            assert all(o not in acked and st.status(o) is AckStatus.UNACKED for o in got), (seed, step)
        elif op < 0.7:
            acks.act(c)
        elif op < 0.8:
            clock.now += rng.choice([1000, session // 2, session, T])
        elif op < 0.9:
            c.close()  # leaves
            if valid_holder() == c.consumer_id:
                holder = None
            procs[i] = None
        else:
            procs[i] = None  # killed: its hold and leases lapse by themselves
        st = log.subscription("in", 0, "exclusive").state()
        st._check()
        assert all(st.status(o) is AckStatus.ACKED for o in acked), (seed, step)

    acks.finish(procs, clock)
    _drain_to_the_end(subscribe(9), acked, end)


@pytest.mark.matrix(keep=3)
@pytest.mark.parametrize("seed", range(10))
def test_random_failover_members_joining_leaving_and_killed_keep_one_active(seed: int) -> None:
    """Three consumer processes of a Failover subscription start, close, are killed (left to their session)
    and pause; they acknowledge plainly and in transactions. Records reach only the consumer holding the
    hold, never two at once, never while acknowledged or pending; once everything settles (sessions and
    leases of the dead lapsed) only the first live member by name receives; at the end everything is
    acknowledged exactly once."""
    rng, clock, log, end, subscribe = _typed_run(seed, "failover")
    session = SESSION
    sub = log.subscription("in", 0, "failover")
    procs: list[txn_core.SubscriptionConsumer | None] = [None, None, None]
    acks = _Acks(log, rng)
    acked = acks.acked
    held: dict[int, tuple[str, int]] = {}  # offset -> (consumer id, delivery time)
    settled = 0

    def receive(c: txn_core.SubscriptionConsumer) -> list[int]:
        got: list[int] = c.receive(rng.randint(1, 6)).column("_offset").to_pylist()
        if got:
            assert sub.describe().active_consumer == c.consumer_id, (seed, step)
        st = c.state()
        live = {p.consumer_id: p for p in procs if p is not None}
        for o in got:
            assert o not in acked and st.status(o) is AckStatus.UNACKED, (seed, step, o)
            other = held.get(o)
            first_holder = live.get(other[0]) if other is not None and other[0] != c.consumer_id else None
            if other is not None and first_holder is not None and o in first_holder.unacknowledged():
                assert clock.now - other[1] >= T // 2, f"{o} delivered to {other[0]} and {c.consumer_id}"
            held[o] = (c.consumer_id, clock.now)
        return got

    for step in range(250):
        i = rng.randrange(3)
        c = procs[i]
        op = rng.random()
        if c is None:
            if op < 0.5:
                procs[i] = subscribe(i)
        elif op < 0.3:
            receive(c)
        elif op < 0.62:
            acks.act(c)
        elif op < 0.72:
            clock.now += rng.choice([200, 1000, session // 2, session])
        elif op < 0.8:
            # Settle: the dead's sessions and everyone's leases lapse; every live member receives (and so
            # counts again: a member that paused past its session did not meanwhile); once each has listed the
            # members again, only the first live one by name may receive.
            clock.now += T + session
            live = [p for p in procs if p is not None]
            for p in rng.sample(live, len(live)):
                receive(p)
            clock.now += session // 4
            first = min(p.consumer_id for p in live)
            for p in rng.sample(live, len(live)) * 2:
                if receive(p):
                    assert p.consumer_id == first, (seed, step, p.consumer_id, first)
            settled += 1
        elif op < 0.9:
            c.close()  # leaves
            procs[i] = None
        else:
            procs[i] = None  # killed: its membership, hold and leases lapse by themselves
        st = sub.state()
        st._check()
        assert all(st.status(o) is AckStatus.ACKED for o in acked), (seed, step)

    assert settled
    acks.finish(procs, clock)
    _drain_to_the_end(subscribe(9), acked, end)


@pytest.mark.matrix(keep=3)
@pytest.mark.parametrize("seed", range(10))
def test_random_redeliveries_end_in_the_application_or_the_dead_letter_topic_never_both(seed: int) -> None:
    """Consumers with a dead-letter policy and a negative-ack back-off negatively acknowledge, let ack
    timeouts pass, acknowledge plainly and in transactions, and are killed and restarted. No consumer hands
    a record to the application more than ``1 + max_redeliveries`` times; no record is both acknowledged by
    the application and dead-lettered; at the end every record is in exactly one of the two."""
    rng = random.Random(seed)
    clock = FakeClock()
    log, end = _log_with_input(seed, rng, clock)
    reader = log.consumer()
    reader.assign([("in", 0)])
    ids: dict[int, int] = {}  # offset -> id of the committed input
    while (t := reader.poll()).num_rows:
        ids.update(zip(t.column("_offset").to_pylist(), t.column("id").to_pylist(), strict=True))
    max_redeliveries = rng.choice([0, 1, 3])
    backoff = RedeliveryBackoff(rng.choice([0, 500]), 4_000)

    def consumer(i: int) -> txn_core.SubscriptionConsumer:
        return log.subscribe(
            "in", 0, "d", consumer_name=f"c{i}", ack_timeout_ms=T, range_size=8, nack_backoff=backoff,
            dead_letter_policy=DeadLetterPolicy(max_redeliveries, transaction_timeout_ms=T),
        )  # fmt: skip

    consumers = [consumer(i) for i in range(2)]
    handed: list[dict[int, int]] = [{}, {}]  # per consumer instance: offset -> times handed to the application
    acks = _Acks(log, rng)

    for step in range(250):
        i = rng.randrange(2)
        c = consumers[i]
        op = rng.random()
        if op < 0.35:
            for o in c.receive(rng.randint(1, 6)).column("_offset").to_pylist():
                handed[i][o] = handed[i].get(o, 0) + 1
                assert handed[i][o] <= 1 + max_redeliveries, (seed, step, o)
        elif op < 0.5 and c.unacknowledged():
            c.negative_acknowledge(rng.sample(c.unacknowledged(), rng.randint(1, len(c.unacknowledged()))))
        elif op < 0.75:
            acks.act(c)
        elif op < 0.9:
            clock.now += rng.choice([500, 2_000, T])
        else:
            consumers[i], handed[i] = consumer(i), {}  # killed and restarted: counts start again
        st = consumers[0].state()
        st._check()
        assert all(st.status(o) is AckStatus.ACKED for o in acks.acked), (seed, step)

    acks.finish(consumers, clock)
    last = log.subscribe("in", 0, "d", consumer_name="last", ack_timeout_ms=T)
    _drain_to_the_end(last, acks.acked, end)
    dead_ids: list[int] = []
    if "in-d-DLQ" in log.list_topics():
        dead = log.consumer()
        dead.assign([("in-d-DLQ", 0)])
        while (t := dead.poll()).num_rows:
            dead_ids += t.column("id").to_pylist()
    app_ids = [ids[o] for o in acks.acked if o in ids]
    assert len(set(dead_ids)) == len(dead_ids), f"dead-lettered twice: {dead_ids}"
    assert not set(dead_ids) & set(app_ids), f"both acknowledged and dead-lettered: {set(dead_ids) & set(app_ids)}"
    assert sorted(dead_ids + app_ids) == sorted(ids.values())
