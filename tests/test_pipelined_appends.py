"""Pipelined appends (``txn_core.partition.appendchain``): a second append of this process to a partition writes its
bytes while the first is in flight, and becomes visible only after the first landed. Whatever happens to the
first (it lands, loses its slot to another process, fails, the process dies), no slot is ever missing below
a present one and offsets stay dense."""

from __future__ import annotations

import random
import struct
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pytest
from faults import FaultyStorage, SimulatedCrash

from txn_core.clock import system_clock
from txn_core.errors import RetryableStorageError, StorageError
from txn_core.format.entry import EntryKind, crc32, encode_arrow
from txn_core.partition.partition import AppendResult, PartitionLog
from txn_core.storage.base import Chunks, Storage
from txn_core.storage.local import LocalStorage

PATH = "topics/t/00000"


def _append(plog: PartitionLog, n: int) -> AppendResult:
    payload = encode_arrow([pa.record_batch({"id": list(range(n))})], pa.schema([("id", pa.int64())]))
    view = memoryview(payload)
    return plog.append(EntryKind.DATA, [view], len(view), crc32(view), n)


class HeldStorage(LocalStorage):
    """Local disk, where the create of one key waits until released (then does ``then``, once)."""

    def __init__(self, root: Path, held: str, then: Callable[[], object] | None = None) -> None:
        super().__init__(str(root))
        self.held = held
        self.then = then
        self.release = threading.Event()
        self.started: list[str] = []
        self.staged = threading.Event()  # a create other than the held one reached the store

    def _hold(self, key: str) -> None:
        self.started.append(key)
        if key.endswith(self.held):
            assert self.release.wait(10)
            then, self.then = self.then, None  # once: a later create of the key goes through
            if then is not None:
                then()
        else:
            self.staged.set()

    def create(self, key: str, chunks: Chunks) -> None:
        self._hold(key)
        super().create(key, chunks)

    def create_gated(self, key: str, chunks: Chunks, gate: Callable[[], bool]) -> None:
        self._hold(key)
        super().create_gated(key, chunks, gate)


def _second_behind_first(
    pool: ThreadPoolExecutor, storage: HeldStorage, plog: PartitionLog
) -> tuple[Future[AppendResult], Future[AppendResult]]:
    """Start an append of 3 records (held at its create), then one of 2 records, which reaches the store
    behind it."""
    first = pool.submit(_append, plog, 3)
    while not storage.started:
        threading.Event().wait(0.001)
    second = pool.submit(_append, plog, 2)
    assert storage.staged.wait(5), "the second append waited for the first one's create"
    return first, second


def _refuse() -> None:
    raise StorageError("injected: the disk refused the write")


def _slot_name(slot: int) -> str:
    return f"/log/{slot:020d}"


def _check_dense(storage: Storage) -> list[tuple[int, int]]:
    """``(base offset, record count)`` of every entry, read by a fresh log object: no slot missing below the
    tail, each entry beginning where the one before it ends."""
    fresh = PartitionLog(storage, PATH, clock=system_clock)
    slot_end, end = fresh.tail(refresh=True)
    out, expected = [], 0
    for slot in range(slot_end):
        header = fresh.read_header(slot)  # raises for a missing slot below the tail (a hole)
        assert header.base_offset == expected
        out.append((header.base_offset, header.record_count))
        expected = header.next_offset
    assert expected == end
    return out


def test_a_second_append_is_written_while_the_first_is_in_flight_and_shows_after_it(tmp_path: Path) -> None:
    storage = HeldStorage(tmp_path, _slot_name(0))
    plog = PartitionLog(storage, PATH, clock=system_clock)
    with ThreadPoolExecutor(2) as pool:
        # The second append reaches the store (its bytes are being written) while the first one is held...
        first, second = _second_behind_first(pool, storage, plog)
        threading.Event().wait(0.05)
        # ...but is not visible: it links only once the first one landed.
        assert not storage.exists(f"{PATH}/log/{1:020d}")
        assert not second.done()
        storage.release.set()
        a, b = first.result(5), second.result(5)
    assert (a.slot, a.base_offset, b.slot, b.base_offset) == (0, 0, 1, 3)
    assert plog.tail() == (2, 5)
    assert _check_dense(storage) == [(0, 3), (3, 2)]


