"""Reading planned offset ranges without the coordinator (txn_core.partition.ranges) and finding offsets by time
(txn_core.partition.timeindex).

The oracle is the core consumer: for every range below the last stable offset, ``read_range`` of the planned
range must deliver exactly the records a read_committed ``PartitionReader`` delivers for those offsets.
"""

from __future__ import annotations

import itertools
import random
import uuid

import pyarrow as pa
import pytest

import txn_core
from txn_core.errors import DataLossError, TxnLogError
from txn_core.format import paths
from txn_core.format.entry import EntryKind, crc32, encode_arrow
from txn_core.partition.ranges import available_end, plan_range, read_range, split_range
from txn_core.partition.reader import READ_COMMITTED, READ_UNCOMMITTED, PartitionReader
from txn_core.partition.timeindex import offset_for_timestamp
from txn_core.storage import MemoryStorage

SCHEMA = pa.schema([("id", pa.int64())])
PATH = paths.partition_log_path("t", 0)


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000_000

    def __call__(self) -> int:
        return self.now


def new_log(clock: Clock | None = None) -> txn_core.Log:
    log = txn_core.Log(MemoryStorage(uuid.uuid4().hex), clock=clock)
    log.create_topic("t", 1, SCHEMA)
    return log


def send(p: txn_core.Producer, values: list[int]) -> None:
    p.send("t", pa.table({"id": values}), partition=0)
    p.flush()


def raw_append(log: txn_core.Log, values: list[int], **kw: object) -> None:
    raw = encode_arrow([pa.record_batch({"id": values})], SCHEMA)
    log.partition_log(PATH).append(EntryKind.DATA, [memoryview(raw)], len(raw), crc32(raw), len(values), **kw)  # type: ignore[arg-type]


def oracle(log: txn_core.Log, start: int, end: int, isolation: str = READ_COMMITTED) -> list[int]:
    """Ids the core consumer delivers for offsets [start, end)."""
    state = txn_core.Log(log.storage, clock=log.clock).partition_state(PATH, shared=False)
    reader = PartitionReader(state, "t", 0, isolation)
    reader.seek(start)
    out: list[int] = []
    while reader.position < end:
        batches = reader.poll()
        if not batches:
            break
        for b in batches:
            for i, o in zip(b.column("id").to_pylist(), b.column("_offset").to_pylist(), strict=True):
                if o < end:
                    out.append(i)
    return out


def planned(log: txn_core.Log, start: int, end: int, isolation: str = READ_COMMITTED, pieces: int = 1) -> list[int]:
    """Ids read_range delivers: planned on one Log (driver), read on a fresh one (worker)."""
    state = log.partition_state(PATH, shared=False)
    rng = plan_range(state, "t", 0, start, end, isolation)
    worker = txn_core.Log(log.storage).partition_log(PATH)
    out: list[int] = []
    for piece in split_range(state.log, rng, pieces):
        for b in read_range(worker, piece):
            offsets = b.column("_offset").to_pylist()
            assert offsets == list(range(offsets[0], offsets[0] + len(offsets)))
            assert piece.start <= offsets[0] and offsets[-1] < piece.end
            out.extend(b.column("id").to_pylist())
    return out


