"""Where a producer writes its markers and its begin (``txn_core.clients.producer.completion``, PROTOCOL.md
"Transactions"): on its own thread where its records are cheaper than a hand-off to another thread
(``FAST_RECORD_S``), in the background (markers) and overlapped with the first entries (begin) where they
cost a round trip. Either way the decision is durable before the markers, and the Complete record is
carried by the producer's next record or written alone after the linger."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from test_overlapped_begin import _record_overlaps

import txn_core
from txn_core.clients.producer import carried, completion
from txn_core.errors import StorageError
from txn_core.format.entry import EntryKind
from txn_core.format.states import CoordinatorState
from txn_core.storage import MemoryStorage, Storage
from txn_core.storage.base import Chunks, DelegatingStorage

SCHEMA = pa.schema([("id", pa.int64())])


class SlowRecords(DelegatingStorage):
    """A memory store whose coordinator records take ``delay_s`` each (a disk with a slow fsync, a store
    with a round trip); everything else is as fast as memory."""

    def __init__(self, inner: Storage, delay_s: float) -> None:
        super().__init__(inner)
        self.delay_s = delay_s

    def create(self, key: str, chunks: Chunks) -> None:
        if "/coordinators/" in key:
            time.sleep(self.delay_s)
        self.inner.create(key, chunks)


@pytest.fixture(autouse=True)
def _markers_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """Markers written alone at once (``marker_linger_ms=0``): these tests are about the threads and the
    records that write them; markers carried by the next entries are tests/test_carried_markers.py's."""
    monkeypatch.setattr(carried, "MARKER_LINGER_S", 0.0)


