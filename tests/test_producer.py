"""The idempotent producer: routing, schema checks, idempotence under ambiguous failures, sequences."""

from __future__ import annotations

import re
import uuid

import pyarrow as pa
import pytest
from faults import FaultyStorage

import txn_core
from txn_core import paths
from txn_core.entry import EntryKind, crc32, encode_arrow
from txn_core.errors import ConfigurationError, OutOfOrderSequenceError, SchemaMismatchError, UnknownOutcomeError
from txn_core.routing import partition_for
from txn_core.storage import MemoryStorage

SCHEMA = pa.schema([("id", pa.int64()), ("key", pa.string())])


def _log(storage: txn_core.storage.Storage | None = None) -> txn_core.Log:
    log = txn_core.Log(storage or MemoryStorage(uuid.uuid4().hex))
    if "t" not in log.list_topics():
        log.create_topic("t", 4, SCHEMA)
    return log


def _all(log: txn_core.Log, topic: str = "t", isolation: str = "read_committed") -> pa.Table:
    c = log.consumer(isolation_level=isolation)
    parts = log.topics.get(topic).partitions
    c.assign([(topic, p) for p in range(parts)])
    tables = []
    while (got := c.poll()).num_rows:
        tables.append(got)
    return pa.concat_tables(tables) if tables else c.poll()


def test_send_accepts_batches_tables_and_dicts() -> None:
    log = _log()
    p = log.producer()
    p.send("t", pa.record_batch({"id": [1], "key": ["a"]}), partition=0)
    p.send("t", pa.table({"key": ["b"], "id": [2]}), partition=1)  # column order does not matter
    p.send("t", [{"id": 3, "key": "c"}, {"id": 4, "key": None}], partition=2)
    p.flush()
    assert sorted(_all(log).column("id").to_pylist()) == [1, 2, 3, 4]


def test_routing_by_key_is_stable_and_matches_the_documented_hash() -> None:
    log = _log()
    p = log.producer()
    keys = [f"k{i}" for i in range(200)]
    p.send("t", pa.table({"id": list(range(200)), "key": keys}), key_column="key")
    p.flush()
    table = _all(log)
    for k, part in zip(table.column("key").to_pylist(), table.column("_partition").to_pylist(), strict=True):
        assert part == partition_for(k, 4)
    assert len(set(table.column("_partition").to_pylist())) == 4


def test_without_key_or_partition_sends_spread_over_partitions() -> None:
    log = _log()
    p = log.producer()
    for i in range(8):
        p.send("t", pa.table({"id": [i], "key": ["x"]}))
    p.flush()
    parts = _all(log).column("_partition").to_pylist()
    assert sorted(parts) == [0, 0, 1, 1, 2, 2, 3, 3]


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        (pa.table({"id": [1]}), "column 'key' (string) is missing"),
        (pa.table({"id": ["x"], "key": ["a"]}), "column 'id' has type string, the topic expects int64"),
        (pa.table({"id": [1], "key": ["a"], "extra": [1.0]}), "column 'extra' is not in the topic schema"),
        ([{"id": 1, "key": "a", "oops": 2}], "column 'oops' is not in the topic schema"),
        ([{"id": "not-a-number", "key": "a"}], "does not match the schema"),
        ("a string", "pass a pyarrow.RecordBatch"),
    ],
)
def test_schema_mismatch_is_reported_before_anything_is_written(data: object, fragment: str) -> None:
    log = _log()
    p = log.producer()
    p.send("t", pa.table({"id": [0], "key": ["ok"]}), partition=0)
    with pytest.raises(SchemaMismatchError, match=re.escape(fragment)) as info:
        p.send("t", data, partition=0)
    assert "nothing was written" in str(info.value) or "pass a" in str(info.value)
    p.flush()
    assert _all(log).column("id").to_pylist() == [0]


def test_widening_casts_are_accepted() -> None:
    log = _log()
    p = log.producer()
    p.send("t", pa.table({"id": pa.array([1], pa.int32()), "key": pa.array(["a"], pa.large_string())}), partition=0)
    p.flush()
    assert _all(log).column("id").type == pa.int64()


def test_unknown_topic_names_the_existing_ones() -> None:
    log = _log()
    with pytest.raises(txn_core.TopicNotFoundError, match="existing topics: t"):
        log.producer().send("nope", pa.table({"id": [1], "key": ["a"]}))


