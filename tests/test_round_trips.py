"""The round trips each path pays: requests counted per operation, overlap checked structurally.

Counts, never times: a request is counted by kind and key (:class:`latency_storage.DelayedStorage`), and
"overlapped" means several requests were in flight at once (each one holds a short delay, so requests
issued one after another never overlap). The figures in RTT units come from ``tests/bench_round_trips.py``.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
import threading
import time
import uuid
from typing import Any

import pyarrow as pa
import pytest
from fakeclock import FakeClock
from hypothesis import given, settings
from hypothesis import strategies as st
from latency_storage import DelayedStorage

import txn_core
from txn_core.clients.subscriptions.keys import SLICE_SIZE, key_hash
from txn_core.coordinator.actions import Begin, Prepare, Record
from txn_core.coordinator.service import coordinator_for
from txn_core.coordinator.txnlog import COMPACTION_MIN_AGE_MS
from txn_core.errors import (
    ConfigurationError,
    CorruptDataError,
    InvalidNameError,
    ObjectNotFoundError,
    StoragePermissionError,
)
from txn_core.format import envelope, paths
from txn_core.format.ids import TxnId
from txn_core.format.slotlog import SlotLog
from txn_core.format.states import CoordinatorState
from txn_core.ops.rolling import Roller, RollPolicy
from txn_core.partition.ranges import available_end, plan_range
from txn_core.partition.readahead import ReadAhead
from txn_core.partition.reader import READ_COMMITTED
from txn_core.partition.snapshots import SNAPSHOT_EVERY_ENTRIES, SnapshotStore
from txn_core.partition.timeindex import offset_for_timestamp
from txn_core.storage import MemoryStorage, ObjectStoreStorage, open_storage
from txn_core.storage.base import LIST_PAGE, ListPage, Storage
from txn_core.storage.obstore_s3 import ObstoreS3Storage, obstore_config

SCHEMA = pa.schema([("id", pa.int64())])


class InFlight(DelayedStorage):
    """Counts requests and the most that were in flight at once (each holds ``rtt_s``), and the round of each:
    one more than the highest round among the requests that had finished when it began (requests issued
    together share a round; one issued after another's answer is a round later)."""

    def __init__(self, inner: Storage, rtt_s: float = 0.02) -> None:
        super().__init__(inner, rtt_s)
        self.keys: list[tuple[str, str]] = []
        self.rounds: list[tuple[int, str, str]] = []  # (round, kind, key)
        self.done = 0  # the highest round among finished requests
        self._now = 0
        self.peak = 0
        self._gate = threading.Lock()

    def _track(self, kind: str, key: str) -> None:
        with self._gate:
            self.keys.append((kind, key))
            depth = self.done + 1
            self.rounds.append((depth, kind, key))
            self._now += 1
            self.peak = max(self.peak, self._now)
        try:
            time.sleep(self.rtt_s)
        finally:
            with self._gate:
                self._now -= 1
                self.done = max(self.done, depth)

    def last_round(self, exclude: str = "\0") -> int:
        """The highest round among the requests so far whose key does not contain ``exclude``."""
        with self._gate:
            return max((d for d, _, key in self.rounds if exclude not in key), default=0)

    def _request(self, kind: str) -> None:
        with self._lock:
            self.counts[kind] += 1

    def create(self, key: str, chunks: Any) -> None:
        self._track("create", key)
        super().create(key, chunks)

    def read(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        self._track("read", key)
        return super().read(key, start, end)

    def read_buffer(self, key: str) -> Any:
        self._track("read", key)
        return super().read_buffer(key)

    def exists(self, key: str) -> bool:
        self._track("exists", key)
        return super().exists(key)

    def list(self, prefix: str) -> list[str]:
        self._track("list", prefix)
        return super().list(prefix)

    def list_page(self, prefix: str, limit: int = LIST_PAGE) -> ListPage | None:
        self._track("list", prefix)
        return super().list_page(prefix, limit)


def _log(storage: Storage) -> txn_core.Log:
    log = txn_core.Log(storage)
    if "t" not in log.list_topics():
        log.create_topic("t", 4, SCHEMA)
    return log


# --- finding the tail ---------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 3000), lower_frac=st.floats(0, 1), near=st.booleans())
def test_find_tail_finds_the_first_free_slot(n: int, lower_frac: float, near: bool) -> None:
    storage = MemoryStorage(uuid.uuid4().hex)
    slots = SlotLog(storage, "s/")
    for i in range(n):
        storage.create(slots.key(i), [b"x"])
    lower = int(n * lower_frac)
    assert slots.find_tail(lower, near=near) == n


def test_find_tail_overlaps_its_probes() -> None:
    storage = InFlight(MemoryStorage(uuid.uuid4().hex))
    slots = SlotLog(storage, "s/")
    for i in range(1000):
        storage.inner.create(slots.key(i), [b"x"])
    assert slots.find_tail(0) == 1000
    assert storage.peak >= 5, "each round's existence checks are in flight together"
    rounds = storage.counts["exists"] / storage.peak
    assert rounds < 2 * 10, "far fewer rounds than a sequential gallop and bisection (2 log2 n = 20 checks)"


# --- coordinator appends ------------------------------------------------------------------------


def test_a_warm_transaction_creates_its_records_without_reading_first() -> None:
    storage = InFlight(MemoryStorage(uuid.uuid4().hex), rtt_s=0)
    log = _log(storage)
    p = log.producer("warm")
    p.init_transactions()
    for _ in range(2):
        p.begin_transaction()
        p.send("t", pa.table({"id": [1, 2]}), partition=0)
        p.commit_transaction()
        p.wait_for_markers()
    storage.keys.clear()
    p.begin_transaction()
    p.send("t", pa.table({"id": [3]}), partition=0)
    p.commit_transaction()
    critical = list(storage.keys)
    coordinator = [(k, key) for k, key in critical if key.startswith("_txnlog/coordinators/")]
    # One record: the prepare, with the previous transaction's Complete and the next one begun ahead (this
    # one was begun ahead by the previous prepare, so its writes needed no begin record).
    assert [k for k, _ in coordinator] == ["create"], coordinator
    data = [(k, key) for k, key in critical if key.startswith("topics/t/00000/log/")]
    assert [k for k, _ in data][:1] == ["create"] and all(k != "read" for k, _ in data), data
    p.close()


def test_a_warm_transaction_over_64_partitions_writes_its_data_and_its_markers_in_a_round_each() -> None:
    """ISSUE 34 item 3: the data of every partition goes out at once (1 round), then the PrepareCommit record
    (1); the markers, behind the commit, all at once too (1). With fewer writers than partitions each is
    several rounds (64 partitions on 8 writers: 8 rounds of data)."""
    storage = InFlight(MemoryStorage(uuid.uuid4().hex), rtt_s=0.01)
    log = txn_core.Log(storage)
    log.create_topic("wide", 64, SCHEMA)
    p = log.producer("wide")
    p.init_transactions()

    def transaction() -> None:
        p.begin_transaction()
        for part in range(64):
            p.send("wide", pa.table({"id": [part]}), partition=part)
        p.commit_transaction()

    for _ in range(2):  # warm: tails known, the next transaction begun ahead
        transaction()
        p.wait_for_markers()
    with storage._gate:
        storage.rounds.clear()
        storage.done = 0
        # far longer than starting 64 requests takes on a loaded machine (0.05 s was not, under CI's load)
        storage.rtt_s = 0.3
    transaction()
    committed = storage.last_round()
    p.wait_for_markers()
    data = [d for d, kind, key in storage.rounds if kind == "create" and "/log/" in key and key.startswith("topics/")]
    assert committed == 2, storage.rounds
    assert len(data) == 128 and len(set(data)) == 2, sorted(set(data))  # the data (round 1), the markers
    p.close()


def test_an_append_after_half_the_compaction_age_idle_reads_first() -> None:
    storage = InFlight(MemoryStorage(uuid.uuid4().hex), rtt_s=0)
    log = _log(storage)
    p = log.producer("idle")
    p.init_transactions()
    view = log.coordinator.views.get(coordinator_for("idle", log.coordinator.partitions))
    for idle in (False, True):
        if idle:
            view._last_refresh -= COMPACTION_MIN_AGE_MS / 2000 + 1  # idle that long: compaction may have run
        storage.keys.clear()
        p.begin_transaction()
        p.send("t", pa.table({"id": [1]}), partition=0)
        p.flush()  # the first transaction's begin record; later ones were begun ahead
        p.abort_transaction()  # the decision record (with the next transaction begun ahead)
        records = [k for k, key in storage.keys if "coordinators" in key]
        assert records and (records[0] == "read") == idle, storage.keys
        p.wait_for_completion()
    p.close()


def test_a_record_of_several_actions_keeps_the_outcome_of_the_transaction_it_completes() -> None:
    """A Complete folded into the next begin (one record) leaves the finished transaction's outcome known
    to the writing process exactly as replay learns it in another."""
    storage = MemoryStorage(uuid.uuid4().hex)
    log = _log(storage)
    p = log.producer("folded")
    p.init_transactions()
    p.begin_transaction()
    p.send("t", pa.table({"id": [1]}), partition=0)
    p.commit_transaction()
    folded = log.coordinator.state("folded")
    assert folded is not None
    first = folded.txn
    assert first is not None
    p.wait_for_markers()  # a begin carries the previous Complete once the markers have landed
    p.begin_transaction()
    p.send("t", pa.table({"id": [2]}), partition=1)
    p.flush()  # the first write begins the transaction; its begin record carries the first one's Complete
    view = log.coordinator.views.get(first.coordinator)
    replayed = txn_core.Log(storage).coordinator.views.get(first.coordinator)
    replayed.refresh()
    assert view.status(first) == replayed.status(first)
    assert view.status(first).state == CoordinatorState.COMPLETE_COMMIT  # type: ignore[union-attr]
    p.abort_transaction()
    p.close()


# --- reading ------------------------------------------------------------------------------------


def _history(storage: Storage, txns: int) -> None:
    log = _log(storage)
    p = log.producer("history", marker_linger_ms=0)  # markers alone: two slots per transaction, as counted below
    p.init_transactions()
    for i in range(txns):
        p.begin_transaction()
        for part in range(4):
            p.send("t", pa.table({"id": [i * 10 + part]}), partition=part)
        p.commit_transaction()
    p.close()


def test_a_catching_up_consumer_reads_ahead_in_every_partition_at_once() -> None:
    inner = MemoryStorage(uuid.uuid4().hex)
    _history(inner, 60)
    storage = InFlight(inner)
    c = txn_core.Log(storage).consumer()
    c.assign([("t", p) for p in range(4)])
    rows = []
    while (got := c.poll()).num_rows:
        rows.extend(got.column("id").to_pylist())
    assert sorted(rows) == sorted(i * 10 + p for i in range(60) for p in range(4))
    assert storage.peak >= 16, f"reads overlapped within and across partitions (peak {storage.peak})"


def test_a_caught_up_consumer_pays_one_request_per_partition_per_poll() -> None:
    inner = MemoryStorage(uuid.uuid4().hex)
    _history(inner, 5)
    storage = InFlight(inner, rtt_s=0)
    c = txn_core.Log(storage).consumer()
    c.assign([("t", p) for p in range(4)])
    while c.poll().num_rows:
        pass
    c.poll()
    for reader in c._readers.values():
        reader.state.snapshots.finals()  # the snapshots written behind the polls have landed
    storage.keys.clear()
    assert c.poll().num_rows == 0
    assert sorted(k for k, _ in storage.keys) == ["read"] * 4, storage.keys


class HeldCreates(MemoryStorage):
    """Creates under ``snapshots/`` wait until ``release`` is set (or raise, for a read-only store)."""

    def __init__(self, name: str, *, refuse: bool = False) -> None:
        super().__init__(name)
        self.release = threading.Event()
        self.refuse = refuse
        self.held = 0

    def create(self, key: str, chunks: Any) -> None:
        if "/snapshots/" in key:
            self.held += 1
            self.release.wait(30)  # a guard against a hang only: the test releases it
            if self.refuse:
                raise StoragePermissionError(f"{key}: access denied", key)
        super().create(key, chunks)


def test_a_fresh_consumer_of_a_small_log_has_its_rows_in_two_rounds_and_is_caught_up_in_three() -> None:
    """ISSUE 34 item 1 (4 partitions, 72 entries): the format, the topic's metadata and every partition's
    log start, segments, snapshots and loose entries, all at once (1); every listed entry and the slot past
    them read at once (2): the first rows; the poll at the end (3). Nothing past the listed end is read
    ahead, and the snapshot the reader leaves is written behind its records (not counted)."""
    inner = HeldCreates(uuid.uuid4().hex)  # the snapshots, held until the end: they are no part of the path
    _history(MemoryStorage(inner.name), 9)
    storage = InFlight(inner, rtt_s=0.15)  # far longer than issuing 72 reads takes on a loaded machine
    c = txn_core.Log(storage).consumer()
    c.assign([("t", p) for p in range(4)])
    rows = c.poll().column("id").to_pylist()
    first = storage.last_round("/snapshots/0")
    assert sorted(rows) == sorted(i * 10 + p for i in range(9) for p in range(4))
    assert c.poll().num_rows == 0
    caught_up = storage.last_round("/snapshots/0")
    inner.release.set()
    assert (first, caught_up) == (2, 3), storage.rounds
    assert (1, "read", paths.FORMAT_KEY) in storage.rounds, "the format is read in the first round"
    past = [key for _, kind, key in storage.rounds if kind == "read" and "/log/" in key and int(key[-20:]) > 18]
    assert past == [], "no slot past the first free one is read"


def test_a_fresh_consumer_reads_its_first_entries_beside_its_buffer_snapshots() -> None:
    """ISSUE 34 item 1 with the snapshots an earlier reader left: the listings (1); the buffer snapshots and
    the listed entries at once (2): the first rows. Reading the entries only once the buffer was loaded took
    a round more (3)."""
    name = uuid.uuid4().hex
    _history(MemoryStorage(name), 9)
    earlier = txn_core.Log(MemoryStorage(name)).consumer()
    earlier.assign([("t", p) for p in range(4)])
    while earlier.poll().num_rows:
        pass
    earlier.close()  # its snapshots are written
    assert MemoryStorage(name).list("topics/t/00000/snapshots/")
    storage = InFlight(MemoryStorage(name), rtt_s=0.15)
    c = txn_core.Log(storage).consumer()
    c.assign([("t", p) for p in range(4)])
    rows = c.poll().column("id").to_pylist()
    assert sorted(rows) == sorted(i * 10 + p for i in range(9) for p in range(4))
    snapshot_reads = {d for d, kind, key in storage.rounds if kind == "read" and "/snapshots/0" in key}
    entry_reads = {d for d, kind, key in storage.rounds if kind == "read" and "/log/" in key}
    assert snapshot_reads == {2} and min(entry_reads) == 2, storage.rounds
    assert storage.last_round("/snapshots/0") == 2, storage.rounds


def test_a_key_shared_consumer_takes_its_key_slices_in_three_rounds_whatever_their_number() -> None:
    """A fresh Key_Shared consumer with records in 58 key slices claims them together: one LIST of
    the slice leases, one round of creates, one LIST that confirms them (not three rounds per slice)."""
    inner = MemoryStorage(uuid.uuid4().hex)
    log = txn_core.Log(inner)
    log.create_topic("k", 1, pa.schema([("id", pa.int64()), ("key", pa.string())]))
    p = log.producer()
    p.send("k", pa.table({"id": list(range(640)), "key": [f"user-{i % 320}" for i in range(640)]}), partition=0)
    p.close()
    log.subscribe("k", 0, "by-key", subscription_type="key_shared", key_column="key").close()
    storage = InFlight(inner, rtt_s=0.05)
    c = txn_core.Log(storage).subscribe(
        "k", 0, "by-key", subscription_type="key_shared", key_column="key", create=False, max_unacked=1000
    )
    assert c.receive(1000).num_rows == 640
    slices = [(d, kind) for d, kind, key in storage.rounds if "/keys/" in key]
    taken = len({key_hash(f"user-{i}") // SLICE_SIZE for i in range(320)})  # slices holding a key: 58 of 64
    assert sum(1 for _, kind in slices if kind == "create") == taken > 50
    assert sorted({d for d, _ in slices}) == [min(d for d, _ in slices) + i for i in range(3)], slices
    assert storage.peak >= taken, "the creates overlap"


def test_a_fresh_consumer_of_a_rolled_history_reads_its_segments_beside_its_buffer_snapshots() -> None:
    """ISSUE 34 item 2 (4 partitions of 200 entries, each rolled into a segment): the listings (1); each
    partition's buffer snapshot and the segment holding its log start, opened ahead with its entries, at
    once (2); the slot past each segment, to learn the log ends there (3): the first rows, all 400; the
    poll at the end (4). Without the open ahead each segment waits for its snapshot: a round more."""
    name = uuid.uuid4().hex
    _history(MemoryStorage(name), 100)
    for part in range(4):
        path = paths.partition_log_path("t", part)
        policy = RollPolicy(entries=1, max_entries=10_000)
        assert Roller(txn_core.Log(MemoryStorage(name)), path, policy).roll(min_age_ms=0).entries == 200
    c = txn_core.Log(MemoryStorage(name)).consumer()  # a first reader leaves buffer snapshots
    c.assign([("t", p) for p in range(4)])
    while c.poll().num_rows:
        pass
    storage = InFlight(MemoryStorage(name), rtt_s=0.15)
    c = txn_core.Log(storage).consumer()
    c.assign([("t", p) for p in range(4)])
    rows = c.poll().num_rows
    first = storage.last_round("/snapshots/0")
    assert c.poll().num_rows == 0
    assert (rows, first, storage.last_round("/snapshots/0")) == (400, 3, 4), storage.rounds
    second = sorted(key.rsplit("/", 2)[-2] for r, _, key in storage.rounds if r == 2)
    assert second == ["segments"] * 4 + ["snapshots"] * 4, storage.rounds


def test_a_fresh_reader_process_never_imports_pandas(tmp_path: Any) -> None:
    """``pyarrow.array`` and ``Schema.empty_table`` import pandas when it is installed (about 0.3 s, a dozen
    round trips of a 25 ms store): a fresh reader's path to its rows builds its Arrow columns without them
    (txn_core.format.arrays), from a buffer snapshot with aborted transactions and an empty poll included."""
    url = f"file://{tmp_path}/log"
    log = txn_core.open_log(url)
    log.create_topic("t", 2, pa.schema([("id", pa.int64())]))
    p = log.producer("history")
    p.init_transactions()
    for i in range(30):
        p.begin_transaction()
        p.send("t", pa.table({"id": [i]}), partition=i % 2)
        p.abort_transaction() if i % 5 == 4 else p.commit_transaction()
    p.close()
    log.partition_state(paths.partition_log_path("t", 0)).scan_to_end()  # a snapshot for the next reader
    script = (
        "import sys, txn_core\n"
        f"c = txn_core.open_log({url!r}, create=False).consumer()\n"
        "c.assign([('t', 0), ('t', 1)])\n"
        "n = 0\n"
        "while (t := c.poll()).num_rows: n += t.num_rows\n"
        "print(n, 'pandas' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["24", "False"], out


@pytest.mark.parametrize("refuse", [False, True], ids=["writable", "read-only"])
def test_a_reader_delivers_its_rows_before_the_snapshot_it_leaves_is_written(refuse: bool) -> None:
    """ISSUE 34 item 6: the snapshot a fresh reader leaves is written behind its records: the poll returns
    while the snapshot's create is still held, and a store that refuses it costs the reader nothing."""
    inner = HeldCreates(uuid.uuid4().hex, refuse=refuse)
    _history(MemoryStorage(inner.name), 5)
    c = txn_core.Log(inner).consumer()
    c.assign([("t", p) for p in range(4)])
    got: list[int] = []
    poller = threading.Thread(target=lambda: got.extend(c.poll().column("id").to_pylist()))
    poller.start()
    poller.join(20)  # a guard against a hang only
    delivered = not poller.is_alive()
    inner.release.set()
    poller.join()
    assert delivered, "the poll waited for its snapshot"
    assert sorted(got) == sorted(i * 10 + p for i in range(5) for p in range(4))
    assert c.poll().num_rows == 0
    snaps = SnapshotStore(inner, paths.partition_log_path("t", 0), clock=lambda: 0)
    assert snaps.finals() == ([] if refuse else [10]), "this process sees the snapshot it wrote behind"


class StaleLog(MemoryStorage):
    """Listings of ``log/`` that lag behind (miss the newest ``missing`` slots) or still show ``extra``
    slots deleted since: a listing is a hint (PROTOCOL.md "Slot logs")."""

    def __init__(self, name: str, missing: int = 0, extra: int = 0, page: int = LIST_PAGE) -> None:
        super().__init__(name)
        self.missing, self.extra, self.page = missing, extra, page

    def list_page(self, prefix: str, limit: int = LIST_PAGE) -> ListPage | None:
        return super().list_page(prefix, min(limit, self.page))  # a store whose pages hold ``page`` names

    def list(self, prefix: str) -> list[str]:
        names = super().list(prefix)
        if not prefix.endswith("/log/") or not names:
            return names
        last = int(names[-1])
        kept = names[: len(names) - self.missing] if self.missing else names
        return kept + [paths.slot_name(last + i) for i in range(1, self.extra + 1)]


@pytest.mark.parametrize(
    ("missing", "extra", "hole", "page"),
    [
        (0, 0, False, LIST_PAGE),  # a fresh listing: the tail in one round more than the listings
        (3, 0, False, LIST_PAGE),  # a lagging listing misses the newest entries: the search goes on past them
        (0, 2, False, LIST_PAGE),  # a listing still shows entries since deleted (or never there): not the end
        (0, 0, True, LIST_PAGE),  # a hole past the listed end: the end is never a hole
        (0, 0, False, 7),  # more entries than a page: one page listed, the search goes on from its last
    ],
)
def test_the_tail_is_learned_from_a_listing_and_checked(missing: int, extra: int, hole: bool, page: int) -> None:
    name = uuid.uuid4().hex
    _history(MemoryStorage(name), 15)
    path = paths.partition_log_path("t", 1)
    inner = StaleLog(name, missing, extra, page)
    entries = SlotLog(inner, paths.entries(path))
    if hole:  # slot 31 present after a missing 30: the tail lies past it
        inner.create(entries.key(31), [inner.read(entries.key(29))])
    storage = InFlight(inner)
    plog = txn_core.Log(storage).partition_log(path)
    storage.rounds.clear()
    storage.done = 0
    if hole:
        assert plog.tail()[0] == 32  # past the entry at 31: never the hole at 30
        return
    assert plog.tail() == (30, 30)
    assert [key for _, kind, key in storage.rounds if kind == "list" and key.endswith("/log/")] == [
        paths.entries(path)
    ], "one page of log/ is listed, however many entries there are"
    if missing == extra == 0:
        low = 29 if page == LIST_PAGE else 6  # the last slot listed
        assert not any(kind == "exists" and int(key[-20:]) < low for _, kind, key in storage.rounds)
    if missing == extra == 0 and page == LIST_PAGE:
        assert storage.last_round() == 2, storage.rounds  # the listings; the candidate, its probes and header


def test_a_fresh_consumer_reads_a_partition_longer_than_a_listing_page() -> None:
    """The listing of ``log/`` is one page: past it the reader reads on as without a listing."""
    name = uuid.uuid4().hex
    _history(MemoryStorage(name), 15)
    c = txn_core.Log(StaleLog(name, page=7)).consumer()
    c.assign([("t", p) for p in range(4)])
    got: list[int] = []
    while batch := c.poll():
        got.extend(batch.column("id").to_pylist())
    assert sorted(got) == sorted(i * 10 + p for i in range(15) for p in range(4))


def test_planning_a_read_from_the_earliest_offset_reads_no_entry() -> None:
    """A query's first batch from ``earliest`` starts at the log start's slot, which the open already
    knows: planning neither looks for the tail slot by slot nor bisects the partition's headers."""
    inner = MemoryStorage(uuid.uuid4().hex)
    _history(inner, 60)
    path = paths.partition_log_path("t", 1)
    txn_core.Log(inner).partition_state(path).scan_to_end()  # an earlier reader left a snapshot
    storage = InFlight(inner, rtt_s=0)
    state = txn_core.Log(storage).partition_state(path, shared=False)
    start = state.log.recent_log_start().offset
    end = available_end(state, READ_COMMITTED)
    storage.keys.clear()
    rng = plan_range(state, "t", 1, start, end, READ_COMMITTED)
    assert (rng.start, rng.end, rng.start_slot) == (0, 120, 0)  # 60 data entries and their 60 markers
    assert [k for k in storage.keys if "/log/" in k[1]] == []


def test_the_slot_of_a_remembered_entry_costs_no_request() -> None:
    """An offset inside an entry this process has read is found without learning the tail first."""
    inner = MemoryStorage(uuid.uuid4().hex)
    _history(inner, 30)
    storage = InFlight(inner, rtt_s=0)
    plog = txn_core.Log(storage).partition_log(paths.partition_log_path("t", 2))
    plog.log_start()  # opened
    header = plog.read_header(20)
    storage.keys.clear()
    assert plog.slot_for_offset(header.base_offset) == 20
    assert storage.keys == []


def _entries(storage: Storage, counts: list[int]) -> list[int]:
    """Topic ``t`` (1 partition) holding one entry per count, of that many records; returns the base offsets."""
    log = txn_core.Log(storage)
    log.create_topic("t", 1, SCHEMA)
    with log.producer() as p:
        for n in counts:
            p.send("t", pa.table({"id": list(range(n))}), partition=0)
            p.flush()  # one entry each
    bases = list(itertools.accumulate(counts, initial=0))[:-1]
    plog = log.partition_log(paths.partition_log_path("t", 0))
    assert [plog.read_header(slot).base_offset for slot in (0, len(counts) - 1)] == [bases[0], bases[-1]]
    return bases


@settings(max_examples=25, deadline=None)
@given(
    counts=st.lists(st.integers(1, 500), min_size=1, max_size=120), picks=st.lists(st.integers(0, 10**6), max_size=6)
)
def test_the_slot_of_any_offset_is_found_whatever_the_entry_sizes(counts: list[int], picks: list[int]) -> None:
    storage = MemoryStorage(uuid.uuid4().hex)
    bases = _entries(storage, counts)
    end = bases[-1] + counts[-1]
    for pick in [0, end - 1, end, *picks]:
        offset = pick % (end + 1)
        plog = txn_core.Log(storage).partition_log(paths.partition_log_path("t", 0))  # remembers nothing
        want = len(counts) if offset == end else max(i for i, b in enumerate(bases) if b <= offset)
        assert plog.slot_for_offset(offset) == want, (offset, bases)


def test_the_slot_of_an_offset_costs_one_round_of_header_reads_for_entries_of_like_size() -> None:
    """A consumer starting at a committed offset, a batch query at given offsets, a task's cut of a
    partition: the offsets interpolate to the slot, read together with a spread of others."""
    inner = MemoryStorage(uuid.uuid4().hex)
    bases = _entries(inner, [3] * 1000)
    storage = InFlight(inner, rtt_s=0.01)
    plog = txn_core.Log(storage).partition_log(paths.partition_log_path("t", 0))
    plog.tail()
    storage.keys.clear()
    storage.peak = 0
    assert plog.slot_for_offset(bases[637] + 2) == 637
    tail = plog.entries.key(1000)  # the log end is looked at too, as before any search
    reads = [k for kind, k in storage.keys if kind == "read" and "/log/" in k and k != tail]
    assert 2 <= len(reads) <= 8 and storage.peak >= 2, (reads, storage.peak)  # bisection: 10, one at a time


def test_a_read_committed_seek_past_the_buffer_reads_the_headers_ahead() -> None:
    """A consumer starting at a committed offset deep into a partition with no snapshot there scans the
    headers up to it with reads in flight together, as the buffer's own scans do (it read them one by one:
    a round trip per entry)."""
    inner = MemoryStorage(uuid.uuid4().hex)
    bases = _entries(inner, [2] * 300)
    storage = InFlight(inner, rtt_s=0.01)
    c = txn_core.Log(storage).consumer()
    c.assign([("t", 0)])
    storage.keys.clear()
    storage.peak = 0
    c.seek(("t", 0), bases[250])
    headers = [k for kind, k in storage.keys if kind == "read" and "/log/" in k]
    # up to 64 in flight (10 ms reads: with 2 ms a loaded machine once peaked at 25)
    assert len(headers) >= 250 and storage.peak >= 32, (len(headers), storage.peak)
    assert c.poll().column("id").to_pylist()[:2] == [0, 1]  # the records of entry 250 come first


def test_the_offset_of_a_timestamp_reads_its_headers_in_rounds_and_ahead() -> None:
    """``startingTimestamp`` and ``offsets_for_times``: the search for the floor ``T - max_skew`` reads its
    headers in rounds, and the scan on from there (every entry of the last ``max_skew``) reads ahead; both
    read one header after another before."""
    clock = FakeClock()
    inner = MemoryStorage(uuid.uuid4().hex)
    log = txn_core.Log(inner, clock=clock)
    log.create_topic("t", 1, SCHEMA)
    stamps = []
    with log.producer() as p:
        for i in range(400):
            clock.now += 1000  # an entry a second
            stamps.append(clock.now)
            p.send("t", pa.table({"id": [i]}), partition=0)
            p.flush()
    storage = InFlight(inner, rtt_s=0.002)
    plog = txn_core.Log(storage, clock=clock).partition_log(paths.partition_log_path("t", 0))
    plog.tail()
    storage.peak = 0
    assert offset_for_timestamp(plog, stamps[300], max_skew_ms=60_000) == 300
    assert storage.peak >= 16, storage.peak  # the scan of the 60 entries before 300 is read ahead


def test_read_ahead_returns_slots_in_order_and_raises_at_the_damaged_one() -> None:
    storage = MemoryStorage(uuid.uuid4().hex)
    _history(storage, 20)
    plog = txn_core.Log(storage).partition_log(paths.partition_log_path("t", 0))
    ahead = ReadAhead(plog, 0)
    slots = []
    while True:
        try:
            slots.append(ahead.next().slot)
        except ObjectNotFoundError:
            break
    assert slots == list(range(len(slots))) and len(slots) == 40  # 20 data entries and 20 markers
    key = plog.entries.key(7)
    data = bytearray(storage.read(key))
    data[10] ^= 0xFF  # inside the header
    storage.delete(key)
    storage.create(key, [bytes(data)])
    ahead = ReadAhead(plog, 0)
    got = [ahead.next().slot for _ in range(7)]
    assert got == list(range(7))
    with pytest.raises(CorruptDataError):
        ahead.next()
    with pytest.raises(CorruptDataError):
        ahead.next()  # the position stays on the damaged slot: nothing after it is handed out


# --- the S3 client ------------------------------------------------------------------------------


def test_s3_options_map_to_obstore_or_keep_s3fs(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.aws here
    for name in (
        "AWS_PROFILE",
        "AWS_DEFAULT_PROFILE",
        "AWS_ACCESS_KEY_ID",
        "AWS_SHARED_CREDENTIALS_FILE",
        "AWS_CONFIG_FILE",
    ):
        monkeypatch.delenv(name, raising=False)
    cfg = obstore_config(
        {
            "key": "k",
            "secret": "s",
            "client_kwargs": {"endpoint_url": "http://127.0.0.1:9000", "region_name": "eu-west-1"},
        }
    )
    assert cfg == {
        "config": {
            "access_key_id": "k",
            "secret_access_key": "s",
            "endpoint": "http://127.0.0.1:9000",
            "region": "eu-west-1",
        },
        "client_options": {"allow_http": True},
    }
    assert obstore_config({"anon": True}) == {"config": {"skip_signature": True}, "client_options": {}}
    assert obstore_config({"profile": "analytics"}) is None  # an s3fs-only setting: s3fs serves the URL
    assert obstore_config({"client_kwargs": {"verify": False}}) is None
    assert isinstance(open_storage("s3://b/p", {"key": "k", "secret": "s"}, self_test=False), ObstoreS3Storage)
    assert isinstance(open_storage("s3://b/p", {"profile": "x"}, self_test=False), ObjectStoreStorage)
    assert isinstance(open_storage("s3://b/p", {"client": "fsspec"}, self_test=False), ObjectStoreStorage)
    assert isinstance(open_storage("s3://b/p", None, self_test=False), ObstoreS3Storage)  # instance role, env
    monkeypatch.setenv("AWS_PROFILE", "analytics")  # a profile: botocore reads it, object_store does not
    assert isinstance(open_storage("s3://b/p", None, self_test=False), ObjectStoreStorage)
    assert isinstance(open_storage("s3://b/p", {"key": "k", "secret": "s"}, self_test=False), ObstoreS3Storage)
    monkeypatch.delenv("AWS_PROFILE")
    (tmp_path / ".aws").mkdir()
    (tmp_path / ".aws" / "credentials").write_text("[default]\naws_access_key_id = x\n")
    assert isinstance(open_storage("s3://b/p", None, self_test=False), ObjectStoreStorage)
    with pytest.raises(ConfigurationError, match="client='obstore' cannot be used with the options"):
        open_storage("s3://b/p", {"client": "obstore", "profile": "x"}, self_test=False)
    with pytest.raises(ConfigurationError, match="s3:// and abfs:// URLs only"):
        open_storage("gs://b/p", {"client": "obstore"}, self_test=False)
    with pytest.raises(ConfigurationError, match="is not one of"):
        open_storage("s3://b/p", {"client": "boto"}, self_test=False)
    # A misspelled option gave way to s3fs, which failed at the first request with a TypeError from inside
    # aiobotocore (a user found it): it is refused at once, naming the option meant.
    with pytest.raises(ConfigurationError, match=r"'endpoint' \(did you mean 'endpoint_url'\?\)"):
        open_storage("s3://b/p", {"endpoint": "http://127.0.0.1:9000"}, self_test=False)
    with pytest.raises(ConfigurationError, match="unknown S3 storage option"):
        open_storage("s3://b/p", {"client": "fsspec", "notanoption": 1}, self_test=False)


def test_opening_a_partition_without_transactions_reads_only_its_unsnapshotted_tail() -> None:
    """Idempotent-only data ends no transaction, yet a reader that crossed enough entries leaves a snapshot,
    so the next process's open reads a bounded tail, not every header of the partition."""
    storage = MemoryStorage(uuid.uuid4().hex)
    log = _log(storage)
    p = log.producer()
    for i in range(SNAPSHOT_EVERY_ENTRIES + 200):
        p.send("t", pa.table({"id": [i]}), partition=0)
        p.flush()
    p.close()
    first = txn_core.Log(storage).consumer()
    first.assign([("t", 0)])
    while first.poll().num_rows:
        pass
    counted = InFlight(storage, rtt_s=0)
    fresh = txn_core.Log(counted).consumer()
    fresh.assign([("t", 0)])
    fresh.seek(("t", 0), SNAPSHOT_EVERY_ENTRIES + 150)
    assert fresh.poll().column("id").to_pylist()[:1] == [SNAPSHOT_EVERY_ENTRIES + 150]
    headers = [key for kind, key in counted.keys if kind == "read" and "/log/" in key]
    assert len(headers) < 400, f"{len(headers)} entry reads to open and read the tail"


# --- group commit -------------------------------------------------------------------------------


def test_concurrent_appends_to_one_coordinator_partition_share_records() -> None:
    """Appends of one process that wait while a record is being created go into the next record together
    (group commit): eight producers whose ids share a coordinator partition commit their transactions with
    fewer records than actions, and replay in another process sees every transaction committed."""
    storage = DelayedStorage(MemoryStorage(uuid.uuid4().hex), 0.02)
    log = _log(storage)
    tids = [t for t in (f"g{i}" for i in range(400)) if coordinator_for(t, log.coordinator_partitions) == 3][:8]
    producers = [log.producer(t) for t in tids]
    for p in producers:
        p.init_transactions()
    view = log.coordinator.views.get(3)
    before = view.next_slot

    def work(p: txn_core.Producer, part: int) -> None:
        for _ in range(3):
            p.begin_transaction()
            p.send("t", pa.table({"id": [part]}), partition=part % 4)
            p.commit_transaction()

    threads = [threading.Thread(target=work, args=(p, i)) for i, p in enumerate(producers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for p in producers:
        p.close()
    records = view.next_slot - before
    assert records < 8 * 3 * 2, f"{records} records for {8 * 3} transactions: appends were not grouped"
    fresh = txn_core.Log(storage.inner).coordinator.views.get(3)
    fresh.refresh()
    fresh._check()
    for t in tids:
        st = fresh.state(t)
        assert st is not None and st.state == CoordinatorState.COMPLETE_COMMIT and not st.open_txns()


def test_a_fenced_append_in_a_shared_record_fails_alone() -> None:
    """One append of a group-committed record whose actions are not valid gets its own error; the others
    in the same record commit."""
    from txn_core.coordinator.actions import Begin
    from txn_core.errors import ProducerFencedError

    storage = DelayedStorage(MemoryStorage(uuid.uuid4().hex), 0.05)
    log = _log(storage)
    tids = [t for t in (f"f{i}" for i in range(400)) if coordinator_for(t, log.coordinator_partitions) == 5][:4]
    states = {t: log.coordinator.init_producer(t, 60_000) for t in tids}
    view = log.coordinator.views.get(5)
    results: dict[str, Any] = {}

    def begin(tid: str, epoch_offset: int) -> None:
        st = states[tid]
        try:
            results[tid] = view.append(
                tid, lambda cur: [Begin(tid, st.producer_id, st.epoch + epoch_offset, 60_000, ("topics/t/00000",))]
            )
        except ProducerFencedError as exc:
            results[tid] = exc

    blocker = threading.Thread(target=begin, args=(tids[0], 0))
    blocker.start()  # its record is in flight while the others queue behind it
    time.sleep(0.01)
    others = [threading.Thread(target=begin, args=(t, 7 if t == tids[2] else 0)) for t in tids[1:]]
    for thread in others:
        thread.start()
    for thread in [blocker, *others]:
        thread.join()
    assert isinstance(results[tids[2]], ProducerFencedError)
    for t in (tids[0], tids[1], tids[3]):
        assert results[t].state == CoordinatorState.ONGOING, results[t]
    view._check()


class HeldRecords(MemoryStorage):
    """Holds the create of coordinator records while ``hold`` is clear (set it to let them through)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.hold = threading.Event()
        self.hold.set()
        self.held = threading.Event()  # a create is waiting for ``hold``

    def create(self, key: str, chunks: Any) -> None:
        if "/coordinators/" in key and "/log/" in key and not self.hold.is_set():
            self.held.set()
            self.hold.wait(10)
        super().create(key, chunks)


def test_begins_waiting_together_get_transaction_ids_of_their_own() -> None:
    """Two begins queued behind one record go into one record (group commit) with ids of their own: the
    record's slot and each begin's index in it. Two transactions sharing an id would be one to every reader:
    here the second writer aborts while the first commits, both in the same partition, and the aborted row
    must stay invisible."""
    storage = HeldRecords(uuid.uuid4().hex)
    log = _log(storage)
    tids = [t for t in (f"b{i}" for i in range(400)) if coordinator_for(t, log.coordinator_partitions) == 2][:3]
    producers = [log.producer(t) for t in tids]
    for p in producers:
        p.init_transactions()
    view = log.coordinator.views.get(2)
    txns: dict[int, Any] = {}

    def begin(i: int) -> None:
        producers[i].begin_transaction()
        producers[i].send("t", pa.table({"id": [i]}), partition=0)
        producers[i].flush()
        txns[i] = producers[i].transaction_id

    storage.hold.clear()
    first = threading.Thread(target=begin, args=(0,))
    first.start()
    assert storage.held.wait(10)  # its begin record is held in flight ...
    waiting = [threading.Thread(target=begin, args=(i,)) for i in (1, 2)]
    for t in waiting:
        t.start()
    deadline = time.monotonic() + 10
    while view.queued() < 2 and time.monotonic() < deadline:  # ... while the other two queue behind it
        time.sleep(0.001)
    assert view.queued() == 2
    storage.hold.set()
    for t in [first, *waiting]:
        t.join()
    assert len(set(txns.values())) == 3, txns
    assert txns[1].sequence == txns[2].sequence and {txns[1].index, txns[2].index} == {0, 1}, "one record"
    producers[0].commit_transaction()
    producers[1].abort_transaction()
    producers[2].commit_transaction()
    for p in producers:
        p.close()
    consumer = txn_core.Log(storage).consumer(isolation_level="read_committed")
    consumer.assign([("t", 0)])
    seen: list[int] = []
    for _ in range(3):
        seen += consumer.poll().column("id").to_pylist()
    assert sorted(seen) == [0, 2]
    view._check()
    record = Record.from_json(
        envelope.decode(
            storage.read(view.slots.key(txns[1].sequence)), "", envelope.ObjectKind.COORDINATOR_RECORD
        ).json("")
    )
    assert sorted(a.to_json().get("index", 0) for a in record.actions if isinstance(a, Begin)) == [0, 1], (
        "each begin's index is written in the record, so replay needs no rule of its own to find it"
    )


def _legacy_record(storage: Storage, view: Any, slot: int, *actions: Any) -> None:
    header, payload = envelope.encode_json(
        envelope.ObjectKind.COORDINATOR_RECORD, Record(1_000 + slot, actions).to_json()
    )
    storage.create(view.slots.key(slot), [header, payload])


def _two_initialised() -> tuple[Storage, Any, list[Any]]:
    """A log on memory with two initialised transactional ids of coordinator partition 2: its view, and
    their states in the order of their names."""
    storage = MemoryStorage(uuid.uuid4().hex)
    log = _log(storage)
    tids = [t for t in (f"b{i}" for i in range(400)) if coordinator_for(t, log.coordinator_partitions) == 2][:2]
    for t in tids:
        log.producer(t).init_transactions()
    view = log.coordinator.views.get(2)
    view.refresh()
    states = [view.state(t) for t in sorted(tids)]  # in name order
    assert None not in states
    return storage, view, states


def test_a_record_written_before_indexes_replays_with_its_begins_sharing_one_id() -> None:
    """Group commit before transaction ids had an index wrote records whose begins all got the id (c, slot),
    and the later actions of those transactions name that id. Such a log still replays and its producers
    carry on (read as an index by position, the second begin's transaction would be (c, slot, 1), and the
    record naming (c, slot) for it would be reported as corrupt)."""
    storage, view, (a, b) = _two_initialised()
    slot = view.next_slot
    old = TxnId(2, slot)
    _legacy_record(
        storage,
        view,
        slot,
        Begin(a.tid, a.producer_id, a.epoch, 60_000, ("topics/t/00000",)),
        Begin(b.tid, b.producer_id, b.epoch, 60_000, ("topics/t/00001",)),
    )
    _legacy_record(storage, view, slot + 1, Prepare(b.tid, b.producer_id, b.epoch, old, "COMMIT"))
    fresh = txn_core.Log(storage)
    again = fresh.coordinator.views.get(2)
    again.refresh()
    assert again.state(a.tid).txn == old and again.state(b.tid).txn == old  # type: ignore[union-attr]
    assert again.state(b.tid).state is CoordinatorState.PREPARE_COMMIT  # type: ignore[union-attr]
    status = again.status(old)
    assert status is not None and status.state is CoordinatorState.PREPARE_COMMIT and status.tid == b.tid, (
        "of two transactions sharing the id, the decided one answers: it is completed after its grace"
    )
    for t in (
        a.tid,
        b.tid,
    ):  # each producer's restart ends what it left: a's open one aborted, b's decided one completed
        p = fresh.producer(t)
        p.init_transactions()
        p.close()
    again.refresh()
    assert again.low_watermark() == again.next_slot  # nothing open any more
    again._check()


def test_two_begins_of_one_record_with_the_same_index_are_damage() -> None:
    storage, view, (a, b) = _two_initialised()
    _legacy_record(
        storage,
        view,
        view.next_slot,
        Begin(a.tid, a.producer_id, a.epoch, 60_000, ("topics/t/00000",), index=1),
        Begin(b.tid, b.producer_id, b.epoch, 60_000, ("topics/t/00001",), index=1),
    )
    with pytest.raises(CorruptDataError, match="two begins of one transaction log record have index 1"):
        txn_core.Log(storage).coordinator.views.get(2).refresh()


@pytest.mark.parametrize("text", ["2:5.", "2:5.0", "2:5.16", "2:5.-1", "2:5.x"])
def test_a_transaction_id_has_one_spelling(text: str) -> None:
    with pytest.raises(InvalidNameError, match="invalid transaction id"):
        TxnId.parse(text)
    assert str(TxnId.parse("2:5.3")) == "2:5.3" and str(TxnId.parse("2:5")) == "2:5"


def test_a_consumer_polling_a_steady_stream_reads_each_polls_entries_in_one_round() -> None:
    """ISSUE 34 item 5: at the log end the read-ahead depth falls back to the stream's pace (the entries the
    last poll found, plus one), not to one: a poll that finds the data entry and the marker of one new
    transaction per partition reads them and the slot past them together (it took three rounds: one, one,
    then two slots). A poll after a quiet one still pays one read per partition."""
    inner = MemoryStorage(uuid.uuid4().hex)
    _history(inner, 3)
    storage = InFlight(inner, rtt_s=0.15)  # far longer than issuing a poll's reads takes on a loaded machine
    c = txn_core.Log(storage).consumer()
    c.assign([("t", p) for p in range(4)])
    while c.poll().num_rows:
        pass
    log = _log(MemoryStorage(inner.name))
    p = log.producer("steady")
    p.init_transactions()
    rounds = []
    for i in range(3):
        p.begin_transaction()
        for part in range(4):
            p.send("t", pa.table({"id": [100 + i * 10 + part]}), partition=part)
        p.commit_transaction()
        p.wait_for_completion()
        start = storage.done
        storage.rounds.clear()
        assert sorted(c.poll().column("id").to_pylist()) == [100 + i * 10 + part for part in range(4)]
        for reader in c._readers.values():
            reader.state.snapshots.finals()
        ends = {part: len(inner.list(paths.partition_log_path("t", part) + "/log/")) for part in range(4)}
        # the rounds of the reads of the new entries and of the first free slot (the probes for a hole past
        # it run behind the poll)
        rounds.append(
            max(
                d
                for d, kind, key in storage.rounds
                if kind == "read" and "/log/" in key and int(key[-20:]) <= ends[int(key.split("/")[2])]
            )
            - start
        )
    p.close()
    assert rounds[1:] == [1, 1], rounds  # the first poll after the catch-up learns the pace
    storage.keys.clear()
    assert c.poll().num_rows == 0  # the slot past the last entries is known absent ahead of this poll...
    assert c.poll().num_rows == 0  # ...and after a quiet poll, one read per partition
    storage.keys.clear()
    assert c.poll().num_rows == 0
    assert sorted(k for k, key in storage.keys if "/log/" in key) == ["read"] * 4, storage.keys


def test_a_planned_range_reads_the_entries_its_planner_saw_in_one_round() -> None:
    """ISSUE 34 item 5: a task's range carries its stop slot; the slots below it were seen by the planner,
    so the task reads them all at once (it started at one read and doubled: five rounds for 18 entries)."""
    from txn_core.partition.ranges import available_end, plan_range, read_range
    from txn_core.partition.reader import READ_COMMITTED

    inner = MemoryStorage(uuid.uuid4().hex)
    _history(inner, 9)
    path = paths.partition_log_path("t", 0)
    state = txn_core.Log(inner).partition_state(path, shared=False)
    rng = plan_range(state, "t", 0, 0, available_end(state, READ_COMMITTED), READ_COMMITTED)
    assert rng.stop_slot == 18
    storage = InFlight(inner, rtt_s=0.15)  # far longer than issuing 18 reads takes on a loaded machine
    worker = txn_core.Log(storage).partition_log(path)
    got = [x for b in read_range(worker, rng) for x in b.column("id").to_pylist()]
    assert got == [i * 10 for i in range(9)]
    entry_reads = [d for d, kind, key in storage.rounds if kind == "read" and "/log/" in key]
    # one round, after the format's read
    assert len(entry_reads) == 18 and set(entry_reads) == {2}, [(d, k[-3:]) for d, _, k in storage.rounds]
