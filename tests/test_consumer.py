"""The consumer: assignment, positions, seeking, metadata columns, group offsets."""

from __future__ import annotations

import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from fakeclock import FakeClock

import txn_core
from conftest import make_location
from txn_core.errors import ConfigurationError, DataLossError
from txn_core.storage import MemoryStorage, Storage, open_storage

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string())])


@pytest.fixture(params=["memory", pytest.param("seaweedfs", marks=pytest.mark.seaweedfs)])
def log(request: pytest.FixtureRequest, tmp_path: Path) -> txn_core.Log:
    """Five entries over two partitions, in memory and, in the ``seaweedfs`` tier, on a real S3 server."""
    if request.param == "memory":
        storage: Storage = MemoryStorage(uuid.uuid4().hex)
    else:
        location = make_location("seaweedfs", request, tmp_path)
        storage = open_storage(location.url, location.storage_options)
    log = txn_core.Log(storage)
    log.create_topic("t", 2, SCHEMA)
    p = log.producer()
    for i in range(5):
        p.send("t", pa.table({"id": [i * 10 + j for j in range(10)], "name": ["n"] * 10}), partition=i % 2)
        p.flush()
    return log


def test_poll_returns_topic_columns_plus_metadata(log: txn_core.Log) -> None:
    c = log.consumer()
    c.assign([("t", 0)])
    table = c.poll()
    assert table.schema.names == ["id", "name", "_topic", "_partition", "_offset", "_timestamp"]
    assert table.schema.field("_timestamp").type == pa.timestamp("ms", tz="UTC")
    assert table.column("_offset").to_pylist() == list(range(30))
    assert set(table.column("_topic").to_pylist()) == {"t"}
    assert set(table.column("_partition").to_pylist()) == {0}
    assert c.position(("t", 0)) == 30
    empty = c.poll()
    assert empty.num_rows == 0 and empty.schema == table.schema


def test_max_records_and_seek(log: txn_core.Log) -> None:
    c = log.consumer()
    c.assign([("t", 0), ("t", 1)])
    got = c.poll(max_records=7)
    assert got.num_rows == 7
    c.seek(("t", 1), 15)
    rest: list[tuple[int, int]] = []
    while (t := c.poll(max_records=4)).num_rows:
        assert t.num_rows <= 4
        rest.extend(zip(t.column("_partition").to_pylist(), t.column("_offset").to_pylist(), strict=True))
    p1 = [o for p, o in rest if p == 1]
    assert p1 == list(range(15, 20))
    c.seek(("t", 0), 12)  # mid-entry seek
    assert c.poll(max_records=3).column("_offset").to_pylist() == [12, 13, 14]


def test_commit_and_committed_and_resume(log: txn_core.Log) -> None:
    c = log.consumer("g1")
    c.assign([("t", 0), ("t", 1)])
    c.poll(max_records=12)
    positions = {tp: c.position(tp) for tp in c.assignment()}
    c.commit()
    assert {tp: c.committed(tp) for tp in c.assignment()} == positions
    c2 = txn_core.Log(log.storage).consumer("g1")
    c2.assign([("t", 0), ("t", 1)])
    assert {tp: c2.position(tp) for tp in c2.assignment()} == positions  # resumes at the committed offsets
    assert "g1" in log.list_groups()
    rows = {(r["topic"], r["partition"]): r for r in log.describe_group("g1")}
    assert rows[("t", 0)]["lag"] == 30 - positions[txn_core.TopicPartition("t", 0)]


def test_auto_offset_reset_latest(log: txn_core.Log) -> None:
    c = log.consumer(auto_offset_reset="latest")
    c.assign([("t", 0)])
    assert c.poll().num_rows == 0
    p = log.producer()
    p.send("t", pa.table({"id": [999], "name": ["new"]}), partition=0)
    p.flush()
    assert c.poll().column("id").to_pylist() == [999]


