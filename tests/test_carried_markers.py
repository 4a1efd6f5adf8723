"""Markers carried by the producer's next entries (PROTOCOL.md "Carried markers",
``txn_core.clients.producer.carried``): the header form and old readers refusing it, the buffer's rules,
the writers' offers, lingers and failures, and every reader agreeing on a log whose markers travel in data
entries. The crash windows are tests/test_crash_points.py's
(``test_every_crash_point_of_markers_carried_by_the_next_entries_recovers_both``)."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from test_cli import txnlog_inprocess

import txn_core
from txn_core.clients.producer import client, completion
from txn_core.clock import system_clock
from txn_core.errors import CommitFailedError, ConfigurationError, CorruptDataError, StorageError
from txn_core.format import entry as entry_format
from txn_core.format import paths
from txn_core.format.checksum import crc32c
from txn_core.format.entry import CarriedMarker, EntryHeader, EntryKind, decode_header
from txn_core.format.ids import TxnId
from txn_core.ops import maintenance
from txn_core.ops.rolling import RollPolicy
from txn_core.partition.buffer import Disposition, TxnBuffer
from txn_core.partition.ranges import available_end, plan_range, read_range
from txn_core.partition.reader import READ_COMMITTED
from txn_core.partition.snapshots import SnapshotStore
from txn_core.storage import MemoryStorage, Storage
from txn_core.storage.base import Chunks, DelegatingStorage

SCHEMA = pa.schema([("id", pa.int64())])
PARTITIONS = 4


class CountingCreates(DelegatingStorage):
    """Counts the creates of partition-log entries; fails the next ``fail`` of them under ``fail_under``
    (before they land)."""

    def __init__(self, inner: Storage) -> None:
        super().__init__(inner)
        self.creates: dict[str, int] = {}
        self.fail = 0
        self.fail_under = "topics/"

    def create(self, key: str, chunks: Chunks) -> None:
        if key.startswith("topics/") and "/log/" in key:
            if self.fail and key.startswith(self.fail_under):
                self.fail -= 1
                raise StorageError(f"injected: create of {key} failed")
            self.creates[key] = self.creates.get(key, 0) + 1
        self.inner.create(key, chunks)


def _log(storage: Storage | None = None) -> txn_core.Log:
    log = txn_core.Log(storage or MemoryStorage(f"carried-{uuid.uuid4().hex}"))
    log.create_topic("t", PARTITIONS, SCHEMA)
    return log


def _stream(p: txn_core.Producer, first: int, txns: int, *, rows: int = 8) -> list[int]:
    """``txns`` transactions of ``rows`` records over every partition; the ids committed."""
    ids = []
    for n in range(txns):
        p.begin_transaction()
        batch = list(range(first + n * rows, first + (n + 1) * rows))
        p.send("t", pa.table({"id": batch}), key_column="id")
        p.commit_transaction()
        ids += batch
    return ids


def _headers(log: txn_core.Log, partition: int) -> list[EntryHeader]:
    plog = log.partition_log(paths.partition_log_path("t", partition))
    start = plog.log_start(refresh=True).slot
    return [plog.read_header(s) for s in range(start, plog.tail(refresh=True)[0])]


def _markers(log: txn_core.Log) -> tuple[int, int]:
    """(carried, alone) markers in topic ``t``."""
    headers = [h for part in range(PARTITIONS) for h in _headers(log, part)]
    return sum(h.carried is not None for h in headers), sum(h.is_control for h in headers)


def _marker_txns(log: txn_core.Log) -> set[tuple[int, TxnId | None]]:
    """(partition, transaction) of every marker in topic ``t``, carried or alone."""
    return {
        (part, h.txn if h.is_control else h.carried.txn if h.carried else None)
        for part in range(PARTITIONS)
        for h in _headers(log, part)
        if h.is_control or h.carried is not None
    }


def _assert_settled(log: txn_core.Log) -> None:
    """Nothing holds any partition's last stable offset."""
    for part in log.describe_topic("t").partitions:
        assert part.last_stable_offset == part.log_end_offset, part


def _read(log: txn_core.Log, isolation: str = "read_committed") -> list[int]:
    c = log.consumer(isolation_level=isolation)
    c.assign([("t", p) for p in range(PARTITIONS)])
    out: list[int] = []
    while (got := c.poll()).num_rows:
        out += got.column("id").to_pylist()
    c.close()
    return sorted(out)