class Scenario:
    """Random interleaving of committed, aborted, timed-out and zombie transactions plus plain writes.

    Transactional ids are negative; ``committed`` and ``aborted`` hold the ids whose outcome is certain.
    """

    def __init__(self, seed: int, clock: Clock) -> None:
        rng = random.Random(seed)
        self.log = log = new_log(clock)
        self.committed: set[int] = set()
        self.aborted: set[int] = set()
        plain = log.producer()
        next_id = iter(range(1, 1_000_000))
        open_txns: dict[str, tuple[txn_core.Producer, list[int]]] = {}
        for step in range(40):
            action = rng.choice(["plain", "begin", "send", "commit", "abort", "zombie", "tick"])
            if action == "plain":
                values = [next(next_id) for _ in range(rng.randint(1, 4))]
                send(plain, values)
                self.committed.update(values)
            elif action == "begin" and len(open_txns) < 3:
                tid = f"p{seed}-{step}"
                p = log.producer(tid, transaction_timeout_ms=rng.choice([2_000, 60_000]))
                p.init_transactions()
                p.begin_transaction()
                values = [-next(next_id)]
                send(p, values)
                open_txns[tid] = (p, values)
            elif action == "send" and open_txns:
                p, sent = open_txns[rng.choice(sorted(open_txns))]
                values = [-next(next_id) for _ in range(rng.randint(1, 3))]
                try:
                    send(p, values)
                    sent.extend(values)
                except txn_core.TxnLogError:
                    pass
            elif action in ("commit", "abort") and open_txns:
                p, sent = open_txns.pop(rng.choice(sorted(open_txns)))
                try:
                    if action == "commit":
                        p.commit_transaction()
                        self.committed.update(sent)
                    else:
                        p.abort_transaction()
                        self.aborted.update(sent)
                except txn_core.TxnLogError:
                    pass  # timed out meanwhile: outcome left uncertain for the test
            elif action == "zombie" and open_txns:
                # Another instance fences the producer and aborts its transaction; the zombie then writes.
                p, sent = open_txns.pop(rng.choice(sorted(open_txns)))
                successor = txn_core.Log(log.storage, clock=clock).producer(p.transactional_id)
                successor.init_transactions()
                late = -next(next_id)
                raw_append(
                    log,
                    [late],
                    producer_id=p.producer_id,
                    producer_epoch=p.epoch,
                    base_sequence=1000 + step,
                    txn=p.transaction_id,
                )
                self.aborted.update([*sent, late])
            elif action == "tick":
                clock.now += 1_500


@pytest.mark.parametrize("seed", range(12))
def test_planned_ranges_deliver_exactly_what_the_consumer_delivers(seed: int) -> None:
    clock = Clock()
    sc = Scenario(seed, clock)
    log = sc.log
    bound = available_end(log.partition_state(PATH, shared=False), READ_COMMITTED)
    rnd = random.Random(seed)
    cuts = sorted({0, bound, *(rnd.randint(0, bound) for _ in range(4))})
    for lo, hi in itertools.pairwise(cuts):
        expected = oracle(log, lo, hi)
        assert planned(log, lo, hi) == expected, (lo, hi)
        assert planned(log, lo, hi, pieces=3) == expected, (lo, hi)
    delivered = oracle(log, 0, bound)
    assert not sc.aborted & set(delivered)
    assert len(delivered) == len(set(delivered))


def test_a_zombie_write_after_an_abort_marker_is_never_delivered() -> None:
    log = new_log()
    zombie = log.producer("z")
    zombie.init_transactions()
    zombie.begin_transaction()
    send(zombie, [-1])
    successor = txn_core.Log(log.storage).producer("z")
    successor.init_transactions()  # aborts the zombie's transaction: its marker lands in the partition
    marker_end = log.partition_log(PATH).end_offset()
    raw_append(
        log,
        [-2],
        producer_id=zombie.producer_id,
        producer_epoch=zombie.epoch,
        base_sequence=7,
        txn=zombie.transaction_id,
    )
    send(log.producer(), [3])
    bound = available_end(log.partition_state(PATH, shared=False), READ_COMMITTED)
    # A range that starts after the abort marker still must not deliver the zombie's write.
    assert planned(log, marker_end, bound) == [3] == oracle(log, marker_end, bound)


def test_a_range_past_the_last_stable_offset_is_refused() -> None:
    log = new_log()
    p = log.producer("open")
    p.init_transactions()
    p.begin_transaction()
    send(p, [-1])
    send(log.producer(), [2])
    state = log.partition_state(PATH, shared=False)
    assert available_end(state, READ_COMMITTED) == 0
    with pytest.raises(TxnLogError, match="last stable offset 0"):
        plan_range(state, "t", 0, 0, 2, READ_COMMITTED)
    assert available_end(state, READ_UNCOMMITTED) == 2
    assert planned(log, 0, 2, READ_UNCOMMITTED) == [-1, 2]