@pytest.mark.parametrize("how", ["seek_to_end", "auto_offset_reset"])
def test_read_committed_end_is_the_last_stable_offset(log: txn_core.Log, how: str) -> None:
    """As Kafka's ``seekToEnd`` under read_committed: the end is the last stable offset, so the records of
    a transaction open there, and those written after it, are read once it commits (from the log end they
    would be passed over for good)."""
    p = log.producer("open-txn")
    p.init_transactions()
    p.begin_transaction()
    p.send("t", pa.table({"id": [100], "name": ["in the open transaction"]}), partition=0)
    p.flush()
    plain = log.producer()
    plain.send("t", pa.table({"id": [101], "name": ["after it"]}), partition=0)
    plain.flush()
    c = log.consumer(auto_offset_reset="latest" if how == "auto_offset_reset" else "earliest")
    c.assign([("t", 0)])
    if how == "seek_to_end":
        c.seek_to_end(("t", 0))
    assert c.position(("t", 0)) == 30  # the transaction's first offset; the log end is 32
    assert c.poll().num_rows == 0
    p.commit_transaction()
    p.wait_for_markers()
    assert c.poll().column("id").to_pylist() == [100, 101]
    uncommitted = log.consumer(isolation_level="read_uncommitted")
    uncommitted.assign([("t", 0)])
    uncommitted.seek_to_end(("t", 0))
    assert uncommitted.position(("t", 0)) == 33  # the log end, past the commit marker


def test_committing_offsets_of_partitions_that_do_not_exist_is_refused(log: txn_core.Log) -> None:
    c = log.consumer("g-bad")
    with pytest.raises(ConfigurationError, match="partition 7 does not exist in topic 't'"):
        c.commit({("t", 0): 3, ("t", 7): 1})
    with pytest.raises(txn_core.TopicNotFoundError, match="nosuchtopic"):
        c.commit({("nosuchtopic", 0): 1})
    assert log.groups.committed("g-bad") == {}, "nothing of a refused commit is written"


def test_a_committed_offset_beyond_the_log_end_names_the_group_and_the_fix(log: txn_core.Log) -> None:
    log.consumer("g-far").commit({("t", 0): 10**9})  # not checked against the log end, as in Kafka
    with pytest.raises(txn_core.OffsetOutOfRangeError, match=r"group 'g-far' committed offset 1000000000.*commit\("):
        log.consumer("g-far").assign([("t", 0)])
    fixer = log.consumer("g-far")
    fixer.commit({("t", 0): 5})
    again = log.consumer("g-far")
    again.assign([("t", 0)])
    assert again.position(("t", 0)) == 5


@pytest.mark.parametrize(
    ("call", "fragment"),
    [
        (lambda lg: lg.consumer(isolation_level="dirty"), "isolation_level must be one of"),
        (lambda lg: lg.consumer(auto_offset_reset="middle"), "auto_offset_reset must be one of"),
        (lambda lg: lg.consumer().assign([("t", 7)]), "partition 7 does not exist"),
        (lambda lg: lg.consumer().poll(), "no partitions assigned"),
        (lambda lg: lg.consumer().commit(), "needs a consumer with a group_id"),
        (lambda lg: lg.consumer("bad/group"), "invalid group name"),
        (lambda lg: lg.consumer().assign(None), r"assign\(\) takes a list of \(topic, partition\) pairs"),
        (lambda lg: lg.consumer().assign([txn_core.TopicPartition("t", "0")]), "partition of 't' must be"),  # type: ignore[arg-type]
        (lambda lg: lg.consumer().assign([("t", True)]), "partition of 't' must be"),
        (lambda lg: lg.consumer().assign([(0, "t")]), "topic's name first"),
        (lambda lg: _assigned(lg).poll("10"), "max_records must be an int"),  # type: ignore[arg-type]
        (lambda lg: _assigned(lg, "g").commit([("t", 0)]), "offsets must be a mapping"),  # type: ignore[arg-type]
        (lambda lg: _assigned(lg, "g").commit({"t": 1}), r"expected a \(topic, partition\) pair, got 't'"),  # type: ignore[dict-item]
        (lambda lg: _assigned(lg, "g").commit({("t", 0): 1}, metadata=123), "metadata must be a string"),  # type: ignore[arg-type]
        (lambda lg: lg.add_partitions("t", "3"), "partitions must be an integer"),
    ],
)
def test_bad_consumer_calls(log: txn_core.Log, call: object, fragment: str) -> None:
    with pytest.raises(ConfigurationError, match=fragment):
        call(log)  # type: ignore[operator]


def _assigned(log: txn_core.Log, group: str | None = None) -> txn_core.Consumer:
    c = log.consumer(group)
    c.assign([("t", 0)])
    return c


def test_a_partition_given_as_a_numpy_int_is_taken(log: txn_core.Log) -> None:
    import numpy as np

    c = log.consumer()
    c.assign([("t", np.int64(1))])  # type: ignore[list-item]
    assert c.assignment() == [txn_core.TopicPartition("t", 1)]
    assert type(c.assignment()[0].partition) is int
    assert c.poll().num_rows == 20


