"""Rolling a partition's history into segments (PROTOCOL.md "Segments").

Every reader -- consumers under both isolation levels, range plans and reads, header scans, buffer
rebuilds, offsets by time, subscriptions -- gets exactly what it got from the loose entries; rolling never
passes the last stable offset; rolled loose entries and staged objects go only after the minimum age;
appenders, retention and other rollers keep working; and a rolled history is read with few requests.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import threading
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from fakeclock import FakeClock
from raw_entries import staged_rows

import txn_core
from txn_core.clock import system_clock
from txn_core.errors import CorruptDataError, DataLossError
from txn_core.format import paths
from txn_core.format.segment import Form
from txn_core.ops import maintenance
from txn_core.ops.rolling import Roller, RollPolicy
from txn_core.partition.partition import PartitionLog
from txn_core.partition.ranges import plan_range, read_range, split_range
from txn_core.partition.timeindex import offset_for_timestamp
from txn_core.storage import MemoryStorage, Storage, open_storage
from txn_core.storage.base import DelegatingStorage

SCHEMA = pa.schema([("id", pa.int64())])
PATH = paths.partition_log_path("t", 0)
SMALL = RollPolicy(entries=8, max_entries=16)
T0 = 2_000_000_000_000


@pytest.fixture(params=["memory", "local"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Storage:
    if request.param == "memory":
        return MemoryStorage(uuid.uuid4().hex)
    return open_storage(f"file://{tmp_path}/log")


def _history(log: txn_core.Log, clock: FakeClock, txns: int = 40, start: int = 0) -> None:
    """Committed and aborted transactions with inline rows and staged references, and plain rows."""
    p = log.producer("writer", transaction_timeout_ms=60_000)
    p.init_transactions()
    plain = log.producer()
    for i in range(start, start + txns):
        clock.now += 1_000
        p.begin_transaction()
        p.send("t", pa.table({"id": [i, i + 100_000]}, schema=SCHEMA), partition=0)
        if i % 3 == 0:
            p.send_staged([staged_rows(log, "writer", i, "t", [i + 200_000], SCHEMA)])
        p.flush()
        if i % 5 == 2:
            p.abort_transaction()
        else:
            p.commit_transaction()
        if i % 4 == 1:
            plain.send("t", pa.table({"id": [i + 300_000]}, schema=SCHEMA), partition=0)
            plain.flush()
    p.close()
    plain.close()


def _log(storage: Storage, clock: FakeClock) -> txn_core.Log:
    return txn_core.Log(storage, clock=clock)


def _setup(storage: Storage, txns: int = 40) -> tuple[txn_core.Log, FakeClock]:
    clock = FakeClock(T0)
    log = _log(storage, clock)
    log.create_topic("t", 1, SCHEMA)
    _history(log, clock, txns)
    return log, clock


def _read(storage: Storage, clock: FakeClock, isolation: str = "read_committed") -> list[tuple[int, int, int]]:
    c = _log(storage, clock).consumer(isolation_level=isolation)
    c.assign([("t", 0)])
    out: list[tuple[int, int, int]] = []
    while (got := c.poll()).num_rows:
        out += zip(
            got.column("_offset").to_pylist(),
            got.column("id").to_pylist(),
            got.column("_timestamp").cast(pa.int64()).to_pylist(),
            strict=True,
        )
    return out


def _headers(storage: Storage) -> list[Any]:
    plog = PartitionLog(storage, PATH, clock=system_clock)
    tail, _ = plog.tail(refresh=True)
    return [plog.read_header(s) for s in range(plog.log_start(refresh=True).slot, tail)]


def _everything(
    storage: Storage, clock: FakeClock
) -> tuple[list[tuple[int, int, int]], list[tuple[int, int, int]], list[Any]]:
    return (_read(storage, clock), _read(storage, clock, "read_uncommitted"), _headers(storage))


def _roll(storage: Storage, clock: FakeClock, policy: RollPolicy = SMALL, min_age_ms: int = 0) -> Any:
    return Roller(_log(storage, clock), PATH, policy).roll(min_age_ms=min_age_ms)


def _loose(storage: Storage) -> list[str]:
    return storage.list(paths.entries(PATH))


def _segments(storage: Storage) -> list[str]:
    return storage.list(paths.segments(PATH))


def test_a_rolled_partition_reads_exactly_as_before(storage: Storage) -> None:
    _, clock = _setup(storage)
    before = _everything(storage, clock)
    slots = len(_loose(storage))
    result = _roll(storage, clock)
    assert result.segments >= 3 and result.entries == result.chain_end
    assert 0 <= result.stable_slot - result.chain_end < SMALL.entries  # a remainder below the policy waits
    assert len(_loose(storage)) == slots - result.entries  # deleted at once: min_age_ms=0
    assert _everything(storage, clock) == before
    # and read_committed never sees an aborted id
    assert all((i % 100_000) % 5 != 2 for _o, i, _t in before[0] if i < 300_000)


def test_staged_rows_are_inlined_and_only_committed_ones_lose_their_staged_objects(storage: Storage) -> None:
    _, clock = _setup(storage)
    committed_refs = [i + 200_000 for i in range(0, 40, 3) if i % 5 != 2]
    aborted_refs = [i + 200_000 for i in range(0, 40, 3) if i % 5 == 2]
    staged_before = _staged(storage)
    assert len(staged_before) == len(committed_refs) + len(aborted_refs) == 14
    # the committer's cleanup removed one aborted transaction's staged object already
    cleaned = next(k for k in staged_before if _staged_id(storage, k) == aborted_refs[0])
    storage.delete(cleaned)
    before = _everything(storage, clock)
    assert aborted_refs[1] in [i for _o, i, _t in before[1]]  # read_uncommitted shows aborted staged rows
    result = _roll(storage, clock, RollPolicy(entries=1, max_entries=10_000))
    assert result.chain_end == result.stable_slot  # everything was decided
    assert result.deleted_staged == len(committed_refs)
    # the staged objects of aborted references stay (a later commit may name the same objects)
    assert [_staged_id(storage, k) for k in _staged(storage)] == aborted_refs[1:]
    assert _everything(storage, clock) == before
    forms = list(PartitionLog(storage, PATH, clock=system_clock).segments.open(0).forms())
    assert forms.count(Form.INLINED) == len(committed_refs)
    assert (forms.count(Form.HIDDEN), forms.count(Form.DROPPED)) == (1, 1)


def _staged_id(storage: Storage, key: str) -> int:
    from txn_core.format.entry import decode_arrow, decode_header, verify_payload

    data = storage.read(key)
    return int(decode_arrow(verify_payload(decode_header(data, key), data, key), key).column("id")[0].as_py())


def _staged(storage: Storage) -> list[str]:
    out = []
    for owner in storage.list("staging/"):
        for batch in storage.list("staging/" + owner):
            out += ["staging/" + owner + batch + name for name in storage.list("staging/" + owner + batch)]
    return sorted(out, key=lambda k: int(k.split("/")[2]))


def test_rolling_never_passes_the_last_stable_offset(storage: Storage) -> None:
    log, clock = _setup(storage, txns=10)
    hold = log.producer("holder")
    hold.init_transactions()
    hold.begin_transaction()
    hold.send("t", pa.table({"id": [-1]}, schema=SCHEMA), partition=0)
    hold.flush()
    open_slot = len(_loose(storage)) - 1
    _history(log, clock, txns=10, start=10)
    before = _everything(storage, clock)
    result = _roll(storage, clock, RollPolicy(entries=1))
    assert result.chain_end == result.stable_slot == open_slot  # up to the open transaction, not past it
    assert _everything(storage, clock) == before
    hold.commit_transaction()
    hold.close()
    after_commit = _everything(storage, clock)
    result = _roll(storage, clock, RollPolicy(entries=1))
    assert result.chain_end == len(_headers(storage))
    assert _everything(storage, clock) == after_commit
    assert -1 in [i for _o, i, _t in after_commit[0]]


def test_the_policy_waits_for_enough_entries_or_bytes(storage: Storage) -> None:
    _, clock = _setup(storage, txns=5)
    entries = len(_loose(storage))
    assert _roll(storage, clock, RollPolicy(entries=entries + 1)).segments == 0
    assert _segments(storage) == []
    assert _roll(storage, clock, RollPolicy(entries=entries + 1, bytes=100)).segments == 1


def test_loose_entries_are_deleted_only_when_their_segment_is_old_enough(storage: Storage) -> None:
    _, clock = _setup(storage)
    before = _everything(storage, clock)
    loose = len(_loose(storage))
    roller = Roller(_log(storage, clock), PATH, SMALL)
    first = roller.roll(min_age_ms=600_000)
    assert first.segments >= 3 and first.deleted_entries == 0 and len(_loose(storage)) == loose
    clock.now += 599_000  # entries are older than the minimum age, the segments not yet
    assert roller.roll(min_age_ms=600_000).deleted_entries == 0
    clock.now += 2_000
    assert roller.roll(min_age_ms=600_000).deleted_entries == first.entries
    assert len(_loose(storage)) == loose - first.entries
    assert _everything(storage, clock) == before
    # a fresh roller (another process) finds nothing more to delete, with one LIST of the loose slots
    assert _roll(storage, clock, min_age_ms=600_000).deleted_entries == 0


def test_an_appender_continues_at_the_log_end_after_everything_was_rolled(storage: Storage) -> None:
    log, clock = _setup(storage, txns=12)
    end = log.describe_topic("t").partitions[0].log_end_offset
    result = _roll(storage, clock, RollPolicy(entries=1))
    assert result.chain_end == result.stable_slot and _loose(storage) == []
    p = _log(storage, clock).producer()  # a fresh process: discovers the tail above the segments
    p.send("t", pa.table({"id": [7]}, schema=SCHEMA), partition=0)
    p.flush()
    assert _read(storage, clock)[-1][:2] == (end, 7)
    assert _everything(storage, clock)[2][-1].base_offset == end


def test_a_long_lived_reader_and_appender_carry_on_across_a_roll(storage: Storage) -> None:
    log, clock = _setup(storage, txns=10)
    reader = log.consumer()
    reader.assign([("t", 0)])
    first = reader.poll(max_records=3)
    p = log.producer()
    p.send("t", pa.table({"id": [1]}, schema=SCHEMA), partition=0)
    p.flush()
    _roll(storage, clock, RollPolicy(entries=1))  # another process rolls and deletes under them
    p.send("t", pa.table({"id": [2]}, schema=SCHEMA), partition=0)
    p.flush()
    rest = []
    while (got := reader.poll()).num_rows:
        rest.append(got)
    ids = first.column("id").to_pylist() + [i for t in rest for i in t.column("id").to_pylist()]
    assert ids == [i for _o, i, _t in _read(storage, clock)]
    assert ids[-2:] == [1, 2]


def test_a_loose_reference_read_just_before_cleanup_is_read_from_the_segment(storage: Storage) -> None:
    log, clock = _setup(storage, txns=7)
    plog = log.partition_log(PATH)
    ref_slots = [s for s in range(len(_loose(storage))) if plog.read_header(s).kind.name == "DATA_REF"]
    committed = [s for s in ref_slots if _read_one(plog, s) is not None]
    entry = plog.read_entry(committed[0])  # the loose entry, before the roll
    assert entry.inlined is None
    _roll(storage, clock, RollPolicy(entries=1))  # deletes the staged object and the loose entry
    from txn_core.partition.records import entry_table

    assert entry_table(storage, entry).column("id").to_pylist() == [200_000]


def _read_one(plog: PartitionLog, slot: int) -> Any:
    from txn_core.partition.records import StagedDataMissingError, entry_table

    try:
        return entry_table(plog.storage, plog.read_entry(slot))
    except StagedDataMissingError:
        return None


def test_range_plans_splits_and_reads_are_the_same_over_segments(storage: Storage) -> None:
    _, clock = _setup(storage)

    def ranges() -> list[list[tuple[int, int]]]:
        fresh = _log(storage, clock)
        state = fresh.partition_state(PATH, shared=False)
        plog = fresh.partition_log(PATH)
        state.scan_to_end()
        ends = {"read_committed": state.read_bound(), "read_uncommitted": state.buffer.position}
        out = []
        for isolation, end in ends.items():
            rng = plan_range(state, "t", 0, 3, end, isolation)
            for piece in split_range(plog, rng, 5):
                rows = pa.Table.from_batches(list(read_range(PartitionLog(storage, PATH, clock=system_clock), piece)))
                out.append(list(zip(rows.column("_offset").to_pylist(), rows.column("id").to_pylist(), strict=True)))
        return out

    before = ranges()
    _roll(storage, clock)
    assert ranges() == before


def test_buffer_rebuilds_time_lookups_and_dumps_are_the_same_over_segments(storage: Storage) -> None:
    _, clock = _setup(storage)

    def facts() -> tuple[object, ...]:
        fresh = _log(storage, clock)
        plog = fresh.partition_log(PATH)
        state = txn_core.partition.state.PartitionState(plog, fresh.coordinator.resolve, write_snapshots=False)
        state._buffer = txn_core.partition.buffer.TxnBuffer(0, 0)
        state.scan_to_end()
        b = state.buffer
        times = [offset_for_timestamp(plog, T0 + k * 2_500) for k in range(0, 20)]
        return (b.position, b.slot, b.aborted.to_table().to_pylist(), b.skips.to_list(), b.committed_count, times)

    before = facts()
    _roll(storage, clock)
    assert facts() == before


def test_a_subscription_and_the_dump_read_a_rolled_partition_as_before(storage: Storage) -> None:
    _, clock = _setup(storage)

    def subscribed() -> list[tuple[int, int]]:
        c = _log(storage, clock).subscribe("t", 0, f"s{uuid.uuid4().hex[:6]}")
        out: list[tuple[int, int]] = []
        while (got := c.receive(7)).num_rows:
            out += zip(got.column("_offset").to_pylist(), got.column("id").to_pylist(), strict=True)
            c.acknowledge(got)
        c.close()
        return out

    def dumped() -> str:
        from txn_core.cli import main

        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            assert main(["dump", storage.url, "t", "--show-control", "--json", "--limit", "0"]) == 0
        return buf.getvalue()

    before = (subscribed(), dumped() if storage.url.startswith("file:") else "")
    _roll(storage, clock)
    assert (subscribed(), dumped() if storage.url.startswith("file:") else "") == before
    assert [i for _o, i in before[0]] == [i for _o, i, _t in _read(storage, clock)]


def test_retention_deletes_whole_segments_and_readers_start_at_the_log_start(storage: Storage) -> None:
    _, clock = _setup(storage)
    _roll(storage, clock)
    segments = _segments(storage)
    clock.now = 10**15
    kept = 0
    result = maintenance.apply_retention(_log(storage, clock), "t", retention_ms=1, min_age_ms=0, check_min_age=False)[
        0
    ]
    start_slot = PartitionLog(storage, PATH, clock=system_clock).log_start(refresh=True).slot
    for name in segments:
        gone = name not in _segments(storage)
        end = PartitionLog(storage, PATH, clock=system_clock).segments.end_of(int(name)) if not gone else None
        assert gone or (end is not None and end > start_slot)
        kept += not gone
    assert result.new_start > 0 and kept < len(segments)
    assert _read(storage, clock) == []
    with pytest.raises(DataLossError):
        c = _log(storage, clock).consumer()
        c.assign([("t", 0)])
        c.seek(("t", 0), 0)


def test_two_rollers_of_one_range_create_one_segment_and_agree(storage: Storage) -> None:
    _, clock = _setup(storage)
    before = _everything(storage, clock)
    gate = _CreateGate(storage, 2)
    results: list[Any] = []

    def roll() -> None:
        results.append(Roller(_log(gate, clock), PATH, SMALL).roll(min_age_ms=0, cleanup=False))

    threads = [threading.Thread(target=roll) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(r.lost for r in results) >= 1  # both built the first segment; one create won
    assert results[0].chain_end == results[1].chain_end
    assert sum(r.segments for r in results) == len(_segments(storage))
    firsts = sorted(int(n) for n in _segments(storage))
    catalog = PartitionLog(storage, PATH, clock=system_clock).segments
    assert all(catalog.end_of(a) == b for a, b in itertools.pairwise(firsts))  # a chain, no overlap
    _roll(storage, clock)  # cleanup
    assert _everything(storage, clock) == before


class _CreateGate(DelegatingStorage):
    """Holds the first segment create of each of ``n`` rollers until all of them reached it."""

    def __init__(self, inner: Storage, n: int) -> None:
        super().__init__(inner)
        self.barrier = threading.Barrier(n, timeout=30)
        self.passed: set[int] = set()

    def create(self, key: str, chunks: Any) -> None:
        if "/segments/" in key and threading.get_ident() not in self.passed:
            self.passed.add(threading.get_ident())
            self.barrier.wait()
        super().create(key, chunks)


def test_a_damaged_segment_raises_corrupt_data_naming_it(storage: Storage) -> None:
    _, clock = _setup(storage, txns=10)
    _roll(storage, clock, RollPolicy(entries=1))
    key = paths.segments(PATH) + _segments(storage)[0]
    data = bytearray(storage.read(key))
    data[len(data) // 2] ^= 0xFF  # a payload byte
    storage.delete(key)
    storage.create(key, [bytes(data)])
    with pytest.raises(CorruptDataError, match=key.split("/")[-1]):
        _read(storage, clock, "read_uncommitted")


def test_a_fresh_reader_reads_a_rolled_history_with_few_requests() -> None:
    inner = MemoryStorage(uuid.uuid4().hex)
    clock = FakeClock(T0)
    log = _log(inner, clock)
    log.create_topic("t", 1, SCHEMA)
    p = log.producer("w")
    p.init_transactions()
    for i in range(600):
        p.begin_transaction()
        p.send("t", pa.table({"id": [i]}, schema=SCHEMA), partition=0)
        p.commit_transaction()
    p.close()

    def requests() -> tuple[int, int]:
        counted = _KeyLog(inner)
        c = _log(counted, clock).consumer()
        c.assign([("t", 0)])
        rows = 0
        while (got := c.poll()).num_rows:
            rows += got.num_rows
        return rows, len([k for k in counted.keys if "/log/" in k or "/segments/" in k])

    rows, loose = requests()
    _roll(inner, clock, RollPolicy(entries=100, max_entries=400))
    assert _loose(inner) == []
    rows_after, rolled = requests()
    assert rows == rows_after == 600
    assert loose >= 601  # one request per entry: 600 data entries (carrying the markers before them), a marker
    # a listing, 3 segments' indexes and entries (two reads each), the loose tail (the reads ahead find its end)
    assert rolled <= 20, rolled


class _KeyLog(DelegatingStorage):
    """Records the key of every request."""

    def __init__(self, inner: Storage) -> None:
        super().__init__(inner)
        self.keys: list[str] = []
        self._lock = threading.Lock()

    def _note(self, key: str) -> None:
        with self._lock:
            self.keys.append(key)

    def read(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        self._note(key)
        return super().read(key, start, end)

    def read_buffer(self, key: str) -> Any:
        self._note(key)
        return super().read_buffer(key)

    def exists(self, key: str) -> bool:
        self._note(key)
        return super().exists(key)

    def list(self, prefix: str) -> list[str]:
        self._note(prefix)
        return super().list(prefix)


def test_read_ahead_recovers_from_a_failed_read_with_a_segment_span_planned_behind_it() -> None:
    """A loose read fails while the read behind it spans a segment being opened: the failure is raised at
    its own slot, and the next call reads again from there (no read is left half-planned)."""
    from txn_core.errors import ObjectNotFoundError
    from txn_core.format.entry import EntryHeader, EntryKind
    from txn_core.partition.readahead import HeaderReadAhead

    class Plan:
        def plan(self, slot: int, max_slots: int, max_bytes: int) -> tuple[int, bool]:
            return (0, True) if slot == 0 else (4, False)  # slot 0 loose, then a segment not opened yet

    class Log:
        segments = Plan()
        failures = 1

        def remember(self, slot: int, header: EntryHeader) -> None:
            pass

        def known_tail_slot(self) -> int | None:
            return None  # the tail is not known: a miss is not retried

        def listed_end(self) -> int | None:
            return None  # no listing of the loose entries

        def fetch_headers(self, slot: int, count: int) -> list[EntryHeader]:
            if slot == 0 and self.failures:
                self.failures -= 1
                raise ObjectNotFoundError("slot 0 is not there yet")
            return [
                EntryHeader(EntryKind.DATA, s, 1, -1, 0, -1, None, 0, 0, 0, b"\0" * 16)
                for s in range(slot, slot + count)
            ]

    ahead = HeaderReadAhead(Log(), 0)  # type: ignore[arg-type]
    ahead._depth = 2  # a reader that was reading ahead already: the segment span is issued with slot 0
    with pytest.raises(ObjectNotFoundError):
        ahead.next(0)
    assert [ahead.next(s).base_offset for s in range(5)] == [0, 1, 2, 3, 4]


def test_a_damaged_entry_stops_rolling_and_one_marked_lost_stays_loose_between_segments(storage: Storage) -> None:
    """Rolling never copies a damaged entry: the buffer (and so the stable slot) stops before one not marked
    lost; once an operator marks it lost, a segment ends before it, the next starts after it, and every
    reader still skips exactly its offsets (PROTOCOL.md "Damage")."""
    from txn_core.ops.damage import mark_lost

    _, clock = _setup(storage, txns=12)
    plog = PartitionLog(storage, PATH, clock=system_clock)
    # a plain entry (an entry marked lost that was a transaction's marker would hold rolling at that
    # transaction's data: the buffer keeps it open, only the read bound decides it by the record)
    damaged = next(s for s in range(8, 30) if plog.read_header(s).txn is None)
    key = plog.entries.key(damaged)
    data = bytearray(storage.read(key))
    data[20] ^= 0x01  # the header checksum no longer matches
    storage.delete(key)
    storage.create(key, [bytes(data)])
    result = _roll(storage, clock, RollPolicy(entries=1, max_entries=4))
    assert result.chain_end == result.stable_slot <= damaged  # up to the damage (or an earlier open one)
    mark_lost(_log(storage, clock), "t", 0, damaged, reason="test")
    before = _read(storage, clock), _read(storage, clock, "read_uncommitted")
    result = _roll(storage, clock, RollPolicy(entries=1, max_entries=4))
    assert result.chain_end == result.stable_slot > damaged + 1
    assert _loose(storage) == [paths.slot_name(damaged)]  # the lost entry stays, with its record
    firsts = [int(n) for n in _segments(storage)]
    assert damaged not in firsts and damaged + 1 in firsts
    assert (_read(storage, clock), _read(storage, clock, "read_uncommitted")) == before


def test_the_background_roller_looks_at_a_partition_once_enough_entries_were_appended(storage: Storage) -> None:
    from txn_core.ops.rolling import BackgroundRoller

    log, clock = _setup(storage, txns=20)
    roller = BackgroundRoller(_log(storage, clock), RollPolicy(entries=10), min_age_ms=0, check_min_age=False)
    roller.appended("t", {0: 1})  # new to this roller: looked at at once
    roller.wait(60)
    assert roller.runs == 1 and len(_segments(storage)) == 1
    _history(log, clock, txns=6, start=20)  # about 15 entries
    roller.appended("t", {0: 4})  # as far as this roller knows, not enough yet: nothing is read
    roller.wait(60)
    assert roller.runs == 1 and len(_segments(storage)) == 1
    expected = _read(storage, clock)
    roller.appended("t", {0: 8})
    roller.wait(60)
    assert roller.runs == 2 and len(_segments(storage)) == 2
    assert _read(storage, clock) == expected


def test_a_task_reading_a_range_lists_segments_once_however_many_of_its_reads_miss() -> None:
    """A Spark task (a fresh log client, no log start read) reading loose entries up to the log end: its
    reads ahead past the end all miss at once, and share one listing of the segments."""
    inner = MemoryStorage(uuid.uuid4().hex)
    clock = FakeClock(T0)
    _setup_log = _log(inner, clock)
    _setup_log.create_topic("t", 1, SCHEMA)
    _history(_setup_log, clock, txns=40)
    state = _log(inner, clock).partition_state(PATH, shared=False)
    state.scan_to_end()
    rng = plan_range(state, "t", 0, 0, state.buffer.position, "read_uncommitted")
    counted = _KeyLog(inner)
    rows = sum(b.num_rows for b in read_range(PartitionLog(counted, PATH, clock=system_clock), rng))
    assert rows == len(_read(inner, clock, "read_uncommitted"))
    assert counted.keys.count(paths.segments(PATH)) <= 1