def test_a_dead_producers_transaction_stops_holding_the_bound_after_its_timeout() -> None:
    clock = Clock()
    log = new_log(clock)
    dead = log.producer("dead", transaction_timeout_ms=5_000)
    dead.init_transactions()
    dead.begin_transaction()
    send(dead, [-1])
    send(log.producer(), [2])
    state = log.partition_state(PATH, shared=False)
    assert available_end(state, READ_COMMITTED) == 0
    clock.now += 6_000
    bound = available_end(state, READ_COMMITTED)
    assert bound >= 2
    assert planned(log, 0, bound) == [2]


def test_entries_removed_by_retention_are_data_loss_unless_accepted() -> None:
    log = new_log()
    p = log.producer()
    for i in range(4):
        send(p, [i * 10, i * 10 + 1])
    state = log.partition_state(PATH, shared=False)
    rng = plan_range(state, "t", 0, 0, 8, READ_COMMITTED)
    # Retention: a new log start at slot 2 / offset 4, and the first two entries deleted.
    from txn_core.format import envelope

    envelope.create_json(
        log.storage, paths.log_start(PATH) + paths.slot_name(2), envelope.ObjectKind.LOG_START, {"slot": 2, "offset": 4}
    )
    for slot in (0, 1):
        log.storage.delete(log.partition_log(PATH).entries.key(slot))
    worker = txn_core.Log(log.storage).partition_log(PATH)
    with pytest.raises(DataLossError, match=r"offsets \[0, 4\) were removed by retention"):
        list(read_range(worker, rng))
    got = [i for b in read_range(worker, rng, fail_on_data_loss=False) for i in b.column("id").to_pylist()]
    assert got == [20, 21, 30, 31]
    with pytest.raises(DataLossError, match="log now starts at offset 4"):
        plan_range(log.partition_state(PATH, shared=False), "t", 0, 2, 8, READ_COMMITTED)


def test_timestamp_pruning_drops_whole_entries() -> None:
    log = new_log()
    for i, ts in enumerate([100, 200, 300]):
        raw_append(log, [i], timestamp_ms=ts)
    state = log.partition_state(PATH, shared=False)
    rng = plan_range(state, "t", 0, 0, 3, READ_COMMITTED, min_timestamp_ms=150, max_timestamp_ms=300)
    worker = txn_core.Log(log.storage).partition_log(PATH)
    assert [i for b in read_range(worker, rng) for i in b.column("id").to_pylist()] == [1, 2]


# --- timeindex -----------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(6))
def test_offset_for_timestamp_is_the_first_entry_at_or_after_it(seed: int) -> None:
    rnd = random.Random(seed)
    log = new_log()
    stamps: list[int] = []
    t = 1_000_000
    for i in range(rnd.randint(1, 300)):  # several rounds of the search's probes
        t += rnd.randint(0, 50)
        ts = t - rnd.randint(0, 40)  # writers' clocks disagree by up to 40 ms
        stamps.append(ts)
        raw_append(log, [i], timestamp_ms=ts)
    plog = log.partition_log(PATH)
    for target in [0, stamps[0], *rnd.sample(range(min(stamps) - 10, max(stamps) + 10), 15), 10**13]:
        expected = next((i for i, s in enumerate(stamps) if s >= target), len(stamps))
        assert offset_for_timestamp(plog, target, max_skew_ms=40) == expected, target


class CountingStorage(MemoryStorage):
    """Counts whole-object reads (the reads that fetch an entry's payload), per key."""

    def __init__(self) -> None:
        super().__init__(uuid.uuid4().hex)
        self.whole_reads: dict[str, int] = {}

    def read_buffer(self, key: str) -> object:
        self.whole_reads[key] = self.whole_reads.get(key, 0) + 1
        return super().read_buffer(key)


def _twenty_transactions(monkeypatch: pytest.MonkeyPatch) -> CountingStorage:
    """A partition of 20 entries of 50 records (ids 0-999), each followed by its commit marker: the markers
    are written by the committing thread (a loaded machine could otherwise measure the memory store's records
    as slow, leave them to the background thread, and a marker could follow the next transaction's entry)."""
    from txn_core.clients.producer import completion

    monkeypatch.setattr(completion, "FAST_RECORD_S", 1.0)
    storage = CountingStorage()
    log = txn_core.Log(storage)
    log.create_topic("t", 1, SCHEMA)
    p = log.producer(transactional_id="t1", marker_linger_ms=0)  # markers alone: 51 offsets per transaction
    p.init_transactions()
    next_id = itertools.count()
    for _ in range(20):
        p.begin_transaction()
        send(p, [next(next_id) for _ in range(50)])
        p.commit_transaction()
    p.close()
    return storage