def test_seek_to_a_bool_is_refused(log: txn_core.Log) -> None:
    c = _assigned(log)
    with pytest.raises(txn_core.InvalidOffsetError, match="non-negative int, got True"):
        c.seek(("t", 0), True)


def test_seek_beyond_end_and_before_start(log: txn_core.Log) -> None:
    c = log.consumer()
    c.assign([("t", 0)])
    with pytest.raises(txn_core.OffsetOutOfRangeError):
        c.seek(("t", 0), 1000)
    with pytest.raises(txn_core.InvalidOffsetError):
        c.seek(("t", 0), -1)
    assert issubclass(DataLossError, txn_core.TxnLogError)  # retention-removed offsets: see test_maintenance


def test_topics_with_different_schemas_are_unified(log: txn_core.Log) -> None:
    log.create_topic("u", 1, pa.schema([("id", pa.int64()), ("extra", pa.float64())]))
    p = log.producer()
    p.send("u", pa.table({"id": [1], "extra": [0.5]}), partition=0)
    p.flush()
    c = log.consumer()
    c.assign([("t", 0), ("u", 0)])
    table = c.poll()
    assert set(table.schema.names) >= {"id", "name", "extra", "_offset"}
    log.create_topic("v", 1, pa.schema([("id", pa.string())]))
    with pytest.raises(ConfigurationError, match="incompatible schemas"):
        log.consumer().assign([("t", 0), ("v", 0)])


def test_lag_counts_to_the_last_stable_offset_as_of_now(log: txn_core.Log) -> None:
    """A user found a fresh consumer's lag 0 before its first poll, and 7 instead of 12 after 5 more
    records: it counted to what its own reads had seen. It is now a fresh look at each partition."""
    log.create_topic("lag", 1, SCHEMA)
    p = log.producer()
    for i in range(10):
        p.send("lag", pa.table({"id": [i], "name": ["x"]}), partition=0)
        p.flush()
    c = log.consumer()
    c.assign([("lag", 0)])
    assert c.lag() == {txn_core.TopicPartition("lag", 0): 10}
    assert c.poll(max_records=3).num_rows == 3
    assert c.lag() == {txn_core.TopicPartition("lag", 0): 7}
    for i in range(10, 15):
        p.send("lag", pa.table({"id": [i], "name": ["x"]}), partition=0)
        p.flush()
    assert c.lag() == {txn_core.TopicPartition("lag", 0): 12}
    t = log.producer("lagging")
    t.init_transactions()
    t.begin_transaction()
    t.send("lag", pa.table({"id": [99], "name": ["open"]}), partition=0)
    t.flush()
    dirty = log.consumer(isolation_level="read_uncommitted")
    dirty.assign([("lag", 0)])
    assert c.lag() == {txn_core.TopicPartition("lag", 0): 12}  # the open transaction is past the LSO
    assert dirty.lag() == {txn_core.TopicPartition("lag", 0): 16}
    t.abort_transaction()
    t.close()
    p.close()


def test_seek_to_timestamp_reads_every_record_stamped_at_or_after_it() -> None:
    """Kafka's offsetsForTimes + seek (a user found no way to start from a time in the core API)."""
    clock = FakeClock(1_800_000_000_000)
    log = txn_core.Log(MemoryStorage(uuid.uuid4().hex), clock=clock)
    log.create_topic("t", 2, SCHEMA)
    p = log.producer()
    for i in range(6):
        p.send("t", pa.table({"id": [i], "name": ["x"]}), partition=i % 2)
        p.flush()
        clock.now += 120_000  # two minutes apart: beyond the clock-skew bound
    cut = 1_800_000_000_000 + 3 * 120_000  # the time ids 3.. were written at
    c = log.consumer()
    c.assign([("t", 0), ("t", 1)])
    assert c.offsets_for_times({("t", 0): cut, ("t", 1): cut}) == {
        txn_core.TopicPartition("t", 0): 2,  # id 4 (ids 0, 2, 4 are offsets 0, 1, 2)
        txn_core.TopicPartition("t", 1): 1,  # id 3
    }
    assert c.offsets_for_times({("t", 1): clock.now + 10**6}) == {txn_core.TopicPartition("t", 1): 3}  # log end
    c.seek_to_timestamp(cut)
    got = c.poll()
    assert sorted(got.column("id").to_pylist()) == [3, 4, 5]
    assert min(got.column("_timestamp").to_pylist()).timestamp() * 1000 >= cut
    with pytest.raises(ConfigurationError, match="ms since the epoch"):
        c.offsets_for_times({("t", 0): -1})
    with pytest.raises(txn_core.TopicNotFoundError):
        c.offsets_for_times({("nope", 0): cut})