def _ranges(log: txn_core.Log) -> list[int]:
    """Every partition read as a Spark batch task does: a planned range, then read_range."""
    out: list[int] = []
    for part in range(PARTITIONS):
        path = paths.partition_log_path("t", part)
        state = txn_core.Log(log.storage).partition_state(path, shared=False)
        rng = plan_range(state, "t", part, 0, available_end(state, READ_COMMITTED), READ_COMMITTED)
        worker = txn_core.Log(log.storage).partition_log(path)
        out += [i for b in read_range(worker, rng) for i in b.column("id").to_pylist()]
    return sorted(out)


# --- the steady stream ---------------------------------------------------------------------------------


@pytest.mark.parametrize("linger_ms", [None, 0], ids=["carried", "alone"])
def test_a_steady_stream_writes_about_one_create_per_partition_per_transaction(linger_ms: int | None) -> None:
    """ISSUE 34 item 3: a marker travels in the next entry the producer writes to that partition; Kafka
    writes one marker entry per partition per transaction, two creates in all with the data."""
    storage = CountingCreates(MemoryStorage(f"carried-{uuid.uuid4().hex}"))
    log = _log(storage)
    p = log.producer("stream", marker_linger_ms=linger_ms)
    p.init_transactions()
    ids = _stream(p, 0, 20, rows=16)
    p.close()
    per = sum(storage.creates.values()) / (20 * PARTITIONS)
    carried, alone = _markers(log)
    if linger_ms == 0:
        assert (carried, alone, per) == (0, 20 * PARTITIONS, 2.0)
    else:
        # the last transaction's markers have no next entry: alone, at close
        assert (carried, alone) == (19 * PARTITIONS, PARTITIONS) and per <= 1.3, (carried, alone, per)
    assert _read(log) == ids == _ranges(log)
    _assert_settled(log)


def test_markers_nobody_carries_are_written_alone_after_the_linger() -> None:
    log = _log()
    p = log.producer("idle", marker_linger_ms=1000)
    p.init_transactions()
    ids = _stream(p, 0, 1)
    assert _markers(log) == (0, 0), "within the linger: offered, not written"
    assert _read(log) == ids, "visible from the decision, markers or not"
    deadline = time.monotonic() + 10
    while _markers(log) != (0, PARTITIONS) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _markers(log) == (0, PARTITIONS)
    deadline = time.monotonic() + 10  # then the Complete, after its own linger
    while (st := log.coordinator.state("idle")) is not None and not st.state.is_complete:
        assert time.monotonic() < deadline, st
        time.sleep(0.02)
    p.close()


def test_wait_for_markers_and_close_write_the_offered_markers_at_once() -> None:
    log = _log()
    p = log.producer("forced", marker_linger_ms=1000)
    p.init_transactions()
    _stream(p, 0, 1)
    started = time.monotonic()
    p.wait_for_markers()
    assert _markers(log) == (0, PARTITIONS) and time.monotonic() - started < 0.9
    _stream(p, 100, 1)
    p.close()
    assert _markers(log) == (0, 2 * PARTITIONS), "the close wrote the second transaction's markers alone"
    st = log.coordinator.state("forced")
    assert st is not None and st.state.is_complete


def test_a_commit_never_waits_for_the_linger_of_markers_its_entries_do_not_carry() -> None:
    """The next transaction writes to one partition: the previous transaction's other markers are written
    alone beside its entries by the commit's flush, not after the linger."""
    log = _log()
    p = log.producer("narrow", marker_linger_ms=1000)
    p.init_transactions()
    ids = _stream(p, 0, 1)
    p.begin_transaction()
    p.send("t", pa.table({"id": [500]}), partition=2)
    started = time.monotonic()
    p.commit_transaction()
    assert time.monotonic() - started < 0.9, "waited for the linger"
    assert _markers(log) == (1, PARTITIONS - 1)
    p.close()
    assert _read(log) == sorted([*ids, 500])


def test_only_topic_partitions_carry_markers_group_offsets_get_theirs_alone() -> None:
    log = _log()
    p = log.producer("offsets")
    p.init_transactions()
    for n in range(3):
        p.begin_transaction()
        p.send("t", pa.table({"id": [n]}), partition=0)
        p.send_offsets_to_transaction({("src", 0): n + 1}, "grp")
        p.commit_transaction()
    p.close()
    group = log.partition_log(paths.group_log_path("grp"))
    headers = [group.read_header(s) for s in range(group.tail(refresh=True)[0])]
    assert not any(h.carried for h in headers) and sum(h.is_control for h in headers) == 3
    assert sum(h.carried is not None for h in _headers(log, 0)) == 2
    c = log.consumer("grp")
    assert c.committed(("src", 0)) == 3