@pytest.mark.parametrize("end", [255, 260, 1020])  # an entry's first offset, inside one, the partition's end
def test_a_range_reads_no_entry_past_its_end(end: int, monkeypatch: pytest.MonkeyPatch) -> None:
    storage = _twenty_transactions(monkeypatch)
    state = txn_core.Log(storage).partition_state(PATH, shared=False)
    state.scan_to_end()
    rng = plan_range(state, "t", 0, 0, end, READ_COMMITTED)
    storage.whole_reads.clear()
    ids = [i for b in read_range(txn_core.Log(storage).partition_log(PATH), rng) for i in b["id"].to_pylist()]
    assert ids == list(range(min(end // 51 * 50 + min(end % 51, 50), 1000)))
    needed = {state.log.entries.key(s) for s in range(state.log.slot_for_offset(end - 1) + 1)}
    assert storage.whole_reads == dict.fromkeys(needed, 1)  # read ahead up to the range's end, not past it


@pytest.mark.parametrize("pieces", [2, 3, 7])
def test_split_cuts_at_entry_edges_so_no_entry_is_read_by_two_tasks(
    pieces: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = _twenty_transactions(monkeypatch)
    state = txn_core.Log(storage).partition_state(PATH, shared=False)
    state.scan_to_end()
    end = state.read_bound()
    rng = plan_range(state, "t", 0, 0, end, READ_COMMITTED)
    split = split_range(state.log, rng, pieces)
    assert len(split) == pieces
    assert [r.start for r in split] == [0] + [r.end for r in split[:-1]] and split[-1].end == end
    bases = {h.base_offset for h in (state.log.fetch_header(s) for s in range(state.log.readable_tail()[0]))}
    assert all(r.start in bases for r in split)  # every piece begins where an entry does
    assert max(r.size for r in split) - min(r.size for r in split) <= 2 * (end // (4 * pieces)) + 2
    storage.whole_reads.clear()
    ids = [
        i for r in split for b in read_range(txn_core.Log(storage).partition_log(PATH), r) for i in b["id"].to_pylist()
    ]
    assert ids == list(range(1000))
    assert set(storage.whole_reads.values()) == {1}  # each entry fetched once, by one task


def test_split_cuts_inside_entries_larger_than_a_quarter_piece() -> None:
    log = new_log()
    send(log.producer(), list(range(1000)))  # one entry of 1,000 records
    state = log.partition_state(PATH, shared=False)
    state.scan_to_end()
    rng = plan_range(state, "t", 0, 0, state.read_bound(), READ_COMMITTED)
    split = split_range(state.log, rng, 4)
    assert [(r.start, r.end) for r in split] == [(0, 250), (250, 500), (500, 750), (750, 1000)]
    assert [i for r in split for b in read_range(log.partition_log(PATH), r) for i in b["id"].to_pylist()] == list(
        range(1000)
    )


def test_cuts_moved_to_entry_edges_keep_every_piece_under_the_cap() -> None:
    log = new_log()
    p = log.producer()
    for i in range(5):  # five entries of 594 records: edges fall far from the even cuts
        send(p, list(range(i * 594, (i + 1) * 594)))
    state = log.partition_state(PATH, shared=False)
    state.scan_to_end()
    rng = plan_range(state, "t", 0, 0, state.read_bound(), READ_COMMITTED)
    assert rng.size == 2970
    loose = [r.size for r in split_range(state.log, rng, 3)]
    assert max(loose) > 1000  # snapped to the edges at 594 and 2376: a middle piece of 1,782
    capped = split_range(state.log, rng, 3, max_size=1000)
    assert all(r.size <= 1000 for r in capped) and sum(r.size for r in capped) == 2970, [r.size for r in capped]
    ids = [i for r in capped for b in read_range(log.partition_log(PATH), r) for i in b["id"].to_pylist()]
    assert ids == list(range(2970))