def test_lag_from_several_threads_scans_each_consumer_s_own_state() -> None:
    """lag() scanned the log's shared partition state, which is not thread-safe: consumers of one Log calling
    it on several threads raised 'entry at slot 8 starts at offset 54, buffer is at 44' and left that state
    inconsistent (a review found it). Each consumer now scans its own."""
    import threading

    log = txn_core.Log(MemoryStorage(uuid.uuid4().hex))
    log.create_topic("t", 1, SCHEMA)
    errors: list[BaseException] = []
    stop = threading.Event()

    def produce() -> None:
        p = log.producer("lag-writer")
        p.init_transactions()
        while not stop.is_set():
            p.begin_transaction()
            p.send("t", pa.table({"id": list(range(10)), "name": ["x"] * 10}), partition=0)
            p.commit_transaction()
        p.close()

    def watch() -> None:
        c = log.consumer()
        c.assign([("t", 0)])
        try:
            for _ in range(100):
                c.lag()
        except BaseException as exc:  # reported below
            errors.append(exc)

    writer = threading.Thread(target=produce)
    writer.start()
    watchers = [threading.Thread(target=watch) for _ in range(3)]
    for w in watchers:
        w.start()
    for w in watchers:
        w.join()
    stop.set()
    writer.join()
    assert errors == []
    end = log.describe_topic("t").partitions[0].log_end_offset
    c = log.consumer()
    c.assign([("t", 0)])
    assert c.lag() == {txn_core.TopicPartition("t", 0): end}


def test_a_seek_past_entries_appended_since_a_read_ahead_missed_them(tmp_path: Path) -> None:
    """A consumer that seeks to the log end has reads of the next slots in flight; they answer "not found".
    Entries are appended, this process learns the new tail, and the consumer seeks forward: the stale
    answer was raised as ObjectNotFoundError for an entry that exists (a user found it crashing a
    subscription consumer's receive() while a producer wrote). The slot is read again."""
    import time

    log = txn_core.open_log(str(tmp_path / "log"))
    log.create_topic("t", 1, SCHEMA)
    p = txn_core.open_log(str(tmp_path / "log")).producer()

    def put(ids: range) -> None:
        for i in ids:
            p.send("t", pa.table({"id": [i], "name": ["x"]}), partition=0)
            p.flush()

    put(range(40))
    c = log.consumer()
    c.assign([("t", 0)])
    c.seek(("t", 0), 40)  # the header scan reads ahead past the end
    time.sleep(0.3)  # those reads answer "not found"
    put(range(40, 60))
    assert log.describe_topic("t").partitions[0].log_end_offset == 60  # this process learns the tail
    c.seek(("t", 0), 50)
    assert c.poll().column("id").to_pylist() == list(range(50, 60))
    p.close()


def test_a_closed_consumer_leaves_no_snapshot_being_written(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader writes its buffer snapshots behind its records, on another thread; close() waits for them, so
    nothing a closed consumer started still writes (a listing taken after close is the final one)."""
    import threading
    import time

    from txn_core.partition import snapshots
    from txn_core.storage.base import Chunks, DelegatingStorage

    monkeypatch.setattr(snapshots, "SNAPSHOT_EVERY_TXNS", 1)
    started = threading.Event()

    class SlowSnapshots(DelegatingStorage):
        def create(self, key: str, chunks: Chunks) -> None:
            if "/snapshots/" in key:
                started.set()
                time.sleep(0.3)
            self.inner.create(key, chunks)

    inner = MemoryStorage(uuid.uuid4().hex)
    log = txn_core.Log(inner)
    log.create_topic("t", 1, pa.schema([("id", pa.int64())]))
    p = log.producer("w")
    p.init_transactions()
    p.begin_transaction()
    p.send("t", pa.table({"id": [1, 2]}), partition=0)
    p.commit_transaction()
    p.close()
    c = txn_core.Log(SlowSnapshots(inner)).consumer()
    c.assign([("t", 0)])
    assert c.poll().num_rows == 2
    assert started.wait(5), "a snapshot was due and began behind the records"
    c.close()
    assert inner.list("topics/t/00000/snapshots/"), "written by the time close() returned"
