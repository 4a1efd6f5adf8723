"""Seeded randomized runs of consumers, plain and transactional acknowledgements, aborts, negative
acknowledgements, crashes and clock jumps on one subscription, against a simple model.

After every step: the replayed state satisfies ``_check()``; every record the model knows acknowledged
is acknowledged; no record is delivered while it is acknowledged or pending, nor to a second consumer
while the first still holds it with time left; at the end everything is acknowledged exactly once.
"""

from __future__ import annotations

import random
import uuid

import pyarrow as pa
import pytest
from fakeclock import FakeClock

import txn_core
from txn_core import AckStatus, TransactionConflictError
from txn_core.storage import MemoryStorage

SCHEMA = pa.schema([("id", pa.int64())])
T = 10_000


@pytest.mark.matrix(keep=3)
@pytest.mark.parametrize("seed", range(10))
def test_random_consumers_and_transactions_keep_every_invariant(seed: int) -> None:
    rng = random.Random(seed)
    clock = FakeClock()
    name = f"rand-{seed}-{uuid.uuid4().hex}"
    log = txn_core.Log(MemoryStorage(name), clock=clock)
    log.create_topic("in", 1, SCHEMA)
    plain, inp = log.producer(), log.producer("input", transaction_timeout_ms=T)
    inp.init_transactions()
    for i in range(0, 120, 6):
        ids = list(range(i, i + rng.randint(1, 6)))
        if rng.random() < 0.25:  # transactional input, some aborted: markers and aborted data to skip
            inp.begin_transaction()
            inp.send("in", pa.table({"id": ids}), partition=0)
            (inp.abort_transaction if rng.random() < 0.4 else inp.commit_transaction)()
        else:
            plain.send("in", pa.table({"id": ids}), partition=0)
            plain.flush()
    inp.wait_for_completion()
    end = log.partition_log("topics/in/00000").end_offset()

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
    last = consumer(9)
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
