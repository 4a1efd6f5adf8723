"""Begin ahead (PROTOCOL.md "Begin ahead"): a producer's prepare record also begins its next transaction,
reserved beside the decided one, so a warm transaction writes no begin record. What must hold: the id's
state stays the decided transaction's; a reservation never times out unused, and one written under times
out from its first write; whoever else meets it treats it as an open transaction; a closing producer
withdraws it; a guessed participant the transaction never wrote to gets no marker.

Runs on memory, and in the SeaweedFS and latency tiers with the transaction suite's fixture."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from fakeclock import FakeClock
from test_round_trips import HeldRecords
from test_transactions import STORES, ids, make_log, send, tx

import txn_core
from txn_core.clock import system_clock
from txn_core.coordinator import groupcommit, txnlog
from txn_core.coordinator.actions import Add, Begin, Complete, Init, Prepare, Withdraw
from txn_core.coordinator.apply import apply
from txn_core.coordinator.service import coordinator_for
from txn_core.errors import InvalidTxnStateError, ProducerFencedError, TransactionTimedOutError
from txn_core.format import paths
from txn_core.format.ids import TxnId
from txn_core.format.states import CoordinatorState

_C = CoordinatorState
P0, P1 = paths.partition_log_path("t", 0), paths.partition_log_path("t", 1)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1_800_000_000_000)


@pytest.fixture(params=STORES)
def log(request: pytest.FixtureRequest, clock: FakeClock, tmp_path: Path) -> txn_core.Log:
    return make_log(request, clock, tmp_path)


def _committed(log: txn_core.Log, timeout: int = 10_000, *, ids: tuple[int, ...] = (1,)) -> txn_core.Producer:
    """A producer of ``tx`` that committed one transaction of ``ids`` in partition 0: the next one is begun
    ahead."""
    p = tx(log, timeout=timeout)
    p.begin_transaction()
    send(p, list(ids), partition=0)
    p.commit_transaction()
    return p


def _entries(log: txn_core.Log, partition: int) -> list[Any]:
    plog = log.partition_log(paths.partition_log_path("t", partition))
    return [plog.read_header(s) for s in range(plog.tail(refresh=True)[0])]


def test_a_commit_begins_the_next_transaction_ahead_and_the_id_shows_the_decided_one(log: txn_core.Log) -> None:
    p = _committed(log)
    first = log.coordinator.state("tx")
    assert first is not None and first.txn is not None and first.ahead is not None
    assert first.state in (_C.PREPARE_COMMIT, _C.COMPLETE_COMMIT)
    assert first.ahead.participants == (P0,) and first.ahead.txn.sequence > first.txn.sequence
    assert log.describe_transaction("tx").state in ("PrepareCommit", "CompleteCommit")
    p.begin_transaction()
    send(p, [2], partition=0)
    p.flush()
    assert p.transaction_id == first.ahead.txn, "the next transaction adopted the reservation"
    p.commit_transaction()
    p.close()
    closed = log.coordinator.state("tx")
    assert closed is not None and closed.state == _C.COMPLETE_COMMIT and closed.ahead is None
    assert closed.txn == first.ahead.txn
    assert ids(log) == [1, 2]
    view = log.coordinator.views.get(closed.txn.coordinator)
    view._check()


def test_close_withdraws_the_reservation_without_a_marker(log: txn_core.Log) -> None:
    p = _committed(log)
    reserved = log.coordinator.state("tx")
    assert reserved is not None and reserved.ahead is not None
    p.close()
    st = log.coordinator.state("tx")
    assert st is not None and st.ahead is None and st.state == _C.COMPLETE_COMMIT and st.txn == reserved.txn
    markers = [h for h in _entries(log, 0) if h.is_control]
    assert [h.txn for h in markers] == [reserved.txn], "the withdrawn transaction got no marker"
    status = log.coordinator.resolve(reserved.ahead.txn)
    assert status.state == _C.COMPLETE_ABORT, "withdrawn: finished, nothing of it exists"
    assert log.describe_topic("t").partitions[0].last_stable_offset == 2


def test_an_idle_producer_s_reservation_never_times_out(log: txn_core.Log, clock: FakeClock) -> None:
    p = _committed(log, timeout=1_000)
    p.wait_for_completion()
    clock.now += 60_000  # sixty timeouts idle
    assert log.expire_transactions() == 0
    assert ids(log) == [1]
    assert (
        log.describe_topic("t").partitions[0].last_stable_offset == log.describe_topic("t").partitions[0].log_end_offset
    )
    p.begin_transaction()
    send(p, [2], partition=0)
    p.commit_transaction()  # counted from its first write: well within its timeout
    assert ids(log) == [1, 2]
    p.close()


def _dead_under_its_reservation(log: txn_core.Log, clock: FakeClock) -> txn_core.Producer:
    """A producer (timeout 5 s) that committed ids 1, stayed idle long past its timeout, then wrote ids 2
    and 3 under its reservation to partition 0 and was never heard of again; a plain producer's 4 follows."""
    dead = _committed(log, 5_000)
    dead.wait_for_completion()
    clock.now += 60_000  # idle long past the timeout before its next transaction
    dead.begin_transaction()
    send(dead, [2, 3], partition=0)
    dead.flush()
    plain = log.producer()
    send(plain, [4], partition=0)
    plain.flush()
    return dead