def test_when_the_first_append_fails_the_second_never_shows_at_its_slot_and_lands_at_the_tail(
    tmp_path: Path,
) -> None:
    storage = HeldStorage(tmp_path, _slot_name(0), then=_refuse)
    plog = PartitionLog(storage, PATH, clock=system_clock)
    with ThreadPoolExecutor(2) as pool:
        first, second = _second_behind_first(pool, storage, plog)
        storage.release.set()
        with pytest.raises(StorageError, match="injected"):
            first.result(5)
        b = second.result(5)
    # The second one was claimed at slot 1 behind the first; the first failed, so it claimed again.
    assert (b.slot, b.base_offset) == (0, 0)
    assert not storage.exists(f"{PATH}/log/{1:020d}")
    assert _check_dense(storage) == [(0, 2)]


def test_when_another_process_takes_the_first_appends_slot_both_move_past_it_with_dense_offsets(
    tmp_path: Path,
) -> None:
    """The first append loses slot 0 to another process's entry of 7 records: the second one, claimed at
    slot 1 with offsets that assumed the first's 3 records, must not land there with them."""
    other = PartitionLog(LocalStorage(str(tmp_path)), PATH, clock=system_clock)
    storage = HeldStorage(tmp_path, _slot_name(0), then=lambda: _append(other, 7))
    plog = PartitionLog(storage, PATH, clock=system_clock)
    with ThreadPoolExecutor(2) as pool:
        first, second = _second_behind_first(pool, storage, plog)
        storage.release.set()
        a, b = first.result(5), second.result(5)
    entries = _check_dense(storage)
    assert entries[0] == (0, 7)
    assert sorted([(a.base_offset, 3), (b.base_offset, 2)]) == entries[1:]


@pytest.mark.parametrize("landed", [False, True])
def test_a_crash_at_the_first_append_leaves_no_slot_missing_below_a_present_one(tmp_path: Path, landed: bool) -> None:
    """The process dies at the first append's create (before or after it reached the store) while the
    second is claimed behind it: the store holds a prefix of the chain, never the second without the first."""
    held = HeldStorage(tmp_path, _slot_name(0))
    faulty = FaultyStorage(held, landed=landed)
    plog = PartitionLog(faulty, PATH, clock=system_clock)
    # The first operation of a fresh log object is the tail search; learn the tail first, then crash at the
    # first create.
    plog.tail()
    faulty.crash_at = len(faulty.ops)
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(_append, plog, 3)
        while not held.started and not faulty.dead:
            threading.Event().wait(0.001)
        second = pool.submit(_append, plog, 2)
        threading.Event().wait(0.05)
        held.release.set()
        for f in (first, second):
            with pytest.raises(SimulatedCrash):
                f.result(5)
    assert _check_dense(LocalStorage(str(tmp_path))) == ([(0, 3)] if landed else [])


def test_many_threads_and_another_process_append_at_once_without_holes_or_duplicates(tmp_path: Path) -> None:
    storage = LocalStorage(str(tmp_path))
    ours, theirs = (
        PartitionLog(storage, PATH, clock=system_clock),
        PartitionLog(LocalStorage(str(tmp_path)), PATH, clock=system_clock),
    )
    sizes = {}

    def work(i: int) -> None:
        for j in range(15):
            n = 1 + (i * 15 + j) % 5
            r = _append(theirs if i == 0 else ours, n)
            sizes[r.base_offset] = n

    with ThreadPoolExecutor(6) as pool:
        list(pool.map(work, range(6)))
    entries = _check_dense(storage)
    assert len(entries) == 90
    assert dict(entries) == sizes