@pytest.fixture
def fast(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every record counts as fast: the committing thread writes the markers and the begin."""
    monkeypatch.setattr(completion, "FAST_RECORD_S", 1.0)


def _memory_log(slow_s: float = 0.0) -> txn_core.Log:
    inner: Storage = MemoryStorage(f"fast-records-{uuid.uuid4().hex}")
    log = txn_core.Log(SlowRecords(inner, slow_s) if slow_s else inner)
    log.create_topic("t", 2, SCHEMA)
    return log


def _ids(log: txn_core.Log) -> list[int]:
    c = log.consumer()
    c.assign([("t", 0), ("t", 1)])
    out: list[int] = []
    while (got := c.poll()).num_rows:
        out.extend(got.column("id").to_pylist())
    return sorted(out)


def _marker_threads(
    log: txn_core.Log, monkeypatch: pytest.MonkeyPatch, hold: threading.Event | None = None
) -> list[str]:
    """The names of the threads that write markers (each call), holding each call until ``hold`` is set."""
    threads: list[str] = []
    original: Callable[..., None] = log.coordinator.write_markers

    def spy(prepared: Any, paths: Any = None) -> None:
        threads.append(threading.current_thread().name)
        if hold is not None:
            assert hold.wait(30)
        original(prepared, paths)

    monkeypatch.setattr(log.coordinator, "write_markers", spy)
    return threads


def _unmarked(log: txn_core.Log) -> list[int]:
    """The partitions whose last entry is not a marker (their last transaction's marker is not written)."""
    out = []
    for partition in range(2):
        path = f"topics/t/{partition:05d}"
        slots = log.storage.list(f"{path}/log/")
        if slots and log.partition_log(path).read_header(len(slots) - 1).kind not in (
            EntryKind.COMMIT,
            EntryKind.ABORT,
        ):
            out.append(partition)
    return out


def test_fast_records_write_the_markers_before_commit_returns(monkeypatch: pytest.MonkeyPatch, fast: None) -> None:
    log = _memory_log()
    threads = _marker_threads(log, monkeypatch)
    p = log.producer("fast")
    p.init_transactions()
    for i in range(3):
        p.begin_transaction()
        p.send("t", pa.table({"id": [i, 10 + i]}), key_column="id")
        p.commit_transaction()
        assert threads == [threading.current_thread().name] * (i + 1)
        assert _unmarked(log) == [], "commit returned before its markers"
    p.close()
    assert _ids(log) == [0, 1, 2, 10, 11, 12]


def test_slow_records_leave_the_markers_to_the_background(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the default threshold and records of 5 ms, commit_transaction returns at the decision while
    the markers are still held back."""
    log = _memory_log(slow_s=0.005)
    hold = threading.Event()
    threads = _marker_threads(log, monkeypatch, hold)
    p = log.producer("slow")
    p.init_transactions()
    for i in range(2):
        p.begin_transaction()
        p.send("t", pa.table({"id": [i]}), partition=0)
        p.commit_transaction()  # returns although the markers are held
        assert _unmarked(log) == [0]
        hold.set()
        p.wait_for_markers()
        hold.clear()
    assert threads and all(name.startswith("txnlog-completer") for name in threads)
    hold.set()
    p.close()
    assert _ids(log) == [0, 1]


def test_a_marker_write_failing_on_the_committing_thread_is_retried_in_the_background(
    monkeypatch: pytest.MonkeyPatch, fast: None
) -> None:
    """The decision is durable, so commit_transaction does not fail; the markers are written again."""
    log = _memory_log()
    original = log.coordinator.write_markers
    calls: list[str] = []

    def fail_first(prepared: Any, paths: Any = None) -> None:
        calls.append(threading.current_thread().name)
        if len(calls) == 1:
            raise StorageError("injected: marker write failed")
        original(prepared, paths)

    monkeypatch.setattr(log.coordinator, "write_markers", fail_first)
    p = log.producer("retried")
    p.init_transactions()
    p.begin_transaction()
    p.send("t", pa.table({"id": [1, 2]}), key_column="id")
    p.commit_transaction()
    p.wait_for_markers()
    assert calls[0] == threading.current_thread().name and calls[1].startswith("txnlog-completer")
    assert _unmarked(log) == []
    p.close()
    assert _ids(log) == [1, 2]


def test_an_idle_producer_s_complete_is_written_alone_after_the_linger(fast: None) -> None:
    """Markers written on the committing thread: no later record of the producer comes, so the watcher
    writes the Complete alone; the watcher then stops, and starts again for the next transaction."""
    log = _memory_log()
    p = log.producer("idle")
    p.init_transactions()
    for i in range(2):
        p.begin_transaction()
        p.send("t", pa.table({"id": [i]}), partition=0)
        p.commit_transaction()
        deadline = time.monotonic() + 10
        while (st := log.coordinator.state("idle")) is None or st.state != CoordinatorState.COMPLETE_COMMIT:
            assert time.monotonic() < deadline, f"never completed: {st}"
            time.sleep(0.02)
        assert time.monotonic() - (deadline - 10) >= completion.COMPLETE_LINGER_S * 0.9  # not before the linger
        deadline = time.monotonic() + 10
        while p._completions._watching:
            assert time.monotonic() < deadline, "the watcher did not stop"
            time.sleep(0.02)
    p.close()
    assert _ids(log) == [0, 1]


def test_close_right_after_a_commit_completes_it_without_waiting_for_the_linger(fast: None) -> None:
    log = _memory_log()
    p = log.producer("closing")
    p.init_transactions()
    p.begin_transaction()
    p.send("t", pa.table({"id": [5]}), partition=1)
    p.commit_transaction()
    started = time.monotonic()
    p.close()
    assert time.monotonic() - started < completion.COMPLETE_LINGER_S
    st = log.coordinator.state("closing")
    assert st is not None and st.state == CoordinatorState.COMPLETE_COMMIT


def test_back_to_back_fast_transactions_fold_each_complete_into_the_next_record(
    monkeypatch: pytest.MonkeyPatch, fast: None
) -> None:
    """Markers written on the committing thread are durable before the next begin: it carries their
    Complete, and no Complete is written alone."""
    log = _memory_log()
    alone: list[Any] = []
    original = log.coordinator.complete

    def spy(prepared: Any, **kw: Any) -> Any:
        alone.append(prepared.txn)
        return original(prepared, **kw)

    monkeypatch.setattr(log.coordinator, "complete", spy)
    p = log.producer("folded")
    p.init_transactions()
    for i in range(20):
        p.begin_transaction()
        p.send("t", pa.table({"id": [i]}), partition=i % 2)
        p.commit_transaction()
    p.close()
    assert len(alone) <= 1  # only close() may write the last one's alone
    assert _ids(log) == list(range(20))


def test_on_a_store_that_stages_creates_fast_records_write_the_begin_before_the_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fast: None
) -> None:
    """The first transaction (nothing measured yet) overlaps its begin with its entries; once records are
    known to be fast, the begin is written first, on the committing thread."""
    log = txn_core.open_log(str(tmp_path / "log"))
    log.create_topic("t", 2, SCHEMA)
    assert log.storage.stages_creates
    overlapped = _record_overlaps(monkeypatch)
    p = log.producer("begins")
    p.init_transactions()
    for i in range(4):
        p.begin_transaction()
        p.send("t", pa.table({"id": [i]}), partition=i % 2)
        p.commit_transaction()
    p.close()
    assert len(overlapped) == 1
    assert _ids(txn_core.open_log(str(tmp_path / "log"))) == [0, 1, 2, 3]


def test_an_interrupt_while_the_committing_thread_writes_markers_leaves_a_committed_transaction(
    monkeypatch: pytest.MonkeyPatch, fast: None
) -> None:
    """Ctrl-C lands while commit_transaction writes the markers (after the decision): it raises, but the
    producer is Ready, so an ``except BaseException: abort_transaction()`` is refused instead of returning as
    if it had aborted a committed transaction (found by review); the markers are written in the background."""
    log = _memory_log()
    p = log.producer("interrupted")
    p.init_transactions()
    p.begin_transaction()
    p.send("t", pa.table({"id": [0]}), partition=0)
    p.commit_transaction()
    real = log.coordinator.write_markers

    def interrupted(prepared: Any, paths: Any = None) -> None:
        monkeypatch.setattr(log.coordinator, "write_markers", real)
        raise KeyboardInterrupt

    monkeypatch.setattr(log.coordinator, "write_markers", interrupted)
    p.begin_transaction()
    p.send("t", pa.table({"id": [1, 2]}), partition=0)
    with pytest.raises(KeyboardInterrupt):
        p.commit_transaction()
    assert p.state == txn_core.ClientState.READY
    with pytest.raises(txn_core.InvalidTxnStateError):
        p.abort_transaction()
    p.close()
    assert _ids(log) == [0, 1, 2]
    assert _unmarked(log) == []
