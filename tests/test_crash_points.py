"""Crash at every storage operation of a transaction, then recover with fresh participants.

For each operation index k of begin/send/commit (and of abort), a process dies at k -- before the write
lands, or right after it landed -- and is abandoned. A fresh process then recovers, by the next
``init_transactions`` of the same transactional id or by a reader meeting the transaction after its
timeout. Every case must end with the transaction's rows visible all together or not at all (all if
the PrepareCommit record landed, none otherwise), no duplicates, the earlier committed data intact,
and the last stable offset back at the log end.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pytest
from fakeclock import FakeClock
from faults import FaultyStorage, SimulatedCrash
from tiers import SEED_ENV

import txn_core
from txn_core.clients.producer import client, completion
from txn_core.clock import system_clock
from txn_core.format.states import CoordinatorState
from txn_core.storage import MemoryStorage, Storage, open_storage

SCHEMA = pa.schema([("id", pa.int64())])
PARTITIONS = 3
BASE = list(range(0, 30))  # committed before the crash
TXN = list(range(1000, 1030))  # the transaction that crashes
TID = "crashy"

SETUP_TXN: dict[str, object] = {}


def _setup(inner: Storage | None = None) -> tuple[Storage, FakeClock]:
    inner = inner or MemoryStorage(f"crash-{uuid.uuid4().hex}")
    clock = FakeClock(1_700_000_000_000)
    log = txn_core.Log(inner, clock=clock)
    log.create_topic("t", PARTITIONS, SCHEMA)
    p = log.producer(TID, transaction_timeout_ms=10_000)
    p.init_transactions()
    p.begin_transaction()
    p.send("t", pa.table({"id": BASE}), key_column="id")
    p.commit_transaction()
    p.close()
    SETUP_TXN["txn"] = log.coordinator.state(TID).txn  # type: ignore[union-attr]
    return inner, clock


def _commit_txn(log: txn_core.Log) -> None:
    p = log.producer(TID, transaction_timeout_ms=10_000)
    p.init_transactions()
    p.begin_transaction()
    p.send("t", pa.table({"id": TXN}), key_column="id")
    p.flush()
    p.send_offsets_to_transaction({("t", 0): 7}, "grp")
    p.commit_transaction()
    p.close()  # waits for the background markers and CompleteCommit


def _abort_txn(log: txn_core.Log) -> None:
    p = log.producer(TID, transaction_timeout_ms=10_000)
    p.init_transactions()
    p.begin_transaction()
    p.send("t", pa.table({"id": TXN}), key_column="id")
    p.flush()
    p.abort_transaction()
    p.close()


def _read_all(log: txn_core.Log, isolation: str = "read_committed") -> list[int]:
    c = log.consumer(isolation_level=isolation)
    c.assign([("t", p) for p in range(PARTITIONS)])
    out: list[int] = []
    while True:
        got = c.poll()
        if got.num_rows == 0:
            break
        out.extend(got.column("id").to_pylist())
    return out


def _count_ops(action: Callable[[txn_core.Log], None]) -> int:
    inner, clock = _setup()
    faulty = FaultyStorage(inner)
    action(txn_core.Log(faulty, clock=clock))
    return len(faulty.ops)


#: Where a decided transaction's markers are written (txn_core.clients.producer.completion): by the committing thread
#: where the store's records are fast (the memory store here), else by the background thread. The commit
#: protocol's crash tests run both ways.
SECOND_PHASE = {"inline": 1.0, "background": 0.0}


@contextlib.contextmanager
def _second_phase(mode: str) -> Iterator[None]:
    saved = completion.FAST_RECORD_S
    completion.FAST_RECORD_S = SECOND_PHASE[mode]
    try:
        yield
    finally:
        completion.FAST_RECORD_S = saved


@pytest.fixture(params=list(SECOND_PHASE))
def second_phase(request: pytest.FixtureRequest) -> Iterator[str]:
    with _second_phase(request.param):
        yield request.param


def _count_ops_both(action: Callable[[txn_core.Log], None]) -> int:
    counts = []
    for mode in SECOND_PHASE:
        with _second_phase(mode):
            counts.append(_count_ops(action))
    return max(counts)


def _commit_decided(inner: Storage, clock: FakeClock) -> bool:
    """Whether the crashed transaction's PrepareCommit record landed."""
    st = txn_core.Log(inner, clock=clock).coordinator.state(TID)
    return (
        st is not None
        and st.txn != SETUP_TXN["txn"]
        and st.state in (CoordinatorState.PREPARE_COMMIT, CoordinatorState.COMPLETE_COMMIT)
    )