def test_bad_partition_is_a_clear_error() -> None:
    log = _log()
    with pytest.raises(ConfigurationError, match=r"partition 9 does not exist in topic 't' \(partitions 0..3\)"):
        log.producer().send("t", pa.table({"id": [1], "key": ["a"]}), partition=9)


def test_ambiguous_append_is_retried_without_a_duplicate() -> None:
    """The entry create lands but reports an unknown outcome, many times: exactly one copy results."""
    inner = MemoryStorage(uuid.uuid4().hex)
    _log(inner)
    counter = FaultyStorage(inner, only_writes=True)
    log = txn_core.Log(counter)
    p = log.producer()
    p.send("t", pa.table({"id": [1, 2, 3], "key": ["a", "b", "c"]}), partition=0)
    p.flush()
    # Now make every later create land and then report an unknown outcome.
    data_writes = len(counter.ops)
    counter.ambiguous_at = data_writes
    p.send("t", pa.table({"id": [4], "key": ["d"]}), partition=0)
    p.flush()
    seen = _all(txn_core.Log(inner)).column("id").to_pylist()
    assert seen == [1, 2, 3, 4]


def test_unresolvable_failure_keeps_the_batch_for_a_retry_that_lands_once() -> None:
    class Down(MemoryStorage):
        down = False

        def create(self, key: str, chunks: object) -> None:  # type: ignore[override]
            if self.down and "/log/" in key and key.startswith("topics/"):
                super().create(key, chunks)  # type: ignore[arg-type]
                raise UnknownOutcomeError("timeout")
            super().create(key, chunks)  # type: ignore[arg-type]

        def read(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
            if self.down and "/log/" in key and key.startswith("topics/"):
                raise txn_core.StorageError("unreachable")
            return super().read(key, start, end)

    storage = Down(uuid.uuid4().hex)
    log = _log(storage)
    p = log.producer()
    p.send("t", pa.table({"id": [1], "key": ["a"]}), partition=0)
    p.flush()
    storage.down = True
    p.send("t", pa.table({"id": [2], "key": ["b"]}), partition=0)
    with pytest.raises(UnknownOutcomeError, match="could not learn whether"):
        p.flush()
    storage.down = False
    p.flush()  # the same append, same writer id: resolves to the copy that had landed
    assert _all(txn_core.Log(storage)).column("id").to_pylist() == [1, 2]


def _raw_append(log: txn_core.Log, ids: list[int], pid: int, epoch: int, seq: int) -> None:
    payload = encode_arrow([pa.record_batch({"id": ids, "key": ["x"] * len(ids)})], SCHEMA)
    view = memoryview(payload)
    log.partition_log(paths.partition_log_path("t", 0)).append(
        EntryKind.DATA,
        [view],
        len(view),
        crc32(view),
        len(ids),
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
    )


def test_a_duplicate_entry_with_an_old_sequence_is_not_visible() -> None:
    log = _log()
    _raw_append(log, [1, 2], pid=77, epoch=0, seq=0)
    _raw_append(log, [1, 2], pid=77, epoch=0, seq=0)  # a retry that landed twice
    _raw_append(log, [3], pid=77, epoch=0, seq=2)
    for isolation in ("read_committed", "read_uncommitted"):
        assert _all(log, isolation=isolation).column("id").to_pylist() == [1, 2, 3]


def test_a_sequence_gap_raises_out_of_order_sequence() -> None:
    log = _log()
    _raw_append(log, [1, 2], pid=78, epoch=0, seq=0)
    _raw_append(log, [5], pid=78, epoch=0, seq=4)  # sequences 2 and 3 are missing
    c = log.consumer()
    c.assign([("t", 0)])
    with pytest.raises(OutOfOrderSequenceError, match=r"producer id 78 epoch 0.*expected sequence 2, got 4"):
        while c.poll().num_rows:
            pass


def test_producer_ids_are_unique_across_logs_and_blocks() -> None:
    storage = MemoryStorage(uuid.uuid4().hex)
    a, b = txn_core.Log(storage), txn_core.Log(storage)
    ids = {a.producer().producer_id for _ in range(300)} | {b.producer().producer_id for _ in range(10)}
    assert len(ids) == 310