def test_a_carrier_that_fails_leaves_its_marker_to_a_lone_write_and_the_retried_commit_lands() -> None:
    storage = CountingCreates(MemoryStorage(f"carried-{uuid.uuid4().hex}"))
    log = _log(storage)
    p = log.producer("failing", marker_linger_ms=1000)
    p.init_transactions()
    first = _stream(p, 0, 1)
    t1 = log.coordinator.state("failing").txn  # type: ignore[union-attr]
    p.begin_transaction()
    p.send("t", pa.table({"id": [100]}), partition=0)
    storage.fail, storage.fail_under = 1, "topics/t/00000/"  # the carrier of the first one's marker there
    with pytest.raises(CommitFailedError):
        p.commit_transaction()
    t2 = p.transaction_id
    p.commit_transaction()  # resumes the writes: the carrier again, and its marker alone
    p.close()
    assert _read(log) == sorted([*first, 100]) == _ranges(log)
    assert _marker_txns(log) == {*((part, t1) for part in range(PARTITIONS)), (0, t2)}
    assert _markers(log) == (1, PARTITIONS + 1), "partition 0: the retried carrier and the lone write"
    _assert_settled(log)


def _finishes(action: Any, within_s: float = 20.0) -> None:
    """Run ``action`` on a thread; it must return (or raise) within ``within_s``, else the test fails."""
    done = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            action()
        except BaseException as exc:
            errors.append(exc)
        finally:
            done.set()

    threading.Thread(target=run, daemon=True).start()
    assert done.wait(within_s), f"{action} still blocked after {within_s} s"
    if errors:
        raise errors[0]


def test_a_commit_whose_record_finishes_an_earlier_failed_completion_does_not_hang() -> None:
    """The earlier transaction's lone marker failed after its linger; the next commit registers a partition
    the earlier one did not write, and that record's claim finishes the earlier transaction, writing its
    markers alone: it must not wait for markers its own flush would only write later."""
    storage = CountingCreates(MemoryStorage(f"carried-{uuid.uuid4().hex}"))
    log = _log(storage)
    p = log.producer("stalled", marker_linger_ms=50)
    p.init_transactions()
    p.begin_transaction()
    p.send("t", pa.table({"id": [1]}), partition=0)
    p.commit_transaction()
    storage.fail, storage.fail_under = 1, "topics/t/00000/"  # its lone marker, once the linger is over
    deadline = time.monotonic() + 10
    while storage.fail and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not storage.fail, "the lone write was attempted"
    p.begin_transaction()
    p.send("t", pa.table({"id": [2]}), partition=1)
    _finishes(p.commit_transaction)
    _finishes(p.close)
    assert _read(log) == [1, 2]
    _assert_settled(log)


def test_an_entry_that_fails_to_encode_leaves_no_marker_held(monkeypatch: pytest.MonkeyPatch) -> None:
    from txn_core.clients.producer import accumulator

    log = _log()
    p = log.producer("encoding", marker_linger_ms=1000)
    p.init_transactions()
    first = _stream(p, 0, 1)

    def boom(batches: Any, schema: Any) -> Any:
        raise MemoryError("injected: encoding failed")

    p.begin_transaction()
    p.send("t", pa.table({"id": [100]}), partition=0)
    with monkeypatch.context() as m:
        m.setattr(accumulator.Payload, "of_arrow", boom)  # type: ignore[attr-defined]
        with pytest.raises(MemoryError):
            p.flush()
    _finishes(p.abort_transaction)
    _finishes(p.close)
    assert _read(log) == first
    _assert_settled(log)


def test_an_aborted_carrier_still_ends_the_transaction_it_carries_the_marker_of() -> None:
    log = _log()
    p = log.producer("aborts", marker_linger_ms=1000)
    p.init_transactions()
    first = _stream(p, 0, 1)
    p.begin_transaction()
    p.send("t", pa.table({"id": list(range(100, 108))}), key_column="id")
    p.flush()  # the entries carrying the first transaction's markers land
    p.abort_transaction()
    aborted_first = log.coordinator.state("aborts")
    p.begin_transaction()  # and an aborted transaction's markers travel too
    p.send("t", pa.table({"id": list(range(200, 208))}), key_column="id")
    p.commit_transaction()
    p.close()
    assert aborted_first is not None
    assert _read(log) == sorted([*first, *range(200, 208)]) == _ranges(log)
    assert _read(log, "read_uncommitted") == sorted([*first, *range(100, 108), *range(200, 208)])
    kinds = {h.carried.kind for part in range(PARTITIONS) for h in _headers(log, part) if h.carried is not None}
    assert kinds == {EntryKind.COMMIT, EntryKind.ABORT}


