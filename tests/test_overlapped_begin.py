"""On a store that stages creates (local disk), a transaction's first data entries are written while its
begin record is created, and linked only once the begin is durable under the transaction id they carry
(``Sender._write_with_begin``). Whatever happens to the begin, no entry is ever visible before it."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import txn_core
from txn_core.clients.producer import carried, client, completion
from txn_core.clients.producer.sender import Sender
from txn_core.errors import CommitFailedError, CompletionFailedError, StorageError
from txn_core.format.ids import TxnId
from txn_core.storage import open_storage

SCHEMA = pa.schema([("id", pa.int64())])


@pytest.fixture(autouse=True)
def _markers_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """Markers written alone at once (``marker_linger_ms=0``): these tests are about the threads and the
    records that write them; markers carried by the next entries are tests/test_carried_markers.py's."""
    monkeypatch.setattr(carried, "MARKER_LINGER_S", 0.0)


@pytest.fixture(autouse=True)
def _records_handed_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """The overlap is for stores whose records cost more than a hand-off to a thread; these tests take that
    path whatever this machine's disk costs (tests/test_fast_records.py covers the other)."""
    monkeypatch.setattr(completion, "FAST_RECORD_S", 0.0)


def _log(tmp_path: Path) -> txn_core.Log:
    log = txn_core.open_log(str(tmp_path / "log"))
    log.create_topic("t", 2, SCHEMA)
    assert log.storage.stages_creates
    return log


def _ids(log: txn_core.Log, isolation: str = "read_committed") -> list[int]:
    c = log.consumer(isolation_level=isolation)
    c.assign([("t", 0), ("t", 1)])
    out: list[int] = []
    while (got := c.poll()).num_rows:
        out.extend(got.column("id").to_pylist())
    return sorted(out)


def _record_overlaps(monkeypatch: pytest.MonkeyPatch) -> list[TxnId]:
    """The transaction ids under which producers write their first entries while the begin is created."""
    overlapped: list[TxnId] = []
    original = Sender._write_with_begin

    def spy(self: Sender, todo: Any, predicted: TxnId, extra: Any = None) -> None:
        overlapped.append(predicted)
        original(self, todo, predicted, extra)

    monkeypatch.setattr(Sender, "_write_with_begin", spy)
    return overlapped


