"""The idempotent producer: routing, schema checks, idempotence under ambiguous failures, sequences."""

from __future__ import annotations

import itertools
import re
import uuid
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from faults import FaultyStorage

import txn_core
from txn_core.clients.producer.client import SEQUENCE_LIMIT
from txn_core.clients.routing import partition_for
from txn_core.clock import system_clock
from txn_core.errors import (
    ConfigurationError,
    OutOfOrderSequenceError,
    SchemaMismatchError,
    TransactionTooLargeError,
    UnknownOutcomeError,
)
from txn_core.format import paths
from txn_core.format.entry import EntryKind, crc32, encode_arrow
from txn_core.partition import staging
from txn_core.storage import MemoryStorage
from txn_core.storage.base import Chunks

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


@pytest.mark.parametrize(
    ("column", "row"),
    [
        ("id", {"id": 1.5}),
        ("id", {"id": 2.0}),
        ("id", {"id": np.float32(4.5)}),
        ("id", {"id": Decimal("5.5")}),
        ("ids", {"ids": [1, 2.7]}),
        ("p", {"p": {"x": 3.9}}),
        ("m", {"m": {"a": 1.5}}),
        ("m", {"m": [("a", 2.5)]}),
        ("at", {"at": 1.7}),
    ],
    ids=["float", "integral-float", "numpy-float", "decimal", "in-list", "in-struct", "in-map", "map-pairs", "time"],
)
def test_a_non_integer_in_a_dict_row_for_an_integer_value_is_refused_not_truncated(
    column: str, row: dict[str, Any]
) -> None:
    """pyarrow stored {"id": 1.5} as 1 without a word (at any depth, and from numpy floats and Decimals),
    where the same value sent as a table is refused; nothing of the send is buffered."""
    schema = pa.schema(
        [
            ("id", pa.int64()),
            ("ids", pa.list_(pa.int64())),
            ("p", pa.struct([("x", pa.int32())])),
            ("m", pa.map_(pa.string(), pa.int64())),
            ("at", pa.timestamp("ms")),
            ("f", pa.float64()),
        ]
    )
    log = txn_core.Log(MemoryStorage(uuid.uuid4().hex))
    log.create_topic("n", 1, schema)
    p = log.producer()
    with pytest.raises(SchemaMismatchError, match=rf"column '{column}' \(.*\) was given the non-integer .* in row 1"):
        p.send("n", [{"id": 1}, row], partition=0)
    fine = {"id": np.int64(7), "ids": [1, 2], "p": {"x": 4}, "m": {"a": 1}, "at": 5, "f": 1.5}
    p.send("n", [fine], partition=0)
    p.flush()
    c = log.consumer()
    c.assign([("n", 0)])
    got = c.poll()
    assert got.column("id").to_pylist() == [7] and got.column("f").to_pylist() == [1.5]


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
    for wrong in ("0", 1.0):  # a partition of the wrong type was reported as one that does not exist
        with pytest.raises(ConfigurationError, match=rf"partition must be an int, got {wrong!r} \("):
            log.producer().send("t", pa.table({"id": [1], "key": ["a"]}), partition=wrong)  # type: ignore[arg-type]


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


