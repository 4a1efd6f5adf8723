"""The partition log: dense offsets, concurrent appenders, corruption detection, offset lookup."""

from __future__ import annotations

import multiprocessing as mp
import pickle
import time
import uuid
from typing import Any

import pyarrow as pa
import pytest
import workers

import txn_core
from conftest import PROCESS_BACKENDS
from txn_core.clock import system_clock
from txn_core.errors import CorruptDataError
from txn_core.format import paths
from txn_core.format.entry import HEADER_SIZE, EntryKind, crc32, decode_header, encode_arrow
from txn_core.partition.partition import PartitionLog
from txn_core.storage import MemoryStorage


def _append(plog: PartitionLog, n: int) -> int:
    payload = encode_arrow([pa.record_batch({"id": list(range(n))})], pa.schema([("id", pa.int64())]))
    view = memoryview(payload)
    return plog.append(EntryKind.DATA, [view], len(view), crc32(view), n).base_offset


def test_offsets_are_dense_across_entries_and_markers() -> None:
    plog = PartitionLog(MemoryStorage(uuid.uuid4().hex), "topics/t/00000", clock=system_clock)
    assert _append(plog, 5) == 0
    assert _append(plog, 3) == 5
    marker = b'{"outcome":"COMMIT"}'
    r = plog.append(EntryKind.COMMIT, marker, len(marker), crc32(marker), 1)
    assert r.base_offset == 8  # a control record takes an offset too
    assert _append(plog, 2) == 9
    assert plog.tail() == (4, 11)


def test_a_second_log_object_discovers_the_tail_without_listing() -> None:
    storage = MemoryStorage(uuid.uuid4().hex)
    a = PartitionLog(storage, "topics/t/00000", clock=system_clock)
    for i in range(37):
        _append(a, i + 1)
    b = PartitionLog(storage, "topics/t/00000", clock=system_clock)
    assert b.tail() == a.tail() == (37, sum(range(1, 38)))
    assert _append(b, 4) == sum(range(1, 38))
    assert a.end_offset() == sum(range(1, 38)) + 4  # a follows b's append


def test_a_partition_log_pickles_to_a_fresh_one_of_the_same_log(tmp_path: Any) -> None:
    """What a closure shipped to another process carries: storage, path and clock, and nothing it learned
    (a fresh object learns the tail again, and appends after it)."""
    storage = txn_core.open_log(str(tmp_path)).storage
    plog = PartitionLog(storage, "topics/t/00000", clock=system_clock)
    _append(plog, 3)
    copy = pickle.loads(pickle.dumps(plog))
    assert (copy.path, copy.clock) == (plog.path, plog.clock) and copy is not plog
    assert copy.tail() == plog.tail() == (1, 3)
    assert _append(copy, 2) == 3
    assert plog.tail(refresh=True) == (2, 5)


def test_two_appenders_in_one_process_interleave_without_collisions() -> None:
    storage = MemoryStorage(uuid.uuid4().hex)
    a, b = PartitionLog(storage, "p", clock=system_clock), PartitionLog(storage, "p", clock=system_clock)
    got = [_append(a if i % 3 else b, 2) for i in range(30)]
    assert sorted(got) == list(range(0, 60, 2))


@pytest.mark.parametrize("offset", [0, 1, 4, 5, 17, 44])
def test_slot_for_offset_finds_the_containing_entry(offset: int) -> None:
    storage = MemoryStorage(uuid.uuid4().hex)
    _ = [_append(PartitionLog(storage, "p", clock=system_clock), 5) for _ in range(9)]
    fresh = PartitionLog(storage, "p", clock=system_clock)
    slot = fresh.slot_for_offset(offset)
    h = fresh.read_header(slot)
    assert h.base_offset <= offset < h.next_offset


def test_slot_for_offset_out_of_range() -> None:
    plog = PartitionLog(MemoryStorage(uuid.uuid4().hex), "p", clock=system_clock)
    _append(plog, 3)
    assert plog.slot_for_offset(3) == 1  # the end maps to the next free slot
    with pytest.raises(txn_core.OffsetOutOfRangeError):
        plog.slot_for_offset(4)


