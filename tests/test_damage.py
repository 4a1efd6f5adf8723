"""A damaged entry makes only itself unreadable (PROTOCOL.md "Damage").

A flipped bit or a truncation in one entry's header, in the middle of a partition or at its end, on local
disk, in memory and on S3 (moto): ``describe`` still works and reports it; readers deliver everything before
it and then fail naming the object, position unchanged; planning works up to it; appends after a damaged
last entry fail. Once an operator marks it lost, every reader skips exactly its offsets with a warning,
nothing is delivered twice, no aborted record shows, transactions whose marker it was keep their outcome,
and appends go on. A reader that chose to skip damage passes it without the mark, and only that reader.
"""

from __future__ import annotations

import logging
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from damaging import damage_segment_payload, flip_bit, segment_rows

import txn_core
from conftest import make_location
from txn_core.clock import system_clock
from txn_core.coordinator.txnlog import TxnStatus
from txn_core.errors import ConfigurationError, DamagedEntryError, TxnLogError
from txn_core.format import paths
from txn_core.format.entry import HEADER_SIZE, EntryKind
from txn_core.ops.maintenance import roll_segments
from txn_core.ops.rolling import RollPolicy
from txn_core.partition import partition, staging
from txn_core.partition.lost import ABORT, COMMIT, UNKNOWN
from txn_core.partition.ranges import available_end, plan_range, read_range
from txn_core.partition.reader import READ_COMMITTED, READ_UNCOMMITTED

SCHEMA = pa.schema([("x", pa.int64())])
PATH = paths.partition_log_path("t", 0)
ENTRIES = 4  # of 2 records each: entry n holds offsets (and values) 2n, 2n + 1
WHERE = {"middle": 2, "last": ENTRIES - 1}


def build(log: txn_core.Log) -> None:
    """Topic ``t``: four entries of an idempotent producer, each holding its own offsets as values."""
    log.create_topic("t", 1, SCHEMA)
    with log.producer() as producer:
        for n in range(ENTRIES):
            producer.send("t", pa.table({"x": [2 * n, 2 * n + 1]}, schema=SCHEMA), partition=0)
            producer.flush()