def test_a_reservation_written_under_times_out_from_its_first_entry(log: txn_core.Log, clock: FakeClock) -> None:
    """The producer dies after writing under its reservation. Its record is old, its data is not: a reader
    counts the timeout from the data (counting from the record would abort it the moment it is read)."""
    dead = _dead_under_its_reservation(log, clock)
    assert ids(log) == [1], "open: holds the read bound"
    clock.now += 4_000
    assert ids(log) == [1], "within its timeout from its first entry"
    assert log.expire_transactions() == 0, "expiry counts from its first entry too"
    clock.now += 2_000
    assert ids(log) == [1, 4], "the reader aborted it"
    st = log.coordinator.state("tx")
    assert st is not None and st.state == _C.COMPLETE_ABORT and st.abort_reason == "timeout" and st.ahead is None
    with pytest.raises(TransactionTimedOutError):
        dead.commit_transaction()


def test_expiry_aborts_a_reservation_written_under_at_its_timeout(log: txn_core.Log, clock: FakeClock) -> None:
    """A dead producer's transaction begun ahead, written under and named by no record, has no start in the
    transaction log: expire_transactions (the operator's, or maintenance's) finds its first write in the
    logs it guessed as participants and aborts it at its timeout, so readers without write access are not
    held until someone with it reads the partition (or for the 7 days an unnamed reservation waits)."""
    dead = _dead_under_its_reservation(log, clock)
    clock.now += 4_000
    assert log.expire_transactions() == 0, "within its timeout from its first entry"
    clock.now += 2_000
    operator = txn_core.Log(log.storage, clock=clock)
    assert operator.expire_transactions() == 1
    st = operator.coordinator.state("tx")
    assert st is not None and st.state == _C.COMPLETE_ABORT and st.abort_reason == "timeout" and st.ahead is None
    reader = txn_core.Log(log.storage, clock=clock)
    part = reader.describe_topic("t").partitions[0]
    assert part.last_stable_offset == part.log_end_offset, "its markers are written"
    assert ids(reader) == [1, 4]
    with pytest.raises(TransactionTimedOutError):
        dead.commit_transaction()


