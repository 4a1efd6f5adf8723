"""Randomised, seeded stress against a simple model.

Several transactional producers (commit, abort, crash, re-init, time out), a plain idempotent producer
and a long-lived read_committed consumer act in a random order on one log. The model knows which ids
are committed, aborted or still open. After every step:

* the long-lived read_committed consumer has returned only committed ids, each once, in offset order;
* every partition's transaction buffer satisfies its invariants (``_check``);
and at the end:
* a fresh read_committed reader returns exactly the committed ids; read_uncommitted returns every id;
* rebuilding each buffer from its latest snapshot plus the log tail equals replaying the whole log.

Another process rolls partitions into segments at random points (random policies, rolled loose entries
deleted at once): every fresh reader -- both isolation levels, with offsets and timestamps, and every
entry header -- reads the same right before and right after each roll, and the long-lived consumer and
the producers carry on across them.
"""

from __future__ import annotations

import contextlib
import os
import random
import uuid
from dataclasses import dataclass, field

import pyarrow as pa
import pytest
from fakeclock import FakeClock
from tiers import SEED_ENV

import txn_core
from txn_core.clock import system_clock
from txn_core.format import paths
from txn_core.ops.rolling import Roller, RollPolicy
from txn_core.partition import partition, snapshots
from txn_core.partition.buffer import TxnBuffer
from txn_core.partition.partition import PartitionLog
from txn_core.partition.state import PartitionState
from txn_core.storage import MemoryStorage

SCHEMA = pa.schema([("id", pa.int64())])
PARTITIONS = 3


@dataclass
class Model:
    committed: set[int] = field(default_factory=set)
    aborted: set[int] = field(default_factory=set)
    open: dict[str, list[int]] = field(default_factory=dict)  # tid -> ids of its open transaction
    dead: list[int] = field(default_factory=list)  # ids of crashed producers' open transactions
    maybe: set[int] = field(default_factory=set)  # written or not, never committed


def _fresh_reads(storage: MemoryStorage, clock: FakeClock) -> tuple[object, ...]:
    """What fresh processes read: every record under both isolation levels, and every entry header."""
    log = txn_core.Log(storage, clock=clock)
    out: list[object] = []
    for isolation in ("read_committed", "read_uncommitted"):
        c = log.consumer(isolation_level=isolation)
        c.assign([("t", p) for p in range(PARTITIONS)])
        rows: list[tuple[int, int, int, int]] = []
        while (got := c.poll()).num_rows:
            rows += zip(
                got.column("_partition").to_pylist(),
                got.column("_offset").to_pylist(),
                got.column("id").to_pylist(),
                got.column("_timestamp").cast(pa.int64()).to_pylist(),
                strict=True,
            )
        out.append(sorted(rows))
    for part in range(PARTITIONS):
        plog = PartitionLog(storage, paths.partition_log_path("t", part), clock=system_clock)
        tail, _end = plog.tail(refresh=True)
        out.append([plog.read_header(slot) for slot in range(plog.log_start(refresh=True).slot, tail)])
    return tuple(out)


def _roll(storage: MemoryStorage, clock: FakeClock, rng: random.Random, part: int) -> None:
    policy = RollPolicy(entries=rng.randint(1, 6), max_entries=rng.randint(1, 9))
    log = txn_core.Log(storage, clock=clock)  # another process
    Roller(log, paths.partition_log_path("t", part), policy).roll(min_age_ms=0)


def _buffer_summary(b: TxnBuffer) -> tuple[object, ...]:
    return (
        b.position,
        b.slot,
        b.max_read_position,
        sorted((str(o.txn), o.first_offset, o.last_offset) for o in b.ongoing.values()),
        b.aborted.to_table().sort_by("txn").to_pylist(),
        b.skips.to_list(),
        b.producers.to_list(),
        sorted(b.gaps.items()),
        b.committed_count,
        b.aborted_count,
    )