def _check_recovered(inner: Storage, clock: FakeClock, expect_commit: bool | None, recover: str) -> None:
    if recover == "reinit":
        p = txn_core.Log(inner, clock=clock).producer(TID, transaction_timeout_ms=10_000)
        p.init_transactions()  # fences the dead instance and finishes or aborts what it left
    else:
        clock.now += 11_000  # past the transaction timeout: the next reader aborts an open one
    log = txn_core.Log(inner, clock=clock)
    seen = _read_all(log)
    assert len(seen) == len(set(seen)), "duplicates"
    got_txn = sorted(i for i in seen if i >= 1000)
    assert sorted(i for i in seen if i < 1000) == BASE, "earlier committed data changed"
    assert got_txn in ([], TXN), f"partial transaction visible: {len(got_txn)} of {len(TXN)}"
    if expect_commit is not None:
        assert (got_txn == TXN) == expect_commit
    for d in log.describe_topic("t").partitions:
        assert d.last_stable_offset == d.log_end_offset, f"partition {d.partition} still held: {d}"
    # Stable: a second reader sees the same.
    assert sorted(_read_all(txn_core.Log(inner, clock=clock))) == sorted(seen)
    committed = log.groups.committed("grp")
    tp = txn_core.TopicPartition("t", 0)
    assert (tp in committed) == (got_txn == TXN), "group offsets not atomic with the data"


COMMIT_OPS = _count_ops_both(_commit_txn)
ABORT_OPS = _count_ops_both(_abort_txn)


@pytest.mark.matrix(keep=16)
@pytest.mark.parametrize("recover", ["reinit", "timeout"])
@pytest.mark.parametrize("landed", [False, True], ids=["before-write", "after-write"])
@pytest.mark.parametrize("k", range(COMMIT_OPS))
def test_crash_during_commit_recovers_all_or_nothing(k: int, landed: bool, recover: str, second_phase: str) -> None:
    inner, clock = _setup()
    faulty = FaultyStorage(inner, crash_at=k, landed=landed)
    crashed = False
    try:
        _commit_txn(txn_core.Log(faulty, clock=clock))
    except SimulatedCrash:
        crashed = True
    assert crashed, "the crash point was not reached"
    _check_recovered(inner, clock, expect_commit=_commit_decided(inner, clock), recover=recover)


@pytest.mark.matrix(keep=8)
@pytest.mark.parametrize("landed", [False, True], ids=["before-write", "after-write"])
@pytest.mark.parametrize("k", range(ABORT_OPS))
def test_crash_during_abort_never_exposes_the_transaction(k: int, landed: bool, second_phase: str) -> None:
    inner, clock = _setup()
    faulty = FaultyStorage(inner, crash_at=k, landed=landed)
    with pytest.raises(SimulatedCrash):
        _abort_txn(txn_core.Log(faulty, clock=clock))
    _check_recovered(inner, clock, expect_commit=False, recover="reinit")


@pytest.mark.matrix(keep=8)
@pytest.mark.parametrize("k", range(COMMIT_OPS))
def test_ambiguous_write_at_any_step_is_resolved_without_duplicates(k: int, second_phase: str) -> None:
    """The write at step k lands but reports an unknown outcome; the producer must carry on correctly."""
    inner, clock = _setup()
    faulty = FaultyStorage(inner, ambiguous_at=k, only_writes=True)
    _commit_txn(txn_core.Log(faulty, clock=clock))
    seen = _read_all(txn_core.Log(inner, clock=clock))
    assert sorted(seen) == sorted(BASE + TXN)
    assert sorted(_read_all(txn_core.Log(inner, clock=clock), "read_uncommitted")) == sorted(BASE + TXN)