def test_a_participant_expiry_cannot_read_stops_nothing(
    log: txn_core.Log, clock: FakeClock, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Expiry reads participants only to learn a first write; one it cannot read (any error) is logged and
    skipped, and the run goes on (the next run tries again)."""
    _dead_under_its_reservation(log, clock)
    clock.now += 6_000
    operator = txn_core.Log(log.storage, clock=clock)

    def unreadable(path: str, **_: Any) -> Any:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(operator.context.partition_states, "get", unreadable)
    assert operator.expire_transactions() == 0
    assert "not read for expiry" in caplog.text
    monkeypatch.undo()
    assert operator.expire_transactions() == 1


def test_expiry_leaves_a_reservation_in_use_however_old(log: txn_core.Log, clock: FakeClock) -> None:
    """A producer idle for nearly the 7 days an unnamed reservation may wait writes under it: once written
    under, the reservation is a transaction within its timeout, not an unused one to expire."""
    p = _committed(log, 60_000)
    p.wait_for_completion()
    clock.now += txnlog.TID_EXPIRATION_MS - 1_000
    p.begin_transaction()
    send(p, [2], partition=0)
    p.flush()
    clock.now += 2_000  # the reservation is older than 7 days; its first write 2 s old
    assert log.expire_transactions() == 0
    p.commit_transaction()
    assert ids(log) == [1, 2]
    p.close()


def test_the_producer_s_own_late_commit_counts_from_its_first_write(log: txn_core.Log, clock: FakeClock) -> None:
    p = _committed(log, timeout=1_000)
    p.begin_transaction()
    send(p, [2], partition=0)
    p.flush()
    clock.now += 1_500
    with pytest.raises(TransactionTimedOutError, match="500 ms past its deadline"):
        p.commit_transaction()
    assert ids(log) == [1]


def test_a_new_instance_aborts_a_reservation_its_predecessor_wrote_under(log: txn_core.Log) -> None:
    zombie = _committed(log)
    zombie.wait_for_markers()
    zombie.begin_transaction()
    send(zombie, [2], partition=0)
    zombie.flush()
    successor = tx(txn_core.Log(log.storage, clock=log.clock))
    assert ids(log) == [1]
    st = log.coordinator.state("tx")
    assert st is not None and st.state == _C.EMPTY and st.ahead is None
    with pytest.raises(ProducerFencedError):
        zombie.commit_transaction()
    send_after = successor
    send_after.begin_transaction()
    send(send_after, [3], partition=0)
    send_after.commit_transaction()
    assert ids(log) == [1, 3]
    successor.close()


def test_a_kept_producer_fenced_before_its_prepare_leaves_nothing_visible(log: txn_core.Log) -> None:
    """A zombie holding a reservation writes under it after a new instance took over (and aborted the
    reservation): its entries land after the abort marker and read_committed readers drop them."""
    zombie = _committed(log)
    successor = tx(txn_core.Log(log.storage, clock=log.clock))
    zombie.begin_transaction()
    send(zombie, [666], partition=0)
    zombie.flush()  # no coordinator request: lands, carrying the aborted reservation's id
    with pytest.raises(ProducerFencedError):
        zombie.commit_transaction()
    assert ids(log) == [1] and 666 in ids(log, "read_uncommitted")
    successor.begin_transaction()
    send(successor, [2], partition=0)
    successor.commit_transaction()
    assert ids(log) == [1, 2]
    successor.close()


def _markers(headers: list[Any]) -> list[TxnId | None]:
    """The transactions whose markers ``headers`` hold: lone markers and carried ones."""
    return [h.txn if h.is_control else h.carried.txn for h in headers if h.is_control or h.carried is not None]


def test_only_the_participants_written_to_get_markers(log: txn_core.Log) -> None:
    p = tx(log)
    p.begin_transaction()
    send(p, [1], partition=0)
    send(p, [2], partition=1)
    p.commit_transaction()
    p.begin_transaction()
    send(p, [3], partition=0)  # the reservation guessed partitions 0 and 1
    p.commit_transaction()
    second = log.coordinator.state("tx")
    assert second is not None and second.participants == (P0,)
    assert second.ahead is not None and set(second.ahead.participants) == {P0, P1}, "the guess keeps both"
    p.close()
    assert _markers(_entries(log, 1)) == [_entries(log, 1)[0].txn], "one marker in 1"
    assert len(_markers(_entries(log, 0))) == 2, "lone or carried, one per transaction in 0"
    assert ids(log) == [1, 2, 3]


def test_a_partition_outside_the_guess_is_added(log: txn_core.Log) -> None:
    p = _committed(log)
    p.begin_transaction()
    send(p, [2], partition=2)
    p.commit_transaction()
    st = log.coordinator.state("tx")
    assert st is not None and st.participants == (paths.partition_log_path("t", 2),)
    p.close()
    assert ids(log) == [1, 2]


def test_an_aborted_transaction_also_begins_the_next_ahead(log: txn_core.Log) -> None:
    p = tx(log)
    p.begin_transaction()
    send(p, [1], partition=0)
    p.flush()
    p.abort_transaction()
    st = log.coordinator.state("tx")
    assert st is not None and st.ahead is not None
    p.begin_transaction()
    p.abort_transaction()  # nothing written: no record, the reservation stays
    again = log.coordinator.state("tx")
    assert again is not None and again.ahead == st.ahead
    p.begin_transaction()
    send(p, [2], partition=0)
    p.commit_transaction()
    p.close()
    assert ids(log) == [2]


def test_commit_metadata_alone_uses_the_reservation(log: txn_core.Log) -> None:
    p = _committed(log)
    p.begin_transaction()
    p.commit_transaction(metadata={"batch": 7})
    st = log.coordinator.state("tx")
    assert st is not None and st.last_committed == {"batch": 7} and st.participants == ()
    p.close()
    assert log.transaction_metadata("tx") == {"batch": 7}
    assert len([h for h in _entries(log, 0) if h.is_control]) == 1, "no marker for a transaction that wrote nothing"


def test_an_operator_abort_takes_the_reservation_too(log: txn_core.Log) -> None:
    p = _committed(log)
    p.begin_transaction()
    send(p, [2], partition=0)
    p.flush()
    log.abort_transaction("tx")
    assert ids(log) == [1]
    with pytest.raises(ProducerFencedError):
        p.commit_transaction()


def test_a_reservation_unnamed_for_the_id_expiration_is_aborted(log: txn_core.Log, clock: FakeClock) -> None:
    p = _committed(log)
    p.wait_for_completion()
    clock.now += 8 * 24 * 3600 * 1000
    assert log.expire_transactions() == 1
    st = log.coordinator.state("tx")
    assert st is not None and st.ahead is None and st.state == _C.COMPLETE_ABORT
    with pytest.raises(ProducerFencedError):
        p.begin_transaction()
        send(p, [2], partition=0)
        p.commit_transaction()
    assert ids(log) == [1]


def test_a_snapshot_without_first_entry_times_reads_the_header(log: txn_core.Log, clock: FakeClock) -> None:
    """Buffer snapshots written before ``first_ms`` existed leave it unknown: the reader reads the
    transaction's first entry's header instead."""
    p = _committed(log)
    p.begin_transaction()
    send(p, [2], partition=0)
    p.flush()
    state = log.partition_state(P0, shared=False)
    state.scan_to_end()
    txn = p.transaction_id
    assert txn is not None
    known = state.first_write_ms(txn)
    state.buffer.by_txn[txn].first_ms = None
    assert state.first_write_ms(txn) == known == clock.now
    p.abort_transaction()
    p.close()


# --- the coordinator's rules -----------------------------------------------------------------------


def _decided(ahead: bool = False) -> Any:
    st = apply(None, Init("a", 1, 0, 9_000), 3, 0, 100)
    st = apply(st, Begin("a", 1, 0, 9_000, (P0,)), 3, 1, 101)
    st = apply(st, Prepare("a", 1, 0, TxnId(3, 1), "COMMIT"), 3, 2, 102)
    if ahead:
        st = apply(st, Begin("a", 1, 1, 9_000, (P0,), ahead=True), 3, 2, 102)
    return st


def test_begin_ahead_reserves_beside_the_decided_transaction() -> None:
    st = _decided(ahead=True)
    assert st.state == _C.PREPARE_COMMIT and st.txn == TxnId(3, 1)
    assert st.ahead is not None and st.ahead.txn == TxnId(3, 2) and st.ahead.epoch == 1
    st.check()
    assert st.open_txns() == [TxnId(3, 1), TxnId(3, 2)]
    named = apply(st, Add("a", 1, 1, TxnId(3, 2), (P1,)), 3, 3, 103)
    assert named.state == _C.ONGOING and named.txn == TxnId(3, 2) and named.start_ms is None
    assert named.completing is not None and named.completing.txn == TxnId(3, 1)
    assert named.participants == (P0, P1) and named.ahead is None
    named.check()


@pytest.mark.parametrize(
    "action, error",
    [
        (Begin("a", 1, 1, 9_000, (P0,)), InvalidTxnStateError),  # a plain begin beside a reservation
        (Begin("a", 1, 1, 9_000, (P0,), ahead=True), InvalidTxnStateError),  # a second reservation
        (Withdraw("a", 1, 0, TxnId(3, 2)), ProducerFencedError),  # not the reservation's epoch
        (Withdraw("a", 1, 1, TxnId(3, 9)), InvalidTxnStateError),  # not the reservation
        (Init("a", 1, 2, 9_000), InvalidTxnStateError),  # it may hold data: abort it first
    ],
)
def test_what_a_reservation_refuses(action: Any, error: type[Exception]) -> None:
    st = apply(_decided(ahead=True), Complete("a", TxnId(3, 1)), 3, 3, 103)
    with pytest.raises(error):
        apply(st, action, 3, 4, 104)


def test_begin_ahead_needs_nothing_completing() -> None:
    st = _decided()
    st = apply(st, Begin("a", 1, 1, 9_000, (P0,)), 3, 3, 103)  # the next one begun plainly: 3:1 completing
    st = apply(st, Prepare("a", 1, 1, TxnId(3, 3), "COMMIT"), 3, 4, 104)
    with pytest.raises(InvalidTxnStateError, match="still open"):
        apply(st, Begin("a", 1, 2, 9_000, (P0,), ahead=True), 3, 4, 104)
    done = apply(st, Complete("a", TxnId(3, 1)), 3, 4, 104)
    apply(done, Begin("a", 1, 2, 9_000, (P0,), ahead=True), 3, 4, 104).check()


def test_a_prepare_names_only_registered_participants() -> None:
    st = apply(_decided(ahead=True), Add("a", 1, 1, TxnId(3, 2), (P1,)), 3, 3, 103)
    with pytest.raises(InvalidTxnStateError, match="never registered"):
        apply(st, Prepare("a", 1, 1, TxnId(3, 2), "COMMIT", None, None, None, ("topics/t/00002",)), 3, 4, 104)
    narrowed = apply(st, Prepare("a", 1, 1, TxnId(3, 2), "COMMIT", None, None, None, (P1,)), 3, 4, 104)
    assert narrowed.participants == (P1,)


# --- group commit ----------------------------------------------------------------------------------


def _begin_and_send(p: txn_core.Producer, value: int, partition: int) -> None:
    p.begin_transaction()
    send(p, [value], partition=partition)
    p.flush()


def test_a_decision_that_cannot_take_the_record_s_begin_goes_without_a_reservation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A commit queued behind a record together with another producer's begin, where the record has room for
    one begin only: the begin takes it, the commit's decision goes in the same record without its
    reservation (not deferred)."""
    monkeypatch.setattr(groupcommit, "MAX_BEGINS_PER_RECORD", 1)
    storage = HeldRecords(uuid.uuid4().hex)
    shared = txn_core.Log(storage)
    shared.create_topic("t", 3, pa.schema([("id", pa.int64())]))
    tids = [t for t in (f"g{i}" for i in range(400)) if coordinator_for(t, shared.coordinator_partitions) == 4][:3]
    a, b, c = (shared.producer(t) for t in tids)
    for p in (a, b, c):
        p.init_transactions()
    c.begin_transaction()
    send(c, [3], partition=2)
    c.flush()  # c's transaction is open: its commit below is only a prepare
    view = shared.coordinator.views.get(4)
    storage.hold.clear()
    blocker = threading.Thread(target=_begin_and_send, args=(a, 1, 0))
    blocker.start()
    assert storage.held.wait(10)  # a's begin record is in flight ...
    started = view.next_slot
    behind = [
        threading.Thread(target=_begin_and_send, args=(b, 2, 1)),
        threading.Thread(target=c.commit_transaction),
    ]
    deadline = time.monotonic() + 10
    for queued, t in enumerate(behind, 1):  # ... while b's begin, then c's commit, queue behind it
        t.start()
        while view.queued() < queued and time.monotonic() < deadline:
            time.sleep(0.001)
    assert view.queued() == 2
    storage.hold.set()
    for t in [blocker, *behind]:
        t.join()
    assert view.next_slot - started == 2, "a's begin, then b's begin and c's decision together"
    st = shared.coordinator.state(tids[2])
    assert st is not None and st.state in (_C.PREPARE_COMMIT, _C.COMPLETE_COMMIT) and st.ahead is None
    for p in (a, b):
        p.commit_transaction()
    for p in (a, b, c):
        p.close()
    assert ids(shared) == [1, 2, 3]
    view._check()


def test_a_fenced_producer_s_begin_beside_another_s_reservation_is_fenced() -> None:
    """A producer's begin, rebuilt after losing its slot to a newer instance that has since committed (and
    begun its next transaction ahead), is refused as fenced: the error that makes it re-initialise."""
    st = apply(_decided(ahead=True), Complete("a", TxnId(3, 1)), 3, 3, 103)
    with pytest.raises(ProducerFencedError):
        apply(st, Begin("a", 1, 0, 9_000, (P0,)), 3, 4, 104)


def test_a_group_committed_record_gives_each_begin_an_index() -> None:
    """Begins and reservations of several producers share one record, each transaction with an id of its
    own (the record's slot, its index among the record's begins); replay gives the same ids."""
    from txn_core.coordinator.txnlog import CoordinatorPartition
    from txn_core.storage import MemoryStorage

    storage = MemoryStorage(uuid.uuid4().hex)
    view = CoordinatorPartition(storage, 3, clock=system_clock)
    view.refresh()
    tids = ["a", "b", "c"]
    for t in tids:

        def init(cur: object, t: str = t) -> list[Init]:
            return [Init(t, 1, 0, 9_000)]

        view.append(t, init)
    actions = [Begin(t, 1, 0, 9_000, (P0,)) for t in tids]
    view.append("a", lambda cur: actions)  # one record, three begins
    ids_ = [view.state(t).txn for t in tids]  # type: ignore[union-attr]
    assert ids_ == [TxnId(3, 3, 0), TxnId(3, 3, 1), TxnId(3, 3, 2)]
    replayed = CoordinatorPartition(storage, 3, clock=system_clock)
    replayed.refresh()
    assert [replayed.state(t).txn for t in tids] == ids_  # type: ignore[union-attr]
    assert [str(t) for t in ids_] == ["3:3", "3:3.1", "3:3.2"] and TxnId.parse("3:3.2") == ids_[2]
    replayed._check()