@pytest.mark.matrix(keep=1)
@pytest.mark.parametrize("seed", range(6))
def test_random_operations_match_the_model(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Six model runs in CI, one in the default tier, each a new sequence of operations every test run: the
    operations are drawn from the run's seed (the header's ``TXNLOG_TEST_SEED``, which draws them again)
    and the case's."""
    monkeypatch.setattr(snapshots, "SNAPSHOT_EVERY_TXNS", 7)  # many snapshots, several parts
    monkeypatch.setattr(snapshots, "PART_ROWS", 3)
    # Rolls delete loose entries at once (minimum age 0), so appenders re-check their cached tail before
    # every append, and readers re-list segments at every miss: the protocol's guards are a tail re-check
    # interval and a listing age far below the minimum age. (With the listing kept 5 s of this fake clock, a
    # reader missed a marker rolled and deleted a moment after it landed, took the slot for the log end, and
    # dropped the committed transaction's rows as writes after its marker.)
    monkeypatch.setattr(partition, "TAIL_RECHECK_S", 0.0)
    monkeypatch.setattr(partition, "LOG_START_RECHECK_S", 0.0)
    rng = random.Random(f"{os.environ.get(SEED_ENV, '0')}-{seed}")
    clock = FakeClock(1_900_000_000_000)
    storage = MemoryStorage(f"stress-{seed}-{uuid.uuid4().hex}")
    log = txn_core.Log(storage, clock=clock)
    log.create_topic("t", PARTITIONS, SCHEMA)
    model = Model()
    producers: dict[str, txn_core.Producer] = {}
    plain = log.producer()
    reader = log.consumer()
    reader.assign([("t", p) for p in range(PARTITIONS)])
    seen: list[int] = []
    last_offset = {p: -1 for p in range(PARTITIONS)}
    next_id = iter(range(1, 10**9))
    #: every producer made, abandoned ones included: their markers not carried yet are written after a linger
    every: list[txn_core.Producer] = []

    def settle() -> None:
        """Write now the markers still waiting for a carrier, so no background write lands between two reads."""
        for p in every:
            with contextlib.suppress(txn_core.TxnLogError):
                p.wait_for_markers()

    def producer(tid: str) -> txn_core.Producer:
        p = producers.get(tid)
        if p is None or p.state in (txn_core.ClientState.FATAL_ERROR, txn_core.ClientState.CLOSED):
            for i in model.open.pop(tid, []):  # init fences the old instance: its open txn aborts
                model.aborted.add(i)
            # the longest linger: a marker waits a whole second of real time for its producer's next entry
            p = txn_core.Log(storage, clock=clock).producer(tid, transaction_timeout_ms=5_000, marker_linger_ms=1000)
            p.init_transactions()
            producers[tid] = p
            every.append(p)
        return p

    # Markers carried and alone whatever the draw (on a loaded machine random steps can outlast any linger, and
    # a run once carried none): p0's first transaction's marker travels in its second's entry, and the second's
    # is written alone.
    first = producer("p0")
    for _ in range(2):
        first.begin_transaction()
        vals = [next(next_id)]
        first.send("t", pa.table({"id": vals}), partition=0)
        first.commit_transaction()
        model.committed.update(vals)
    settle()

    for _step in range(300):
        op = rng.choice(
            [
                *("send", "send", "send", "commit", "commit", "abort", "plain"),
                *("crash", "reinit", "tick", "read", "read", "roll"),
            ]
        )
        tid = f"p{rng.randrange(3)}"
        if op == "send":
            p = producer(tid)
            if p.state == txn_core.ClientState.READY:
                p.begin_transaction()
                model.open[tid] = []
            vals = [next(next_id) for _ in range(rng.randint(1, 4))]
            try:
                p.send("t", pa.table({"id": vals}), partition=rng.randrange(PARTITIONS))
                p.flush()
                model.open[tid].extend(vals)
            except txn_core.ProducerFencedError:  # its transaction timed out: aborted, producer fenced
                model.aborted.update(model.open.pop(tid, []))
                model.maybe.update(vals)  # a write to an already registered partition lands anyway
        elif (
            op in ("commit", "abort")
            and tid in producers
            and producers[tid].state == txn_core.ClientState.IN_TRANSACTION
        ):
            p = producers[tid]
            vals = model.open.pop(tid, [])
            try:
                if op == "commit":
                    p.commit_transaction()
                    model.committed.update(vals)
                else:
                    p.abort_transaction()
                    model.aborted.update(vals)
            except txn_core.ProducerFencedError:  # timed out meanwhile
                model.aborted.update(vals)
        elif op == "plain":
            vals = [next(next_id) for _ in range(rng.randint(1, 3))]
            plain.send("t", pa.table({"id": vals}), partition=rng.randrange(PARTITIONS))
            plain.flush()
            model.committed.update(vals)
        elif op == "crash" and tid in producers:
            producers.pop(tid)  # abandoned mid-transaction: only its timeout or a re-init can end it
            model.dead.extend(model.open.pop(tid, []))
        elif op == "reinit":
            if tid in producers and producers[tid].state == txn_core.ClientState.IN_TRANSACTION:
                producers.pop(tid)
                model.aborted.update(model.open.pop(tid, []))
            producer(tid)
        elif op == "tick":
            clock.now += rng.choice([100, 1_000, 6_000])
            if clock.now:  # timeouts fire when someone meets the transaction; reads below do
                pass
        elif op == "roll":
            settle()
            before = _fresh_reads(storage, clock)
            _roll(storage, clock, rng, rng.randrange(PARTITIONS))
            assert _fresh_reads(storage, clock) == before, f"step {_step}: a roll changed what readers read"
        elif op == "read":
            got = reader.poll()
            for part, off, i in zip(
                got.column("_partition").to_pylist(),
                got.column("_offset").to_pylist(),
                got.column("id").to_pylist(),
                strict=True,
            ):
                assert i in model.committed, f"step {_step}: read id {i} which is not committed"
                assert off > last_offset[part], "offsets went backwards"
                last_offset[part] = off
                seen.append(i)
            assert len(seen) == len(set(seen)), "duplicate delivered"
        for part in range(PARTITIONS):
            state = log.partition_state(paths.partition_log_path("t", part))
            state.scan_to_end()
            state.buffer._check()
            state.buffer.producers._check()
        log.views.check()  # every coordinator partition this process has loaded

    # Finish: commit or abort what is open, let dead transactions time out.
    for tid, p in list(producers.items()):
        if p.state == txn_core.ClientState.IN_TRANSACTION:
            vals = model.open.pop(tid, [])
            try:
                p.commit_transaction()
                model.committed.update(vals)
            except txn_core.ProducerFencedError:
                model.aborted.update(vals)
    clock.now += 10_000
    model.aborted.update(model.dead)
    while (got := reader.poll()).num_rows:
        seen.extend(got.column("id").to_pylist())
    assert sorted(seen) == sorted(model.committed)

    settle()
    before = _fresh_reads(storage, clock)
    headers = [h for part in before[2:] for h in part]  # type: ignore[attr-defined]
    kinds = {"carried" if h.carried is not None else "lone" for h in headers if h.carried or h.is_control}
    assert kinds == {"carried", "lone"}, f"the run mixes markers carried by entries and markers alone: {kinds}"
    for part in range(PARTITIONS):
        _roll(storage, clock, rng, part)
    assert _fresh_reads(storage, clock) == before
    assert all(storage.list(paths.segments(paths.partition_log_path("t", p))) for p in range(PARTITIONS))

    fresh = txn_core.Log(storage, clock=clock)
    rc = fresh.consumer()
    rc.assign([("t", p) for p in range(PARTITIONS)])
    ru = fresh.consumer(isolation_level="read_uncommitted")
    ru.assign([("t", p) for p in range(PARTITIONS)])
    all_rc, all_ru = [], []
    while (got := rc.poll()).num_rows:
        all_rc.extend(got.column("id").to_pylist())
    while (got := ru.poll()).num_rows:
        all_ru.extend(got.column("id").to_pylist())
    assert sorted(all_rc) == sorted(model.committed)
    assert model.committed | model.aborted <= set(all_ru) <= model.committed | model.aborted | model.maybe
    assert len(all_ru) == len(set(all_ru))

    for part in range(PARTITIONS):
        path = paths.partition_log_path("t", part)
        from_snapshot = PartitionState(fresh.partition_log(path), fresh.coordinator.resolve, write_snapshots=False)
        assert from_snapshot.snapshot_position >= 0
        from_snapshot.scan_to_end()
        full = PartitionState(fresh.partition_log(path), fresh.coordinator.resolve, write_snapshots=False)
        full._buffer = TxnBuffer(0, 0)
        full._buffer.where = path
        full.scan_to_end()
        assert _buffer_summary(from_snapshot.buffer) == _buffer_summary(full.buffer)
        assert from_snapshot.read_bound() == full.read_bound()