class _Down(MemoryStorage):
    """While ``down``: creates in partition logs whose key starts with ``prefix`` report an unknown outcome
    (after landing if ``lands``), and reads of them fail, so the producer cannot learn what happened."""

    def __init__(self, prefix: str = "topics/", *, lands: bool = True) -> None:
        super().__init__(uuid.uuid4().hex)
        self.prefix, self.lands, self.down = prefix, lands, False

    def _cut(self, key: str) -> bool:
        return self.down and "/log/" in key and key.startswith(self.prefix)

    def create(self, key: str, chunks: Chunks) -> None:
        if self._cut(key):
            if self.lands:
                super().create(key, chunks)
            raise UnknownOutcomeError("timeout")
        super().create(key, chunks)

    def read(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        if self._cut(key):
            raise txn_core.StorageError("unreachable")
        return super().read(key, start, end)


def _unknown_second_append(storage: _Down, partition: int) -> txn_core.Producer:
    """A producer that wrote id 1 to ``partition``, then id 2 while ``storage`` was down: in flight."""
    p = _log(storage).producer()
    p.send("t", pa.table({"id": [1], "key": ["a"]}), partition=partition)
    p.flush()
    storage.down = True
    p.send("t", pa.table({"id": [2], "key": ["b"]}), partition=partition)
    with pytest.raises(UnknownOutcomeError, match="could not learn whether"):
        p.flush()
    return p


def test_unresolvable_failure_keeps_the_batch_for_a_retry_that_lands_once() -> None:
    storage = _Down()
    p = _unknown_second_append(storage, 0)
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


def _headers(log: txn_core.Log, partition: int) -> list[tuple[int, int, int]]:
    """(epoch, base sequence, records) of every data entry in ``partition`` of topic t."""
    plog = log.partition_log(paths.partition_log_path("t", partition))
    out: list[tuple[int, int, int]] = []
    for slot in itertools.count():
        try:
            h = plog.read_header(slot)
        except txn_core.ObjectNotFoundError:
            return out
        out.append((h.producer_epoch, h.base_sequence, h.record_count))
    raise AssertionError("unreachable")


def test_an_idempotent_producer_past_the_sequence_limit_moves_to_the_next_epoch() -> None:
    """A sequence is a signed 32-bit number. A producer about to pass it in one partition moves to the next
    epoch, where every partition's sequence restarts at 0; readers accept the new epoch's first entry."""
    log = _log()
    p = log.producer()
    p.send("t", pa.table({"id": [1, 2], "key": ["a", "b"]}), partition=1)
    p.flush()
    p._sequences[paths.partition_log_path("t", 0)] = SEQUENCE_LIMIT - 3  # as after 2**31 - 4 records
    p.send("t", pa.table({"id": [3, 4, 5, 6, 7], "key": list("cdefg")}), partition=0)
    p.flush()
    assert p.epoch == 1
    p.send("t", pa.table({"id": [8], "key": ["h"]}), partition=1)
    p.send("t", pa.table({"id": [9], "key": ["i"]}), partition=0)
    p.flush()
    p.close()
    fresh = txn_core.Log(log.storage)
    assert _headers(fresh, 0) == [(1, 0, 5), (1, 5, 1)]
    assert _headers(fresh, 1) == [(0, 0, 2), (1, 0, 1)]
    assert sorted(_all(fresh).column("id").to_pylist()) == list(range(1, 10))


def test_at_the_sequence_limit_an_append_in_flight_is_written_at_its_own_epoch() -> None:
    """An append whose outcome is unknown when the producer moves to the next epoch is written first, at the
    epoch it was built for: sent at the new epoch with its old sequence, it would make the new epoch's
    entries with lower sequences look like duplicates, and readers would skip them."""
    storage = _Down("topics/t/00001/", lands=False)  # it did not land, and nobody can tell
    p = _unknown_second_append(storage, 1)
    storage.down = False
    p._sequences[paths.partition_log_path("t", 0)] = SEQUENCE_LIMIT - 1
    p.send("t", pa.table({"id": [3], "key": ["c"]}), partition=1)
    p.send("t", pa.table({"id": [4, 5], "key": ["d", "e"]}), partition=0)
    p.flush()
    p.close()
    fresh = txn_core.Log(storage)
    assert _headers(fresh, 1) == [(0, 0, 1), (0, 1, 1), (1, 0, 1)]
    assert sorted(_all(fresh).column("id").to_pylist()) == [1, 2, 3, 4, 5]


def test_a_transaction_past_the_sequence_limit_is_refused_before_writing() -> None:
    log = _log()
    p = log.producer("too-large")
    p.init_transactions()
    p.begin_transaction()
    p.send("t", pa.table({"id": [1], "key": ["a"]}), partition=0)
    p.flush()
    p._sequences[paths.partition_log_path("t", 0)] = SEQUENCE_LIMIT - 1  # as after 2**31 - 2 records
    p.send("t", pa.table({"id": [2, 3], "key": ["b", "c"]}), partition=0)
    with pytest.raises(TransactionTooLargeError, match="commit in smaller ones"):
        p.commit_transaction()
    assert len(_headers(log, 0)) == 1
    p.abort_transaction()
    p.begin_transaction()
    p.send("t", pa.table({"id": [4], "key": ["d"]}), partition=0)
    p.commit_transaction()
    p.close()
    assert _all(txn_core.Log(log.storage)).column("id").to_pylist() == [4]


def _staged(log: txn_core.Log, ids: list[int], partition: int) -> staging.StagedRef:
    ref = staging.write_staged(
        log.storage,
        staging.staging_prefix("test", uuid.uuid4().hex),
        "t",
        partition,
        [pa.record_batch({"id": ids, "key": ["s"] * len(ids)}, schema=SCHEMA)],
        SCHEMA,
        clock=system_clock,
    )
    assert ref is not None
    return ref


def test_send_staged_past_the_sequence_limit_moves_to_the_next_epoch() -> None:
    log = _log()
    p = log.producer()
    p._sequences[paths.partition_log_path("t", 0)] = SEQUENCE_LIMIT - 1
    p.send_staged([_staged(log, [1, 2], 0)])
    assert p.epoch == 1
    p.send_staged([_staged(log, [3], 0)])
    p.close()
    fresh = txn_core.Log(log.storage)
    assert _headers(fresh, 0) == [(1, 0, 2), (1, 2, 1)]
    assert _all(fresh).column("id").to_pylist() == [1, 2, 3]


def test_no_new_epoch_while_a_staged_append_has_an_unknown_outcome() -> None:
    """A send_staged append that may have landed is resolved only by its retry at the same epoch (its sequence
    makes a second copy a duplicate). Moving to the next epoch first would let the retry land as new rows."""
    storage = _Down("topics/t/00001/")
    log = _log(storage)
    p = log.producer()
    ref = _staged(log, [100, 101], 1)
    storage.down = True
    with pytest.raises(UnknownOutcomeError):
        p.send_staged([ref])
    storage.down = False
    p._sequences[paths.partition_log_path("t", 0)] = SEQUENCE_LIMIT - 1
    p.send("t", pa.table({"id": [1, 2], "key": ["a", "b"]}), partition=0)
    with pytest.raises(txn_core.InvalidTxnStateError, match="retry that send_staged"):
        p.flush()
    p.send_staged([ref])  # lands as a duplicate of the first copy, at epoch 0
    p.flush()
    assert p.epoch == 1
    p.close()
    fresh = txn_core.Log(storage)
    assert _headers(fresh, 1) == [(0, 0, 2), (0, 0, 2)]
    assert sorted(_all(fresh).column("id").to_pylist()) == [1, 2, 100, 101]


@pytest.mark.parametrize(
    ("make", "fragment"),
    [
        (lambda log: log.producer("x", transaction_timeout_ms=10**12), "in [1, 900000]"),
        (lambda log: log.producer("x", transaction_timeout_ms=0), "in [1, 900000]"),
        (lambda log: log.producer("x", transaction_timeout_ms=True), "in [1, 900000]"),
        (lambda log: log.producer().send("t", pa.table({"id": [1], "key": ["a"]}), partition=True), "got True (bool)"),
        (lambda log: log.set_retention("t", retention_ms=-5), "retention_ms must be a whole number > 0"),
        (lambda log: log.set_retention("t", retention_bytes=0), "retention_bytes must be a whole number > 0"),
        (lambda log: log.create_topic("u", 1, SCHEMA, retention_ms=1.5), "retention_ms must be a whole number > 0"),
    ],
    ids=[
        "timeout-too-long",
        "timeout-zero",
        "timeout-bool",
        "partition-bool",
        "retention-negative",
        "retention-bytes-zero",
        "retention-float",
    ],
)
def test_bad_settings_are_configuration_errors_naming_the_range(make: Any, fragment: str) -> None:
    """A user found a too long transaction timeout refused as an InvalidTxnStateError, send(partition=True)
    taken as partition 1, and a negative retention stored (and shown as 0 ms)."""
    log = _log()
    with pytest.raises(ConfigurationError, match=re.escape(fragment)):
        make(log)
    assert log.describe_topic("t").config.retention_ms is None
    assert log.list_topics() == ["t"]


def test_temporal_values_convert_to_the_topic_unit_exactly_or_are_refused_naming_row_and_value() -> None:
    log = _log()
    schema = pa.schema([("at", pa.timestamp("ms", "UTC")), ("day", pa.date64()), ("took", pa.duration("ns"))])
    log.create_topic("times", 1, schema)
    p = log.producer()
    exact = {
        "at": pa.array([1_767_225_600_123_000], pa.timestamp("us", "UTC")),  # whole milliseconds
        "day": pa.array([20_454], pa.date32()),  # date32 widens to date64
        "took": pa.array([5], pa.duration("us")),  # another duration unit
    }
    p.send("times", pa.table(exact), partition=0)
    lossy = dict(exact, at=pa.array([0, 1_767_225_600_123_456], pa.timestamp("us", "UTC")))
    lossy = {k: v if k == "at" else pa.concat_arrays([v, v]) for k, v in lossy.items()}
    with pytest.raises(SchemaMismatchError) as info:
        p.send("times", pa.table(lossy), partition=0)
    assert (
        "column 'at' in row 1: the value 2026-01-01 00:00:00.123456Z has a part below milliseconds, which "
        "timestamp[ms, tz=UTC] cannot hold; truncate such values to milliseconds before sending"
    ) in str(info.value)
    p.flush()
    got = _all(log, "times")
    assert got.column("at").cast(pa.int64()).to_pylist() == [1_767_225_600_123]
    assert got.column("day").cast(pa.int64()).to_pylist() == [20_454 * 86_400_000]
    assert got.column("took").cast(pa.int64()).to_pylist() == [5_000]