@pytest.mark.parametrize("shared_location", PROCESS_BACKENDS, indirect=True)
def test_multiprocess_appenders_never_collide_or_lose_an_append(shared_location: Any) -> None:
    log = shared_location.open()
    log.create_topic("mp", 1, pa.schema([("id", pa.int64()), ("worker", pa.int64())]))
    ctx = mp.get_context("spawn")
    start_at = time.time() + 3.0
    workers_n, batches, rows = 4, 12, 7
    with ctx.Pool(workers_n) as pool:
        results = pool.starmap(
            workers.append_rows,
            [
                (shared_location.url, shared_location.storage_options, "mp", w, batches, rows, start_at)
                for w in range(workers_n)
            ],
        )
    ranges = sorted(r for res in results for r in res)
    assert len(ranges) == workers_n * batches
    expected = 0
    for base, count in ranges:  # contiguous, disjoint, no gaps
        assert base == expected
        expected += count
    c = log.consumer()
    c.assign([("mp", 0)])
    table = c.poll()
    ids = table.column("id").to_pylist()
    assert len(ids) == len(set(ids)) == workers_n * batches * rows
    assert table.column("_offset").to_pylist() == list(range(expected))
    for w in range(workers_n):  # each producer's entries keep their order
        own = [i for i in ids if i // 1_000_000 == w]
        assert own == sorted(own)


# --- corruption ---------------------------------------------------------------------------------


def _log_with_entries(n: int) -> tuple[txn_core.Log, MemoryStorage]:
    storage = MemoryStorage(uuid.uuid4().hex)
    log = txn_core.Log(storage)
    log.create_topic("c", 1, pa.schema([("id", pa.int64())]))
    p = log.producer()
    for i in range(n):
        p.send("c", pa.table({"id": [i]}), partition=0)
        p.flush()
    return log, storage


def _damage(storage: MemoryStorage, key: str, data: bytes) -> None:
    storage.delete(key)
    storage.create(key, [data])


def _consume(log: txn_core.Log) -> list[int]:
    c = log.consumer()
    c.assign([("c", 0)])
    out: list[int] = []
    while True:
        got = c.poll().column("id").to_pylist()
        if not got:
            return out
        out.extend(got)


@pytest.mark.parametrize("damage", ["flip-payload", "flip-header", "truncate", "truncate-header", "foreign"])
def test_damaged_entry_raises_corrupt_data_naming_the_object(damage: str) -> None:
    _log, storage = _log_with_entries(4)
    key = paths.entries(paths.partition_log_path("c", 0)) + paths.slot_name(2)
    data = bytearray(storage.read(key))
    if damage == "flip-payload":
        data[-5] ^= 0xFF
    elif damage == "flip-header":
        data[14] ^= 0x01
    elif damage == "truncate":
        data = data[:-10]
    elif damage == "truncate-header":
        data = data[: HEADER_SIZE // 2]
    else:
        data = bytearray(b"PK\x03\x04 this is a zip file, not an entry" * 5)
    _damage(storage, key, bytes(data))
    fresh = txn_core.Log(storage)
    with pytest.raises(CorruptDataError) as info:
        _consume(fresh)
    assert key in str(info.value)
    # Nothing after it is silently skipped: entries 0 and 1 are fine, but the read stops at 2.
    c = txn_core.Log(storage).consumer()
    c.assign([("c", 0)])
    with pytest.raises(CorruptDataError):
        while c.poll(max_records=1).num_rows:
            pass
    assert c.position(("c", 0)) == 2


def test_header_decoder_rejects_unknown_versions() -> None:
    _log, storage = _log_with_entries(1)
    key = paths.entries(paths.partition_log_path("c", 0)) + paths.slot_name(0)
    data = bytearray(storage.read(key))
    data[4] = 9  # version
    import struct

    from txn_core.format.checksum import crc32c

    data[124:128] = struct.pack("<I", crc32c(bytes(data[:124])))
    with pytest.raises(CorruptDataError, match="version 9"):
        decode_header(bytes(data), key)


def test_a_long_lived_process_remembers_a_bounded_number_of_entries(monkeypatch: pytest.MonkeyPatch) -> None:
    from txn_core.partition import partition as partition_module

    monkeypatch.setattr(partition_module, "INDEX_MAX_ENTRIES", 8)
    log = txn_core.open_log(f"memory://{uuid.uuid4().hex}")
    log.create_topic("t", 1, pa.schema([("id", pa.int64())]))
    p = log.producer()
    for i in range(40):
        p.send("t", pa.table({"id": [i, i]}), partition=0)
        p.flush()
    plog = log.partition_log("topics/t/00000")
    assert len(plog._index) <= 8
    # Forgotten entries are found again by bisecting headers; remembered ones directly.
    assert [plog.slot_for_offset(o) for o in range(0, 80, 2)] == list(range(40))
    assert len(plog._index) <= 8