@pytest.mark.matrix(keep=4)
@pytest.mark.parametrize("landed", [False, True], ids=["before-write", "after-write"])
def test_every_commit_crash_point_recovers_on_local_disk(
    tmp_path: Any, landed: bool, second_phase: str, matrix_sample: Any
) -> None:
    """The same crash points on local disk, where a transaction's first data entries are staged while its
    begin record is being created and linked only once it is durable (PROTOCOL.md "Storage")."""
    ops = _count_ops_on(lambda: open_storage(str(tmp_path / f"count-{uuid.uuid4().hex}")))
    for k in matrix_sample(range(ops)):
        inner, clock = _setup(open_storage(str(tmp_path / f"log-{int(landed)}-{k}")))
        with pytest.raises(SimulatedCrash):
            _commit_txn(txn_core.Log(FaultyStorage(inner, crash_at=k, landed=landed), clock=clock))
        _check_recovered(inner, clock, expect_commit=_commit_decided(inner, clock), recover="reinit")


def _count_ops_on(make: Callable[[], Storage], action: Callable[[txn_core.Log], None] | None = None) -> int:
    inner, clock = _setup(make())
    faulty = FaultyStorage(inner)
    (action or _commit_txn)(txn_core.Log(faulty, clock=clock))
    return len(faulty.ops)


def _two_fast_txns(log: txn_core.Log) -> None:
    """Two transactions of one producer whose records count as fast: the first one's markers are written
    before its commit returns, and the second one's begin (carrying the first one's Complete) before its
    entries, on the committing thread (txn_core.clients.producer.completion.FAST_RECORD_S)."""
    p = log.producer(TID, transaction_timeout_ms=10_000)
    p.init_transactions()
    p.begin_transaction()
    p.send("t", pa.table({"id": FIRST}), key_column="id")
    p.commit_transaction()
    p.begin_transaction()
    p.send("t", pa.table({"id": TXN}), key_column="id")
    p.send_offsets_to_transaction({("t", 0): 7}, "grp")
    p.commit_transaction()
    p.close()


def _recover_both(inner: Storage, clock: FakeClock, recover: str, where: str = "") -> txn_core.Log:
    """Recover after a crash in two transactions of TID (FIRST, then TXN) by the id's next
    ``init_transactions`` or by their timeouts passing; each must end all or nothing, committed iff its
    PrepareCommit landed, with nothing holding the last stable offset."""
    first_decided, second_decided = _decided(inner, clock)
    if recover == "reinit":
        txn_core.Log(inner, clock=clock).producer(TID, transaction_timeout_ms=10_000).init_transactions()
    else:
        clock.now += 11_000
    log = txn_core.Log(inner, clock=clock)
    seen = _read_all(log)
    assert len(seen) == len(set(seen)), f"duplicates {where}"
    assert sorted(i for i in seen if i < 1000) == BASE
    assert sorted(i for i in seen if i >= 2000) == (FIRST if first_decided else []), where
    assert sorted(i for i in seen if 1000 <= i < 2000) == (TXN if second_decided else []), where
    for part in log.describe_topic("t").partitions:
        assert part.last_stable_offset == part.log_end_offset, f"{where} partition {part.partition} held: {part}"
    return log


def _carried_stream(log: txn_core.Log, *, second: str) -> None:
    """Two transactions of one producer in a steady stream: the second one's entries carry the first one's
    markers into every partition (PROTOCOL.md "Carried markers"); the second commits or aborts (a marker
    travels in an entry whatever becomes of the entry's own transaction)."""
    p = log.producer(TID, transaction_timeout_ms=10_000, marker_linger_ms=1000)
    p.init_transactions()
    p.begin_transaction()
    p.send("t", pa.table({"id": FIRST}), key_column="id")
    p.commit_transaction()
    p.begin_transaction()
    p.send("t", pa.table({"id": TXN}), key_column="id")
    p.flush()
    if second == "commit":
        p.commit_transaction()
    else:
        p.abort_transaction()
    p.close()