def damage(log: txn_core.Log, slot: int, how: str = "flip") -> str:
    """Damage the header of the entry at ``slot`` (through the storage interface: any backend)."""
    key = log.partition_log(PATH).entries.key(slot)
    data = bytearray(log.storage.read(key))
    if how == "flip":
        data[20] ^= 0x01  # record_count: the header checksum no longer matches
    else:
        data = data[: HEADER_SIZE // 2]
    log.storage.delete(key)
    log.storage.create(key, [bytes(data)])
    return key


def consume(log: txn_core.Log, **kwargs: Any) -> tuple[list[int], TxnLogError | None, txn_core.Consumer]:
    consumer = log.consumer(**kwargs)
    consumer.assign([("t", 0)])
    got: list[int] = []
    try:
        while (table := consumer.poll(3)).num_rows:
            got.extend(table.column("x").to_pylist())
    except TxnLogError as exc:
        return got, exc, consumer
    return got, None, consumer


def ranged(log: txn_core.Log, *, fail_on_data_loss: bool = True, skip: bool = False) -> list[int]:
    """Plan the whole available range on one log client and read it on another (the Spark split)."""
    state = log.partition_state(PATH, shared=False)
    state.skip_damaged = skip
    end = available_end(state, READ_COMMITTED)
    rng = plan_range(state, "t", 0, 0, end, READ_COMMITTED)
    worker = txn_core.Log(log.storage).partition_log(PATH)
    return [x for b in read_range(worker, rng, fail_on_data_loss=fail_on_data_loss) for x in b.column("x").to_pylist()]


def lost_warnings(caplog: pytest.LogCaptureFixture, key: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "txnlog.damage" and key in r.getMessage()]


@pytest.mark.parametrize("how", ["flip", "truncate"])
@pytest.mark.parametrize("where", ["middle", "last"])
@pytest.mark.parametrize("backend", ["local", "memory", "moto"])
def test_a_damaged_header_makes_only_that_entry_unreadable(
    request: pytest.FixtureRequest, tmp_path: Path, backend: str, where: str, how: str
) -> None:
    location = make_location(backend, request, tmp_path)
    build(location.open())
    slot = WHERE[where]
    first = 2 * slot
    key = damage(location.open(), slot, how)
    log = location.open()

    part = log.describe_topic("t").partitions[0]  # describe works and says what is wrong
    (reported,) = part.damaged_entries
    assert (reported.slot, reported.key, reported.first_offset, reported.marked_lost) == (slot, key, first, False)
    assert reported.next_offset == (first + 2 if where == "middle" else None)
    assert part.last_stable_offset == first
    assert part.log_end_offset == (2 * ENTRIES if where == "middle" else first)
    assert log.find_hanging_transactions("t") == []

    got, error, consumer = consume(log)  # reads before it deliver, reads past it fail naming it
    assert got == list(range(first)), "everything before the damaged entry, once, in order"
    assert isinstance(error, DamagedEntryError) and key in str(error) and "mark-lost" in str(error)
    assert consumer.position(("t", 0)) == first
    with pytest.raises(DamagedEntryError, match=key):
        consumer.poll()
    assert consumer.position(("t", 0)) == first, "the position stays on the first undelivered record"

    state = log.partition_state(PATH, shared=False)
    assert available_end(state, READ_COMMITTED) == first, "planning works up to it"
    assert state.damage is not None and state.damage.key == key
    assert ranged(log) == list(range(first))

    producer = log.producer()
    producer.send("t", pa.table({"x": [100]}, schema=SCHEMA), partition=0)
    if where == "last":  # the log end is unknown: appending would guess an offset
        with pytest.raises(DamagedEntryError, match=key):
            producer.flush()
    else:
        producer.flush()
        assert log.partition_log(PATH).end_offset() == 2 * ENTRIES + 1


@pytest.mark.parametrize("where", ["middle", "last"])
@pytest.mark.parametrize("backend", ["local", "memory"])
def test_offsets_marked_lost_are_skipped_by_every_reader_with_a_warning(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    backend: str,
    where: str,
) -> None:
    location = make_location(backend, request, tmp_path)
    build(location.open())
    slot = WHERE[where]
    first = 2 * slot
    key = damage(location.open(), slot)
    log = location.open()
    records = None if where == "middle" else 2
    lost = log.mark_lost("t", 0, slot, reason="bit rot, no replica", records=records)
    assert (lost.first_offset, lost.next_offset, lost.marked, lost.sealed) == (first, first + 2, True, where == "last")
    assert log.mark_lost("t", 0, slot, reason="again", records=records) == lost, "marking twice changes nothing"

    with log.producer() as producer:  # appends go on, after the seal when it was the last entry
        producer.send("t", pa.table({"x": [100]}, schema=SCHEMA), partition=0)
    expected = [x for x in range(2 * ENTRIES) if not first <= x < first + 2] + [100]

    caplog.set_level(logging.WARNING, logger="txnlog")
    fresh = location.open()
    got, error, _ = consume(fresh)
    # The entry after a lost one continues its producer's sequence past the lost numbers: it is delivered,
    # not refused as a sequence gap.
    assert error is None and got == expected, "everything but the lost offsets, each once"
    assert lost_warnings(caplog, key), "never a silent skip"
    assert ranged(location.open()) == expected
    assert consume(location.open(), isolation_level=READ_UNCOMMITTED)[0] == expected

    part = location.open().describe_topic("t").partitions[0]
    (reported,) = part.damaged_entries
    assert reported.marked_lost and reported.reason == "bit rot, no replica" and reported.by
    assert part.last_stable_offset == part.log_end_offset
    if where == "last":
        seal = fresh.partition_log(PATH).read_header(slot + 1)
        assert seal.kind is EntryKind.SEAL and seal.base_offset == first + 2


def _two_transactions(log: txn_core.Log) -> None:
    """Transaction A (values 1, 2) commits, B (10, 11) aborts, then a plain record 99: entries
    ``A data, A COMMIT, B data, B ABORT, 99`` in slots 0..4."""
    log.create_topic("t", 1, SCHEMA)
    for tid, values, commit in (("a", [1, 2], True), ("b", [10, 11], False)):
        producer = log.producer(tid)
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("t", pa.table({"x": values}, schema=SCHEMA), partition=0)
        producer.flush()
        if commit:
            producer.commit_transaction()
        else:
            producer.abort_transaction()
        producer.close()
    with log.producer() as plain:
        plain.send("t", pa.table({"x": [99]}, schema=SCHEMA), partition=0)
    kinds = [log.partition_log(PATH).read_header(s).kind for s in range(5)]
    assert kinds == [EntryKind.DATA, EntryKind.COMMIT, EntryKind.DATA, EntryKind.ABORT, EntryKind.DATA]


def test_transactions_whose_marker_is_lost_keep_their_outcome(caplog: pytest.LogCaptureFixture) -> None:
    url = f"memory://{uuid.uuid4().hex}"
    log = txn_core.open_log(url)
    _two_transactions(log)
    commit_key, abort_key = damage(log, 1), damage(log, 3)

    got, error, _ = consume(txn_core.open_log(url))
    assert got == [1, 2], "A is committed in the transaction log: its data before the damage is delivered"
    assert isinstance(error, DamagedEntryError) and commit_key in str(error)
    with pytest.raises(ConfigurationError, match="slot 1 is damaged and not marked lost"):
        log.mark_lost("t", 0, 3, reason="bit rot")  # in slot order only

    first = log.mark_lost("t", 0, 1, reason="bit rot")
    second = log.mark_lost("t", 0, 3, reason="bit rot")
    assert [o for _, o in first.outcomes] == [COMMIT], "A was open before its lost marker"
    assert sorted(o for _, o in second.outcomes) == [ABORT, COMMIT], "A still open there (its marker is lost), B"

    caplog.set_level(logging.WARNING, logger="txnlog")
    got, error, _ = consume(txn_core.open_log(url))
    assert error is None and got == [1, 2, 99], "A's records once, B's never"
    assert lost_warnings(caplog, commit_key) and lost_warnings(caplog, abort_key)
    assert ranged(txn_core.open_log(url)) == [1, 2, 99]
    assert consume(txn_core.open_log(url), isolation_level=READ_UNCOMMITTED)[0] == [1, 2, 10, 11, 99]

    # A snapshot carries what the lost entries said: a reader starting from it decides the same way.
    again = txn_core.open_log(url)
    state = again.partition_state(PATH, shared=False)
    state.scan_to_end()
    state.snapshots.write(state.buffer.copy(), 0)
    loaded = txn_core.open_log(url).partition_state(PATH, shared=False).buffer
    assert loaded.lost_outcomes == state.buffer.lost_outcomes and len(loaded.lost_outcomes) == 2
    consumer = txn_core.open_log(url).consumer()
    consumer.assign([("t", 0)])
    consumer.seek(("t", 0), 0)
    assert consumer.poll().column("x").to_pylist() == [1, 2, 99]


def test_an_entry_damaged_after_a_snapshot_past_it_can_be_marked_lost(caplog: pytest.LogCaptureFixture) -> None:
    """Bit rot meets an entry that a reader's snapshot already passed: marking it lost scans the
    transactions open before it from an older snapshot (or the log start), not from the newer one."""
    url = f"memory://{uuid.uuid4().hex}"
    log = txn_core.open_log(url)
    _two_transactions(log)
    state = log.partition_state(PATH, shared=False)
    state.scan_to_end()
    state.snapshots.write(state.buffer.copy(), 0)  # at offset 7, after all five entries
    commit_key = damage(log, 1)  # A's COMMIT marker
    lost = log.mark_lost("t", 0, 1, reason="bit rot")
    assert (lost.first_offset, lost.next_offset) == (2, 3)
    assert [o for _, o in lost.outcomes] == [COMMIT], "A was open just before its lost marker"
    caplog.set_level(logging.WARNING, logger="txnlog")
    got, error, _ = consume(txn_core.open_log(url))
    assert error is None and got == [1, 2, 99] and lost_warnings(caplog, commit_key)


def test_a_transaction_whose_outcome_was_unknown_when_marked_delivers_nothing(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"memory://{uuid.uuid4().hex}"
    log = txn_core.open_log(url)
    _two_transactions(log)
    damage(log, 1)
    # The transaction log no longer keeps A's outcome (finished long ago) when the operator marks it.
    monkeypatch.setattr(log.coordinator, "resolve", lambda txn: TxnStatus(txn, None))
    lost = log.mark_lost("t", 0, 1, reason="bit rot")
    assert [o for _, o in lost.outcomes] == [UNKNOWN]
    monkeypatch.undo()

    caplog.set_level(logging.WARNING, logger="txnlog")
    got, error, _ = consume(txn_core.open_log(url))  # the record decides, whatever the log knows today
    assert error is None and got == [99], "A cannot be shown committed: nothing of it; B aborted"
    assert any("outcome is no longer known" in r.getMessage() for r in caplog.records)
    assert ranged(txn_core.open_log(url)) == [99]


@pytest.mark.parametrize("known", [True, False], ids=["outcomes-recorded", "outcome-unknown"])
def test_a_partition_whose_markers_are_lost_still_rolls(monkeypatch: pytest.MonkeyPatch, known: bool) -> None:
    """A transaction whose marker was marked lost stays open in the buffer: the stable slot stopped at its
    data, and no segment was ever rolled in that partition again (its loose entries piled up). The roll now
    passes a transaction that a lost entry's record decided, as readers do; they read the same afterwards."""
    url = f"memory://{uuid.uuid4().hex}"
    log = txn_core.open_log(url)
    _two_transactions(log)  # A data, A COMMIT, B data, B ABORT, 99
    damage(log, 1), damage(log, 3)
    if not known:  # the transaction log no longer keeps A's and B's outcomes when the operator marks them
        monkeypatch.setattr(log.coordinator, "resolve", lambda txn: TxnStatus(txn, None))
    log.mark_lost("t", 0, 1, reason="bit rot")
    log.mark_lost("t", 0, 3, reason="bit rot")
    monkeypatch.undo()
    with log.producer() as plain:
        plain.send("t", pa.table({"x": [100]}, schema=SCHEMA), partition=0)
    expected = [1, 2, 99, 100] if known else [99, 100]  # an outcome nobody knows delivers nothing
    assert consume(txn_core.open_log(url))[0] == expected

    (rolled,) = roll_segments(log, "t", policy=RollPolicy(entries=1, bytes=1), min_age_ms=0, check_min_age=False)
    assert rolled.stable_slot == 6 and rolled.chain_end == 6, "the roll passes the transactions the records decided"
    assert (rolled.segments, rolled.entries, rolled.deleted_entries) == (3, 4, 4), "segments end before lost entries"
    assert sorted(log.partition_log(PATH).entries.list_slots()) == [1, 3], "only the lost entries stay loose"
    fresh = txn_core.open_log(url)
    got, error, _ = consume(fresh)
    assert error is None and got == expected
    assert ranged(fresh) == expected
    assert consume(fresh, isolation_level=READ_UNCOMMITTED)[0] == [1, 2, 10, 11, 99, 100]


def test_a_roll_past_a_lost_abort_marker_keeps_the_aborted_references_staged_objects() -> None:
    """An aborted transaction's references are rolled as aborted rows even when its abort marker is lost
    (the transaction is still open in the buffer): their staged objects stay, because a later transaction
    may reference the same objects (the Spark sink commits a batch's objects again after its first attempt
    aborted). Rolled as delivered rows, the cleanup deleted them under the later reference: its rows lost."""
    url = f"memory://{uuid.uuid4().hex}"
    log = txn_core.open_log(url)
    log.create_topic("t", 1, SCHEMA)
    batch = pa.record_batch({"x": [7, 8]})
    ref = staging.write_staged(log.storage, staging.staging_prefix("w", 1), "t", 0, [batch], SCHEMA, clock=system_clock)
    assert ref is not None
    producer = log.producer("sink")
    producer.init_transactions()
    producer.begin_transaction()
    producer.send_staged([ref])
    producer.abort_transaction()  # the first attempt: slots 0 (reference), 1 (ABORT)
    producer.wait_for_completion()
    producer.begin_transaction()
    producer.send_staged([ref])  # the second attempt references the same object (slot 2), still open
    damage(log, 1)
    assert [o for _, o in log.mark_lost("t", 0, 1, reason="bit rot").outcomes] == [ABORT]

    (rolled,) = roll_segments(log, "t", policy=RollPolicy(entries=1, bytes=1), min_age_ms=0, check_min_age=False)
    assert (rolled.stable_slot, rolled.chain_end, rolled.deleted_entries) == (2, 2, 1)
    assert log.storage.exists(ref.key), "the aborted reference's staged object is kept"
    producer.commit_transaction()
    producer.close()
    fresh = txn_core.open_log(url)
    got, error, _ = consume(fresh)
    assert error is None and got == [7, 8], "the committed attempt's rows, once; the aborted one's never"
    assert ranged(fresh) == [7, 8]


@pytest.mark.parametrize("which", ["marker", "plain"])
def test_a_missing_entry_marked_lost_is_still_a_hole_once_everything_after_it_is_rolled(
    monkeypatch: pytest.MonkeyPatch, which: str
) -> None:
    """An entry object lost by the store (a hole) and marked lost: a roll puts the entries after it in
    segments and deletes their loose objects. A reader missing the slot must still see that entries follow
    (a segment starts after it), not take it for the log's end: it stopped there and delivered nothing more
    (for a lost marker, not even the transaction's records before it)."""
    monkeypatch.setattr(partition, "LOG_START_RECHECK_S", 0.0)  # before the roll, a reader probes past a miss
    url = f"memory://{uuid.uuid4().hex}"
    log = txn_core.open_log(url)
    if which == "marker":
        _two_transactions(log)  # A data, A COMMIT, B data, B ABORT, 99
        expected = [1, 2, 99]
    else:
        build(log)  # four plain entries: 0 1 | 2 3 | 4 5 | 6 7
        expected = [0, 1, 4, 5, 6, 7]
    log.storage.delete(log.partition_log(PATH).entries.key(1))
    log.mark_lost("t", 0, 1, reason="object lost")
    assert consume(txn_core.open_log(url))[0] == expected
    (rolled,) = roll_segments(log, "t", policy=RollPolicy(entries=1, bytes=1), min_age_ms=0, check_min_age=False)
    assert rolled.chain_end == len(log.partition_log(PATH).entries.list_slots()) + rolled.deleted_entries + 1
    assert log.partition_log(PATH).entries.list_slots() == [], "every entry after the hole is rolled and deleted"
    fresh = txn_core.open_log(url)
    got, error, _ = consume(fresh)
    assert error is None and got == expected
    assert ranged(fresh) == expected


def test_a_roll_past_a_lost_abort_marker_drops_rows_whose_staged_object_is_gone() -> None:
    """The aborted attempt's staged object was deleted (as ``abort_staged`` does) and its abort marker is
    lost: the roll drops those rows (form 2), as for any aborted reference, instead of failing the roll
    with "committed references ... which does not exist" (readers never needed them)."""
    url = f"memory://{uuid.uuid4().hex}"
    log = txn_core.open_log(url)
    log.create_topic("t", 1, SCHEMA)
    prefix = staging.staging_prefix("w", 1)
    aborted = staging.write_staged(
        log.storage, prefix, "t", 0, [pa.record_batch({"x": [7, 8]})], SCHEMA, clock=system_clock
    )
    committed = staging.write_staged(
        log.storage, prefix, "t", 0, [pa.record_batch({"x": [9]})], SCHEMA, clock=system_clock
    )
    assert aborted is not None and committed is not None
    producer = log.producer("sink")
    producer.init_transactions()
    for ref, commit in ((aborted, False), (committed, True)):  # slots 0 and 1 (ABORT), 2 and 3 (COMMIT)
        producer.begin_transaction()
        producer.send_staged([ref])
        producer.commit_transaction() if commit else producer.abort_transaction()
        producer.wait_for_completion()
    producer.close()
    staging.delete_keys(log.storage, [aborted.key])
    damage(log, 1)
    assert [o for _, o in log.mark_lost("t", 0, 1, reason="bit rot").outcomes] == [ABORT]
    (rolled,) = roll_segments(log, "t", policy=RollPolicy(entries=1, bytes=1), min_age_ms=0, check_min_age=False)
    assert rolled.chain_end == 4
    fresh = txn_core.open_log(url)
    assert consume(fresh)[0] == [9] and ranged(fresh) == [9]


def test_an_unknown_outcome_does_not_let_a_roll_pass_damage_its_marker_may_lie_behind(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A transaction open across a lost entry whose record says "unknown", and its marker damaged and not
    (yet) marked lost: readers wait at it, for the marker may be restored. The roll must not pass them."""
    url = f"memory://{uuid.uuid4().hex}"
    log = txn_core.open_log(url)
    log.create_topic("t", 1, SCHEMA)
    producer = log.producer("a")
    producer.init_transactions()
    producer.begin_transaction()
    producer.send("t", pa.table({"x": [7, 8]}, schema=SCHEMA), partition=0)
    producer.flush()  # slot 0
    with log.producer() as plain:
        plain.send("t", pa.table({"x": [50]}, schema=SCHEMA), partition=0)  # slot 1
    producer.commit_transaction()  # its marker: slot 2
    producer.close()
    with log.producer() as plain:
        plain.send("t", pa.table({"x": [99]}, schema=SCHEMA), partition=0)  # slot 3
    marker = log.partition_log(PATH).entries.key(2)
    intact = log.storage.read(marker)
    damage(log, 1), damage(log, 2)
    monkeypatch.setattr(log.coordinator, "resolve", lambda txn: TxnStatus(txn, None))
    assert [o for _, o in log.mark_lost("t", 0, 1, reason="bit rot", records=1).outcomes] == [UNKNOWN]
    monkeypatch.undo()
    (rolled,) = roll_segments(log, "t", policy=RollPolicy(entries=1, bytes=1), min_age_ms=0, check_min_age=False)
    assert (rolled.stable_slot, rolled.segments) == (0, 0), "the roll waits at the transaction, as readers do"
    log.storage.delete(marker)
    log.storage.create(marker, [intact])  # restored from a backup: the marker decides
    assert consume(txn_core.open_log(url))[0] == [7, 8, 99]


@pytest.mark.parametrize("how", ["flip", "truncate"])
def test_a_reader_that_chose_to_skip_damage_passes_it_alone(caplog: pytest.LogCaptureFixture, how: str) -> None:
    url = f"memory://{uuid.uuid4().hex}"
    log = txn_core.open_log(url)
    build(log)
    key = damage(log, 1, how)
    caplog.set_level(logging.WARNING, logger="txnlog")
    got, error, _ = consume(txn_core.open_log(url), skip_damaged=True)
    assert error is None and got == [0, 1, 4, 5, 6, 7]
    assert any("not marked lost" in m for m in lost_warnings(caplog, key))
    assert ranged(txn_core.open_log(url), fail_on_data_loss=False, skip=True) == [0, 1, 4, 5, 6, 7]
    with pytest.raises(DamagedEntryError):
        ranged(txn_core.open_log(url), fail_on_data_loss=True, skip=True)  # planned past it, read refuses
    state = txn_core.open_log(url).partition_state(PATH, shared=False)
    state.skip_damaged = True
    state.scan_to_end()
    assert state.buffer.position == 2 * ENTRIES and state.buffer.skipped_unmarked
    with pytest.raises(ValueError, match="never snapshotted"):
        state.snapshots.write(state.buffer, 0)  # another reader must not inherit this reader's choice
    assert consume(txn_core.open_log(url))[1] is not None, "other readers still stop at it"


def test_a_damaged_payload_is_skipped_once_marked_lost(caplog: pytest.LogCaptureFixture) -> None:
    url = f"memory://{uuid.uuid4().hex}"
    log = txn_core.open_log(url)
    build(log)
    key = log.partition_log(PATH).entries.key(1)
    data = bytearray(log.storage.read(key))
    data[-3] ^= 0xFF  # the header is intact: only the records are gone
    log.storage.delete(key)
    log.storage.create(key, [bytes(data)])
    got, error, consumer = consume(txn_core.open_log(url))
    # the same error as a damaged header, with the same ways out (inspecting it needs the payload check)
    assert got == [0, 1] and isinstance(error, DamagedEntryError) and key in str(error)
    assert "payload checksum" in str(error) and "mark-lost URL --topic t --partition 0 --slot 1" in str(error)
    assert "damaged URL --verify-payloads" in str(error)
    with pytest.raises(DamagedEntryError, match=key):
        consumer.poll()
    assert consumer.position(("t", 0)) == 2, "the position stays on the first undelivered record"
    (found,) = log.damaged_entries("t", 0, payloads=True)
    assert found.header_intact and found.kind == "DATA" and "payload checksum" in found.check
    assert log.damaged_entries("t", 0) == [], "a header scan does not read payloads"
    lost = log.mark_lost("t", 0, 1, reason="bit rot")
    assert lost.header_intact and (lost.first_offset, lost.next_offset) == (2, 4)
    caplog.set_level(logging.WARNING, logger="txnlog")
    got, error, _ = consume(txn_core.open_log(url))
    assert error is None and got == [0, 1, 4, 5, 6, 7] and lost_warnings(caplog, key)
    assert ranged(txn_core.open_log(url)) == [0, 1, 4, 5, 6, 7]


def test_marking_lost_refuses_what_it_cannot_stand_behind() -> None:
    url = f"memory://{uuid.uuid4().hex}"
    log = txn_core.open_log(url)
    build(log)
    with pytest.raises(ConfigurationError, match="reads fine"):
        log.mark_lost("t", 0, 1, reason="just because")
    with pytest.raises(ConfigurationError, match="no entry at slot 9"):
        log.mark_lost("t", 0, 9, reason="typo")
    damage(log, 3)
    with pytest.raises(ConfigurationError, match=r"last entry .* --records K"):
        log.mark_lost("t", 0, 3, reason="bit rot")
    damage(log, 1)
    with pytest.raises(ConfigurationError, match=r"holds offsets \[2, 4\) by its neighbours: 2 records, not 5"):
        log.mark_lost("t", 0, 1, reason="bit rot", records=5)
    with pytest.raises(ConfigurationError, match="needs a reason"):
        log.mark_lost("t", 0, 1, reason=" ")
    assert log.storage.list(paths.lost_entries(PATH)) == [], "nothing was marked"


def test_damage_inside_a_segment_and_in_a_marker_is_found_and_marked_lost(caplog: pytest.LogCaptureFixture) -> None:
    """A rolled partition has no loose entries from its log start on: the damage scan and ``mark_lost`` take
    the log's extent from its segments too (they took the first rolled slot for the end, so nothing in a
    segment could be listed or marked lost). With ``payloads``, a marker's payload is checked as well, though
    readers act on its header alone."""
    url = f"memory://{uuid.uuid4().hex}"
    log = txn_core.open_log(url)
    log.create_topic("t", 1, SCHEMA)
    p = log.producer("rolled", marker_linger_ms=0)  # markers alone: damage in one is a case of its own
    p.init_transactions()
    for n in range(20):  # transaction n: records 3n, 3n + 1, 3n + 2 (a marker may land after the next data)
        p.begin_transaction()
        p.send("t", pa.table({"x": [3 * n, 3 * n + 1, 3 * n + 2]}, schema=SCHEMA), partition=0)
        p.commit_transaction()
    p.wait_for_completion()
    (rolled,) = roll_segments(
        log, "t", policy=RollPolicy(entries=1, bytes=1, max_entries=64), min_age_ms=0, check_min_age=False
    )
    assert rolled.chain_end == 40 and rolled.deleted_entries == 40
    p.begin_transaction()
    p.send("t", pa.table({"x": [60]}, schema=SCHEMA), partition=0)
    p.commit_transaction()
    p.close()
    segment = log.partition_log(PATH).segments.key(0)
    # Every transaction runs at a fresh epoch: the sixth data entry by epoch holds transaction 5's records.
    data = sorted(h.producer_epoch for _, h, _ in segment_rows(log, segment) if h.kind is EntryKind.DATA)
    slot = damage_segment_payload(log, segment, lambda h: h.kind is EntryKind.DATA and h.producer_epoch == data[5])
    marker = log.partition_log(PATH).entries.key(41)
    flip_bit(log, marker, len(log.storage.read(marker)) - 1)
    fresh = txn_core.open_log(url)
    found = fresh.damaged_entries("t", 0, payloads=True)
    assert [(d.slot, d.kind) for d in found] == [(slot, "DATA"), (41, "COMMIT")]
    assert all("payload checksum" in d.check for d in found)
    got, error, _ = consume(fresh)
    assert got == list(range(15)) and error is not None and segment in str(error)
    lost = fresh.mark_lost("t", 0, slot, reason="bit rot")
    assert lost.next_offset - lost.first_offset == 3
    caplog.set_level(logging.WARNING, logger="txnlog")
    got, error, _ = consume(txn_core.open_log(url))
    expected = [x for x in range(61) if not 15 <= x < 18]
    assert error is None and got == expected
    assert ranged(txn_core.open_log(url)) == expected