def test_on_local_disk_an_overlapped_begin_whose_entries_carry_markers_does_not_deadlock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without begin ahead every transaction's first entries are staged behind its begin record (local
    disk); those entries carry the previous transaction's markers, which that begin must not wait for."""
    monkeypatch.setattr(client, "BEGIN_AHEAD", False)
    monkeypatch.setattr(completion, "FAST_RECORD_S", 0.0)
    log = txn_core.open_log(str(tmp_path / "log"))
    log.create_topic("t", PARTITIONS, SCHEMA)
    p = log.producer("overlap", marker_linger_ms=1000)
    p.init_transactions()
    started = time.monotonic()
    ids = _stream(p, 0, 4)
    assert time.monotonic() - started < 30
    p.close()
    assert _read(log) == ids
    assert _markers(log)[0] >= PARTITIONS, "the entries carried markers"


# --- every reader agrees --------------------------------------------------------------------------------


def test_every_reader_agrees_on_a_log_of_carried_markers_loose_and_rolled(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    import json

    url = str(tmp_path / "log")
    log = txn_core.open_log(url)
    log.create_topic("t", PARTITIONS, SCHEMA)
    p = log.producer("mixed")
    p.init_transactions()
    committed: list[int] = []
    for n in range(12):
        p.begin_transaction()
        batch = list(range(n * 10, n * 10 + 6))
        p.send("t", pa.table({"id": batch}), key_column="id")
        if n % 3 == 1:
            p.flush()
            p.abort_transaction()
        else:
            p.commit_transaction()
            committed += batch
    p.close()
    assert _markers(log)[0] > 0
    expected = sorted(committed)
    assert _read(log) == expected == _ranges(log)
    dumped = txnlog_inprocess(capsys, "dump", url, "t", "--isolation", "read_uncommitted", "--show-control", "--json")
    assert dumped.code == 0, dumped.err
    rows = [json.loads(line) for line in dumped.out.splitlines()]
    carried, alone = _markers(log)
    assert sum(r["_kind"] in ("COMMIT", "ABORT") for r in rows) == carried + alone
    at = {(r["_partition"], r["_offset"]) for r in rows if r["_kind"] in ("COMMIT", "ABORT")}
    shared = [r for r in rows if r["_kind"] == "data" and (r["_partition"], r["_offset"]) in at]
    assert len(shared) == carried, "a carried marker shows at its carrier's first offset, before its rows"
    assert sorted(r["id"] for r in rows if r["_kind"] == "data") == _read(log, "read_uncommitted")
    maintenance.roll_segments(log, "t", policy=RollPolicy(entries=1, bytes=1), min_age_ms=0, check_min_age=False)
    fresh = txn_core.open_log(url)
    assert all(fresh.storage.list(paths.segments(paths.partition_log_path("t", part))) for part in range(PARTITIONS))
    assert _read(fresh) == expected == _ranges(fresh)
    assert _markers(fresh) == _markers(log)


# --- the buffer's rules ---------------------------------------------------------------------------------

T1 = TxnId(1, 1)
T2 = TxnId(1, 2)


def _data(base: int, count: int, txn: TxnId | None, *, epoch: int = 0, seq: int = 0, **kw: Any) -> EntryHeader:
    return EntryHeader(EntryKind.DATA, base, count, 7, epoch, seq, txn, 0, 0, 0, b"\0" * 16, kw.get("carried"))


def test_the_buffer_applies_a_carried_marker_before_the_entry_at_its_base_offset() -> None:
    b = TxnBuffer()
    assert b.apply(0, _data(0, 3, T1), 128) is Disposition.TXN_DATA
    assert b.max_read_position == 0
    carrier = _data(3, 2, T2, epoch=1, carried=CarriedMarker(False, T1, 0))
    assert b.apply(1, carrier, 128) is Disposition.TXN_DATA
    assert b.outcome(T1) is False and b.aborted.get(T1).marker_offset == 3  # type: ignore[union-attr]
    assert (b.aborted.get(T1).first_offset, b.aborted.get(T1).last_offset) == (0, 2)  # type: ignore[union-attr]
    assert b.max_read_position == 3, "T2 now holds the bound, from the carrier's first record"
    again = _data(5, 1, T2, epoch=1, seq=2, carried=CarriedMarker(False, T1, 0))  # a repeated marker
    assert b.apply(2, again, 128) is Disposition.TXN_DATA and b.aborted_count == 1
    b._check()


def test_a_fenced_or_duplicate_carrier_s_marker_still_counts() -> None:
    b = TxnBuffer()
    b.apply(0, _data(0, 2, T1, epoch=5), 128)
    b.apply(1, _data(2, 1, None, epoch=6, seq=0), 128)  # the producer moved to epoch 6
    fenced = _data(3, 1, T2, epoch=5, seq=2, carried=CarriedMarker(True, T1, 5))
    assert b.apply(2, fenced, 128) is Disposition.SKIP
    assert b.outcome(T1) is True and T1 not in b.by_txn
    b._check()


def test_snapshot_and_replay_of_carried_markers_equal_a_full_replay() -> None:
    storage = MemoryStorage(f"carried-{uuid.uuid4().hex}")
    store = SnapshotStore(storage, "topics/t/00000", clock=system_clock)
    headers = [
        _data(0, 2, T1),
        _data(2, 2, T2, epoch=1, seq=0, carried=CarriedMarker(True, T1, 0)),
        _data(4, 1, TxnId(1, 3), epoch=2, seq=0, carried=CarriedMarker(False, T2, 1)),
    ]
    full = TxnBuffer()
    for slot, h in enumerate(headers):
        full.apply(slot, h, 128)
    for cut in range(1, len(headers)):
        half = TxnBuffer()
        for slot, h in enumerate(headers[:cut]):
            half.apply(slot, h, 128)
        restored = store.load(store.write(half))
        for slot, h in enumerate(headers[cut:], cut):
            restored.apply(slot, h, 128)
        assert restored.ended == full.ended and restored.aborted.to_table() == full.aborted.to_table()
        assert restored.max_read_position == full.max_read_position == 4


# --- the format -----------------------------------------------------------------------------------------


def test_a_carrier_header_round_trips_and_old_readers_refuse_it(monkeypatch: pytest.MonkeyPatch) -> None:
    h = _data(10, 4, T2, carried=CarriedMarker(True, TxnId(3, 99, 2), 41))
    raw = h.encode()
    assert raw[4] == 2, "a carrier is entry format version 2"
    assert decode_header(raw, "k") == h
    plain = _data(10, 4, T2)
    assert plain.encode()[4] == 1 and decode_header(plain.encode(), "k").carried is None
    monkeypatch.setattr(entry_format, "VERSIONS", (entry_format.VERSION,))  # a reader of version 1 only
    with pytest.raises(CorruptDataError, match=r"entry format version 2 .* upgrade txnlog"):
        decode_header(raw, "topics/t/00000/log/00000000000000000001")
    assert decode_header(plain.encode(), "k") == plain


def test_a_version_2_header_that_is_not_a_data_entry_carrying_a_marker_is_corrupt() -> None:
    marker = EntryHeader(EntryKind.COMMIT, 0, 1, 7, 0, -1, T1, 0, 0, 0, b"\0" * 16, CarriedMarker(True, T2, 0))
    with pytest.raises(CorruptDataError, match="only data entries carry COMMIT or ABORT markers"):
        decode_header(marker.encode(), "k")


def test_a_carried_marker_with_stray_bytes_is_corrupt_and_control_entries_carry_none() -> None:
    raw = bytearray(_data(0, 1, T2, carried=CarriedMarker(True, T1, 0)).encode())
    raw[93] = 1  # padding after the marker's kind
    body = bytes(raw[:124])
    raw[124:128] = crc32c(body).to_bytes(4, "little")
    with pytest.raises(CorruptDataError, match="non-zero padding"):
        decode_header(bytes(raw), "k")
    plog = _log().partition_log(paths.partition_log_path("t", 0))
    with pytest.raises(ConfigurationError, match="a COMMIT entry carries no marker"):
        plog.append(EntryKind.COMMIT, b"{}", 2, 0, 1, txn=T1, carried=CarriedMarker(True, T2, 0))