def _carriers(log: txn_core.Log) -> int:
    """Entries of topic ``t`` that carry a marker."""
    n = 0
    for part in range(PARTITIONS):
        plog = log.partition_log(f"topics/t/{part:05d}")
        n += sum(plog.read_header(s).carried is not None for s in range(plog.tail(refresh=True)[0]))
    return n


@pytest.mark.matrix(keep=12)
@pytest.mark.parametrize("second", ["commit", "abort"])
@pytest.mark.parametrize("recover", ["reinit", "timeout"])
@pytest.mark.parametrize("landed", [False, True], ids=["before-write", "after-write"])
def test_every_crash_point_of_markers_carried_by_the_next_entries_recovers_both(
    landed: bool, recover: str, second: str, matrix_sample: Any
) -> None:
    """At every storage step of a transaction whose markers travel in the next transaction's entries (the
    carrier created or not, its retry, the markers nobody carried written alone at the next decision or at
    close, the Complete records): each transaction ends all or nothing, committed iff its PrepareCommit
    landed, and nothing holds the last stable offset afterwards."""
    inner, clock = _setup()
    counting = FaultyStorage(inner)
    _carried_stream(txn_core.Log(counting, clock=clock), second=second)
    assert _carriers(txn_core.Log(inner, clock=clock)) == PARTITIONS, "the second transaction carried the markers"
    for k in matrix_sample(range(len(counting.ops))):
        inner, clock = _setup()
        with pytest.raises(SimulatedCrash):
            _carried_stream(txn_core.Log(FaultyStorage(inner, crash_at=k, landed=landed), clock=clock), second=second)
        _recover_both(inner, clock, recover, f"step {k}")


@pytest.mark.matrix(keep=6)
@pytest.mark.parametrize("landed", [False, True], ids=["before-write", "after-write"])
def test_every_crash_point_of_two_fast_transactions_recovers_on_local_disk(
    tmp_path: Any, landed: bool, matrix_sample: Any
) -> None:
    """Local disk with records counted as fast: markers on the committing thread, the second begin written
    before its entries instead of staged beside them. Each transaction ends all or nothing."""
    with _second_phase("inline"):
        ops = _count_ops_on(lambda: open_storage(str(tmp_path / f"count-{uuid.uuid4().hex}")), _two_fast_txns)
        for k in matrix_sample(range(ops)):
            inner, clock = _setup(open_storage(str(tmp_path / f"log-{int(landed)}-{k}")))
            with pytest.raises(SimulatedCrash):
                _two_fast_txns(txn_core.Log(FaultyStorage(inner, crash_at=k, landed=landed), clock=clock))
            _recover_both(inner, clock, "reinit", f"step {k}")


@pytest.mark.seaweedfs
def test_every_commit_crash_point_recovers_on_a_real_s3_server(seaweed_s3: Any) -> None:
    """The same crash points against SeaweedFS: real conditional PUTs, real listings, real latency.

    Every step is crashed once per run, the crashing write lost at alternate steps and landed at the others,
    which alternate is drawn from the run's seed (``TXNLOG_TEST_SEED``), so that runs cover both at every
    step; local disk crashes every step both ways in every run (the test above)."""
    bucket = seaweed_s3.new_bucket()  # one bucket: SeaweedFS allots volumes per bucket
    seed = int(os.environ.get(SEED_ENV) or 0)
    for k in range(COMMIT_OPS):
        landed = (k + seed) % 2 == 1
        url = f"s3://{bucket}/log-{int(landed)}-{k}"
        inner, clock = _setup(open_storage(url, seaweed_s3.storage_options()))
        with pytest.raises(SimulatedCrash):
            _commit_txn(txn_core.Log(FaultyStorage(inner, crash_at=k, landed=landed), clock=clock))
        _check_recovered(inner, clock, expect_commit=_commit_decided(inner, clock), recover="reinit")