def test_the_first_writes_overlap_the_begin_and_commit_as_usual(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Only the first transaction has a begin record: each prepare begins the next one ahead.
    assert _three_transactions(tmp_path, monkeypatch) == 1


def test_without_begin_ahead_every_transaction_overlaps_its_begin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(client, "BEGIN_AHEAD", False)
    assert _three_transactions(tmp_path, monkeypatch) == 3


def _three_transactions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    """Three committed transactions of one producer, alternating partitions, all readable; how many of
    them wrote their first entries while their begin record was created."""
    log = _log(tmp_path)
    overlapped = _record_overlaps(monkeypatch)
    p = log.producer("overlap")
    p.init_transactions()
    for i in range(3):
        p.begin_transaction()
        p.send("t", pa.table({"id": [i, 10 + i]}), partition=i % 2)
        p.commit_transaction()
        assert p.transaction_id is None
    p.close()
    assert _ids(txn_core.open_log(str(tmp_path / "log"))) == [0, 1, 2, 10, 11, 12]
    return len(overlapped)


def test_a_wrong_guess_drops_the_staged_entries_and_writes_them_under_the_real_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The begin lands at another slot than guessed (another writer took it): nothing staged under the
    guessed id becomes visible; the entries are written again under the real one."""
    log = _log(tmp_path)
    p = log.producer("guess")
    p.init_transactions()
    monkeypatch.setattr(log.coordinator, "predict_txn", lambda tid: TxnId(999, 999))
    p.begin_transaction()
    p.send("t", pa.table({"id": [7]}), partition=0)
    p.commit_transaction()
    p.close()
    fresh = txn_core.open_log(str(tmp_path / "log"))
    assert _ids(fresh) == [7] and _ids(fresh, "read_uncommitted") == [7]
    header = fresh.partition_log("topics/t/00000").read_header(0)
    assert header.txn is not None and header.txn != TxnId(999, 999)


def test_a_fenced_begin_leaves_the_staged_entries_unseen(tmp_path: Path) -> None:
    """The begin fails (another instance fenced this producer) while the entries are staged: they are
    never linked, so not even read_uncommitted sees them."""
    log = _log(tmp_path)
    zombie = log.producer("fenced")
    zombie.init_transactions()
    successor = txn_core.Log(open_storage(str(tmp_path / "log"))).producer("fenced")
    successor.init_transactions()
    zombie.begin_transaction()
    zombie.send("t", pa.table({"id": [666]}), partition=1)
    with pytest.raises(txn_core.ProducerFencedError):
        zombie.flush()
    assert zombie.state == txn_core.ClientState.FATAL_ERROR
    assert _ids(txn_core.open_log(str(tmp_path / "log")), "read_uncommitted") == []
    successor.close()


@pytest.mark.timeout(120)
def test_a_failed_marker_write_does_not_deadlock_the_next_overlapped_begin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The markers of a transaction fail to be written in the background; the next transaction's first
    entry is staged behind its begin. The begin must not write those markers itself: they would queue
    behind that entry in the same partition, which waits for the begin. The markers are written at the
    next commit instead, and both transactions are readable. (Without begin ahead: with it, the next
    transaction has no begin record, and its prepare writes the markers first.)"""
    monkeypatch.setattr(client, "BEGIN_AHEAD", False)
    log = _log(tmp_path)
    original = log.coordinator.write_markers
    calls: list[TxnId | None] = []

    def fail_once(prepared: Any, paths: Any = None) -> None:
        calls.append(prepared.txn)
        if len(calls) == 1:
            raise StorageError("injected: marker write failed")
        original(prepared, paths)

    monkeypatch.setattr(log.coordinator, "write_markers", fail_once)
    overlapped = _record_overlaps(monkeypatch)
    p = log.producer("failed-markers")
    p.init_transactions()
    p.begin_transaction()
    p.send("t", pa.table({"id": [1]}), partition=0)
    p.commit_transaction()
    first = calls[0] if calls else None
    deadline = time.monotonic() + 30
    while not (calls and p._completions._pending and p._completions._failed(p._completions._pending[0])):
        assert time.monotonic() < deadline, "the background marker write never failed"
        time.sleep(0.01)

    done = threading.Event()
    errors: list[BaseException] = []

    def second() -> None:
        try:
            p.begin_transaction()
            p.send("t", pa.table({"id": [2]}), partition=0)
            p.commit_transaction()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            done.set()

    threading.Thread(target=second, daemon=True).start()
    assert done.wait(30), "the second transaction deadlocked on the first one's markers"
    assert errors == []
    assert len(overlapped) == 2, "the second transaction's first entry did not overlap its begin"
    p.wait_for_completion()
    assert first is not None and calls.count(first) == 2  # failed once, written again before the next prepare
    p.close()
    assert _ids(txn_core.open_log(str(tmp_path / "log"))) == [1, 2]


@pytest.mark.parametrize("store", ["local", "memory"])
def test_a_commit_refused_because_an_earlier_transaction_could_not_complete_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, store: str
) -> None:
    """The previous transaction's markers fail in the background and again when the next commit tries
    them first: that commit fails naming the earlier transaction (its markers), not its own writes or the
    store refusing its decision, and it resumes once the store is back. The earlier transaction is completed
    before the prepare: the second transaction was begun ahead, so its writes needed no begin record."""
    if store == "local":
        log = _log(tmp_path)
    else:
        log = txn_core.open_log(f"memory://{tmp_path.name}")
        log.create_topic("t", 2, SCHEMA)
    original = log.coordinator.write_markers
    healthy = threading.Event()

    def failing(prepared: Any, paths: Any = None) -> None:
        if not healthy.is_set():
            raise StorageError("injected: marker write failed")
        original(prepared, paths)

    monkeypatch.setattr(log.coordinator, "write_markers", failing)
    p = log.producer("earlier-fails")
    p.init_transactions()
    p.begin_transaction()
    p.send("t", pa.table({"id": [1]}), partition=0)
    p.commit_transaction()  # decided; its markers fail in the background
    first = p._completions._pending[0].txn
    p.begin_transaction()
    p.send("t", pa.table({"id": [2]}), partition=0)
    with pytest.raises(CommitFailedError) as failed:
        p.commit_transaction()
    message = str(failed.value)
    assert f"completing the earlier transaction {first}" in message and "injected" in message
    assert "did not all complete" not in message and "refused its decision" not in message
    cause = failed.value.__cause__
    assert isinstance(cause, CompletionFailedError) and cause.txn == first
    healthy.set()
    p.commit_transaction()  # resumes: the earlier transaction completes, then this one commits
    p.close()
    assert _ids(txn_core.open_log(log.url)) == [1, 2]