class FlakyStorage(LocalStorage):
    """Local disk refusing about one create in five (before writing anything), and slow on some."""

    def __init__(self, root: Path, seed: int) -> None:
        super().__init__(str(root))
        self.rng = random.Random(seed)
        self.lock = threading.Lock()

    def _maybe_fail(self, key: str) -> None:
        with self.lock:
            roll = self.rng.random()
        if roll < 0.2:
            raise StorageError(f"injected: {key} refused")
        if roll < 0.4:
            threading.Event().wait(0.002)  # a slow create: others claim behind it

    def create(self, key: str, chunks: Chunks) -> None:
        self._maybe_fail(key)
        super().create(key, chunks)

    def create_gated(self, key: str, chunks: Chunks, gate: Callable[[], bool]) -> None:
        self._maybe_fail(key)
        super().create_gated(key, chunks, gate)


@pytest.mark.parametrize("seed", range(4))
def test_failures_anywhere_in_a_chain_lose_no_landed_append_and_show_no_failed_one(tmp_path: Path, seed: int) -> None:
    """Threads of one process append through a store that refuses creates at random while another process
    appends too: every append that returned is in the log once, at the offsets it reported; every one that
    raised is absent; no slot is missing below a present one."""
    ours = PartitionLog(FlakyStorage(tmp_path, seed), PATH, clock=system_clock)
    theirs = PartitionLog(LocalStorage(str(tmp_path)), PATH, clock=system_clock)
    landed: dict[int, int] = {}
    failed = 0
    lock = threading.Lock()

    def work(i: int) -> None:
        nonlocal failed
        for j in range(12):
            n = 1 + (i + j) % 4
            try:
                r = _append(theirs if i == 0 else ours, n)
            except StorageError:
                with lock:
                    failed += 1
                continue
            with lock:
                landed[r.base_offset] = n

    with ThreadPoolExecutor(5) as pool:
        list(pool.map(work, range(5)))
    entries = _check_dense(LocalStorage(str(tmp_path)))
    assert dict(entries) == landed
    assert len(entries) + failed == 60 and failed > 0


class RetryFirstStorage(HeldStorage):
    """:class:`HeldStorage` whose first create of slot 1 is refused with "retry" before anything is sent and
    before its gate is asked (as a store's 503, or the first write's self-test, can)."""

    refused = False

    def create_gated(self, key: str, chunks: Chunks, gate: Callable[[], bool]) -> None:
        if key.endswith(_slot_name(1)) and not self.refused:
            self.refused = True
            self.staged.set()
            raise RetryableStorageError("injected: retry (nothing was sent)")
        super().create_gated(key, chunks, gate)


def test_an_append_refused_before_its_gate_was_asked_still_waits_for_the_one_ahead(tmp_path: Path) -> None:
    """The retry of a pipelined create is gated too: it was not (only the first attempt was), so it linked at
    once, and the append ahead then failed: a hole below a landed append."""

    storage = RetryFirstStorage(tmp_path, _slot_name(0), then=_refuse)
    plog = PartitionLog(storage, PATH, clock=system_clock)
    with ThreadPoolExecutor(2) as pool:
        first, second = _second_behind_first(pool, storage, plog)
        threading.Event().wait(0.2)  # the retry's backoff is over
        assert not storage.exists(f"{PATH}/log/{1:020d}"), "published before the append ahead landed"
        storage.release.set()
        with pytest.raises(StorageError, match="injected"):
            first.result(5)
        b = second.result(5)
    assert storage.refused and (b.slot, b.base_offset) == (0, 0)
    assert _check_dense(storage) == [(0, 2)]


def test_an_append_that_fails_before_its_create_holds_up_no_later_append(tmp_path: Path) -> None:
    """A header that cannot be encoded (a sequence past the 32-bit field) fails its append; it used to leave
    its claim unsettled, and every later append of the process waited for it for ever."""
    plog = PartitionLog(LocalStorage(str(tmp_path)), PATH, clock=system_clock)
    view = memoryview(encode_arrow([pa.record_batch({"id": [1]})], pa.schema([("id", pa.int64())])))
    with pytest.raises(struct.error):
        plog.append(EntryKind.DATA, [view], len(view), crc32(view), 1, producer_id=1, base_sequence=2**31)
    with ThreadPoolExecutor(1) as pool:
        later = pool.submit(_append, plog, 2)
        assert later.result(5).slot == 0
    assert _check_dense(storage=plog.storage) == [(0, 2)]