# --- the offsets fence (PROTOCOL.md "Offsets fence") ----------------------------------------------

FENCE_START: dict[tuple[str, int] | txn_core.TopicPartition, int] = {("t", 0): 0}


def _fenced_commit_txn(log: txn_core.Log) -> None:
    """The commit above, with its offsets fenced by a claim on their start position."""
    p = log.producer(TID, transaction_timeout_ms=10_000)
    p.init_transactions()
    p.begin_transaction()
    p.send("t", pa.table({"id": TXN}), key_column="id")
    p.flush()
    p.send_offsets_to_transaction({("t", 0): 7}, "grp", start_offsets=dict(FENCE_START))
    p.commit_transaction()
    p.close()


def _rival_claims(inner: Storage, clock: FakeClock) -> bool:
    """Whether another transactional id can still commit the group's input from the same start."""
    p = txn_core.Log(inner, clock=clock).producer("rival", transaction_timeout_ms=10_000)
    p.init_transactions()
    p.begin_transaction()
    try:
        p.send_offsets_to_transaction({("t", 0): 7}, "grp", start_offsets=dict(FENCE_START))
    except txn_core.GroupFencedError:
        p.abort_transaction()
        return False
    p.abort_transaction()  # only the claim matters here; aborting releases it
    return True


FENCED_COMMIT_OPS = _count_ops(_fenced_commit_txn)


@pytest.mark.matrix(keep=8)
@pytest.mark.parametrize("recover", ["reinit", "timeout"])
@pytest.mark.parametrize("landed", [False, True], ids=["before-write", "after-write"])
@pytest.mark.parametrize("k", range(FENCED_COMMIT_OPS))
def test_crash_during_fenced_commit_keeps_the_claim_iff_it_committed(k: int, landed: bool, recover: str) -> None:
    """At every storage step of a fenced commit (the claim included): all-or-nothing as above, and the
    start position stays claimed exactly when the transaction committed (else the claim is released)."""
    inner, clock = _setup()
    with pytest.raises(SimulatedCrash):
        _fenced_commit_txn(txn_core.Log(FaultyStorage(inner, crash_at=k, landed=landed), clock=clock))
    decided = _commit_decided(inner, clock)
    _check_recovered(inner, clock, expect_commit=decided, recover=recover)
    assert _rival_claims(inner, clock) == (not decided)


@pytest.mark.matrix(keep=4)
@pytest.mark.parametrize("k", range(FENCED_COMMIT_OPS))
def test_ambiguous_write_in_a_fenced_commit_keeps_its_own_claim(k: int) -> None:
    inner, clock = _setup()
    _fenced_commit_txn(txn_core.Log(FaultyStorage(inner, ambiguous_at=k, only_writes=True), clock=clock))
    assert sorted(_read_all(txn_core.Log(inner, clock=clock))) == sorted(BASE + TXN)
    assert not _rival_claims(inner, clock)


# --- a transaction begun before the previous one's Complete (PROTOCOL.md "Transactions") ---------

FIRST = list(range(2000, 2012))  # committed just before TXN by the same producer


@contextlib.contextmanager
def _begin_ahead(on: bool) -> Iterator[None]:
    saved = client.BEGIN_AHEAD
    client.BEGIN_AHEAD = on
    try:
        yield
    finally:
        client.BEGIN_AHEAD = saved


def _back_to_back_txn(log: txn_core.Log, faulty: FaultyStorage | None = None, *, ahead: bool = False) -> None:
    """Two transactions of one producer, the second begun while the first's markers are still being
    written. Without begin ahead: its begin record is created from PrepareCommit, which makes the first the
    id's completing transaction, and its prepare record carries the first one's Complete. With it: the first
    one's prepare began the second ahead, which writes under that reservation with no record, and its
    prepare (waiting for the first one's markers) carries the first one's Complete and begins a third ahead.
    The markers are the background thread's (held back until the second transaction has written)."""
    with _second_phase("background"), _begin_ahead(ahead):
        _back_to_back_in(log, faulty)


def _back_to_back_in(log: txn_core.Log, faulty: FaultyStorage | None) -> None:
    p = log.producer(TID, transaction_timeout_ms=10_000)
    p.init_transactions()
    second_begun = threading.Event()
    write_markers = log.coordinator.write_markers

    def gated(
        prepared: Any, paths: Any = None
    ) -> None:  # the first transaction's markers land only after the next begin
        if prepared.txn is not None and prepared.txn == first_txn[0]:
            while not second_begun.wait(0.001):
                if faulty is not None and faulty.dead:
                    break
        write_markers(prepared, paths)

    log.coordinator.write_markers = gated  # type: ignore[method-assign]
    first_txn: list[Any] = []
    p.begin_transaction()
    p.send("t", pa.table({"id": FIRST}), key_column="id")
    p.flush()
    first_txn.append(p.transaction_id)
    p.commit_transaction()
    p.begin_transaction()
    p.send("t", pa.table({"id": TXN}), key_column="id")
    try:
        p.flush()  # the begin record, from PrepareCommit (or none: begun ahead)
    finally:
        second_begun.set()
    p.send_offsets_to_transaction({("t", 0): 7}, "grp")
    p.commit_transaction()
    p.close()


def _decided(inner: Storage, clock: FakeClock) -> tuple[bool, bool]:
    """Whether the first and the second transaction's PrepareCommit records landed."""
    view = txn_core.Log(inner, clock=clock).coordinator.view_for(TID)
    view.refresh()
    committed = []
    for seq in range(view.next_slot):
        record = view.slots.read(seq)
        from txn_core.coordinator.actions import Prepare, Record
        from txn_core.format import envelope

        key = view.slots.key(seq)
        rec = Record.from_json(envelope.decode(record, key, envelope.ObjectKind.COORDINATOR_RECORD).json(key))
        committed += [a.txn for a in rec.actions if isinstance(a, Prepare) and a.commit]
    first = SETUP_TXN["txn"]
    later = sorted(t for t in committed if t != first)
    return len(later) >= 1, len(later) >= 2


#: Storage operations of two back-to-back transactions, at most (107 plain and 106 ahead when last counted).
#: A constant, not a count taken while collecting: the count varies by a few between runs (the first
#: transaction's markers, a background thread, race the second one's appends to the same partitions, and a
#: lost race costs a read and a retry), and every pytest-xdist worker must collect the same cases. A step past
#: a run's last operation crashes nothing and is checked all the same;
#: test_the_back_to_back_crash_cases_cover_every_operation keeps the constant above the count.
BACK_TO_BACK_STEPS = 112
BACK_TO_BACK_CASES = [(ahead, k) for ahead in (False, True) for k in range(BACK_TO_BACK_STEPS)]


@pytest.mark.parametrize("ahead", [False, True], ids=["plain", "ahead"])
def test_the_back_to_back_crash_cases_cover_every_operation(ahead: bool) -> None:
    counts = [_count_ops(functools.partial(_back_to_back_txn, ahead=ahead)) for _ in range(3)]
    assert max(counts) <= BACK_TO_BACK_STEPS, f"raise BACK_TO_BACK_STEPS to {max(counts)} or more"


@pytest.mark.matrix(keep=16)
@pytest.mark.parametrize("recover", ["reinit", "timeout"])
@pytest.mark.parametrize("landed", [False, True], ids=["before-write", "after-write"])
@pytest.mark.parametrize(
    "ahead, k", BACK_TO_BACK_CASES, ids=[f"{'ahead' if a else 'plain'}-{k}" for a, k in BACK_TO_BACK_CASES]
)
def test_crash_while_the_previous_transaction_is_completing_recovers_both(
    ahead: bool, k: int, landed: bool, recover: str
) -> None:
    """At every storage step of two back-to-back transactions (the second begun from PrepareCommit, its
    prepare carrying the first one's Complete; or begun ahead by the first one's prepare): each transaction
    ends all or nothing, committed iff its PrepareCommit landed, and nothing holds the last stable offset
    afterwards."""
    inner, clock = _setup()
    faulty = FaultyStorage(inner, crash_at=k, landed=landed)
    try:
        _back_to_back_txn(txn_core.Log(faulty, clock=clock), faulty, ahead=ahead)
    except SimulatedCrash:
        pass
    else:  # a step past this run's last operation (BACK_TO_BACK_STEPS): it ran to the end
        assert k >= len(faulty.ops), "the crash point was not reached"
    log = _recover_both(inner, clock, recover)
    view = log.coordinator.view_for(TID)
    view.refresh()
    view._check()
    st = view.state(TID)
    assert st is not None and (recover == "timeout" or not st.open_txns()), st


@pytest.mark.parametrize("ahead", [False, True], ids=["plain", "ahead"])
def test_a_back_to_back_transaction_begins_while_the_previous_one_completes(
    ahead: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scenario above without a crash really takes its path: without begin ahead, the second begin
    record is created from PrepareCommit (the first transaction completing); with it, the second
    transaction has no begin record, and a record of its own (its prepare, or the add of a participant the
    reservation did not name, when the first one's markers are written by then) carries the first one's
    Complete. Both commit. (The linger is raised so that a loaded machine, slow to reach the second
    transaction's records, does not write the first one's Complete alone, a path of its own.)"""
    monkeypatch.setattr(completion, "COMPLETE_LINGER_S", 60.0)
    inner, clock = _setup()
    log = txn_core.Log(inner, clock=clock)
    states: list[Any] = []
    begin, add, end = log.coordinator.begin, log.coordinator.add, log.coordinator.end
    carried: list[Any] = []

    def spy(*args: Any, **kw: Any) -> Any:
        st = begin(*args, **kw)
        states.append(st)
        return st

    def add_spy(*args: Any, **kw: Any) -> Any:
        carried.extend(kw.get("completed", ()))
        return add(*args, **kw)

    def end_spy(*args: Any, **kw: Any) -> Any:
        carried.extend(kw.get("completed", ()))
        return end(*args, **kw)

    log.coordinator.begin = spy  # type: ignore[method-assign]
    log.coordinator.add = add_spy  # type: ignore[method-assign]
    log.coordinator.end = end_spy  # type: ignore[method-assign]
    _back_to_back_txn(log, ahead=ahead)
    if ahead:
        assert [s.completing is not None for s in states] == [False], "only the first transaction has a begin"
        assert len(carried) == 1, "a record of the second transaction carries the first one's Complete"
    else:
        assert [s.completing is not None for s in states] == [False, True]
    assert sorted(_read_all(txn_core.Log(inner, clock=clock))) == sorted(BASE + FIRST + TXN)
    final = txn_core.Log(inner, clock=clock).coordinator.state(TID)
    assert final is not None and final.completing is None and not final.open_txns()


# --- rolling into segments (PROTOCOL.md "Segments") -----------------------------------------------

ROLL_PATH = "topics/r/00000"


def _roll_setup() -> tuple[Storage, FakeClock]:
    """A partition with committed and aborted transactions (inline rows and staged references) and plain
    rows, all decided."""
    from txn_core.partition import staging

    inner = MemoryStorage(f"roll-crash-{uuid.uuid4().hex}")
    clock = FakeClock(1_700_000_000_000)
    log = txn_core.Log(inner, clock=clock)
    log.create_topic("r", 1, SCHEMA)
    p = log.producer("roller-input", transaction_timeout_ms=10_000)
    p.init_transactions()
    plain = log.producer()
    for i in range(6):
        p.begin_transaction()
        p.send("r", pa.table({"id": [i]}), partition=0)
        batch = pa.record_batch({"id": [100 + i]}, schema=SCHEMA)
        ref = staging.write_staged(
            inner, staging.staging_prefix("roller-input", i), "r", 0, [batch], SCHEMA, clock=system_clock
        )
        assert ref is not None
        p.send_staged([ref])
        p.flush()
        if i % 3 == 1:
            p.abort_transaction()
        else:
            p.commit_transaction()
        plain.send("r", pa.table({"id": [200 + i]}), partition=0)
        plain.flush()
    p.close()
    plain.close()
    return inner, clock


def _roll_all(log: txn_core.Log) -> Any:
    from txn_core.ops.rolling import Roller, RollPolicy

    return Roller(log, ROLL_PATH, RollPolicy(entries=1, max_entries=5)).roll(min_age_ms=0)


def _roll_reads(inner: Storage, clock: FakeClock) -> tuple[object, ...]:
    from txn_core.partition.partition import PartitionLog

    out: list[object] = []
    for isolation in ("read_committed", "read_uncommitted"):
        c = txn_core.Log(inner, clock=clock).consumer(isolation_level=isolation)
        c.assign([("r", 0)])
        rows: list[tuple[int, int]] = []
        while (got := c.poll()).num_rows:
            rows += zip(got.column("_offset").to_pylist(), got.column("id").to_pylist(), strict=True)
        out.append(rows)
    plog = PartitionLog(inner, ROLL_PATH, clock=system_clock)
    tail, _end = plog.tail(refresh=True)
    out.append([plog.read_header(s) for s in range(tail)])
    return tuple(out)


def _check_rolled(inner: Storage, clock: FakeClock, before: tuple[object, ...]) -> None:
    """Readers see what they saw before; the next roll completes it; appends continue at the log end."""
    from txn_core.format import paths

    assert _roll_reads(inner, clock) == before
    result = _roll_all(txn_core.Log(inner, clock=clock))
    assert result.chain_end == result.stable_slot
    assert inner.list(paths.entries(ROLL_PATH)) == [], "loose entries left behind"
    assert _roll_reads(inner, clock) == before
    end = before[2][-1].next_offset  # type: ignore[index]
    p = txn_core.Log(inner, clock=clock).producer()
    p.send("r", pa.table({"id": [999]}), partition=0)
    p.flush()
    assert _roll_reads(inner, clock)[0][-1] == (end, 999)  # type: ignore[index]


def _count_roll_ops() -> int:
    inner, clock = _roll_setup()
    _roll_reads(inner, clock)  # as the tests do first (the readers write buffer snapshots)
    faulty = FaultyStorage(inner)
    _roll_all(txn_core.Log(faulty, clock=clock))
    return len(faulty.ops)


ROLL_OPS = _count_roll_ops()


@pytest.mark.matrix(keep=8)
@pytest.mark.parametrize("landed", [False, True], ids=["before-write", "after-write"])
@pytest.mark.parametrize("k", range(ROLL_OPS))
def test_crash_during_a_roll_changes_no_read_and_the_next_roll_completes_it(k: int, landed: bool) -> None:
    """At every storage operation of a roll and its cleanup (segment creates, staged and entry deletes,
    every read and listing): what any reader reads is unchanged, and a fresh roller finishes the job."""
    inner, clock = _roll_setup()
    before = _roll_reads(inner, clock)
    with pytest.raises(SimulatedCrash):
        _roll_all(txn_core.Log(FaultyStorage(inner, crash_at=k, landed=landed), clock=clock))
    _check_rolled(inner, clock, before)


@pytest.mark.matrix(keep=4)
@pytest.mark.parametrize("k", range(ROLL_OPS))
def test_an_ambiguous_write_in_a_roll_is_resolved(k: int) -> None:
    inner, clock = _roll_setup()
    before = _roll_reads(inner, clock)
    _roll_all(txn_core.Log(FaultyStorage(inner, ambiguous_at=k, only_writes=True), clock=clock))
    _check_rolled(inner, clock, before)
