"""The format object on a store whose requests are round trips (txn_core.format.logformat): opening a log
does not wait for it, a consumer's first round overlaps its read, and every error it carries still comes
first, before anything is written or reported."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pyarrow as pa
import pytest

import txn_core
from txn_core.errors import ConfigurationError
from txn_core.format import envelope, paths
from txn_core.storage.memory import MemoryStorage

SCHEMA = pa.schema([("id", pa.int64())])


def _keys(storage: MemoryStorage) -> list[str]:
    out: list[str] = []
    todo = [""]
    while todo:
        prefix = todo.pop()
        for name in storage.list(prefix):
            (todo if name.endswith("/") else out).append(prefix + name)
    return sorted(out)


def test_a_location_without_a_log_is_named_at_first_use_before_an_unknown_topic_and_nothing_is_created() -> None:
    storage = MemoryStorage(uuid.uuid4().hex)
    log = txn_core.Log(storage, create=False)  # returns at once: the format is read behind
    consumer = log.consumer()
    for _ in range(2):  # an assign that failed checks again
        with pytest.raises(ConfigurationError, match=r"no txnlog at .* check the URL"):
            consumer.assign([("t", 0)])
    with pytest.raises(ConfigurationError, match="no txnlog at"):
        log.list_topics()
    with pytest.raises(ConfigurationError, match="no txnlog at"):
        log.producer("p")
    assert _keys(storage) == []


def test_a_log_is_not_created_beside_other_files_and_a_consumer_hears_why() -> None:
    storage = MemoryStorage(uuid.uuid4().hex)
    storage.create("part-0000.parquet", [b"PAR1"])
    log = txn_core.Log(storage)
    with pytest.raises(ConfigurationError, match=r"holds other files \(part-0000\.parquet\)"):
        log.consumer().assign([("t", 0)])
    with pytest.raises(ConfigurationError, match=r"holds other files"):
        log.create_topic("t", 1, SCHEMA)
    assert _keys(storage) == ["part-0000.parquet"], "nothing was written"


def test_a_newer_format_is_refused_before_any_record_is_read() -> None:
    storage = MemoryStorage(uuid.uuid4().hex)
    with txn_core.Log(storage) as log:
        log.create_topic("t", 1, SCHEMA)
        p = log.producer()
        p.send("t", pa.table({"id": [1]}, schema=SCHEMA), partition=0)
        p.flush()
        p.close()
    storage.delete(paths.FORMAT_KEY)
    newer = {"format": "txnlog", "version": 99, "coordinator_partitions": 16, "created_ms": 0}
    envelope.create_json(storage, paths.FORMAT_KEY, envelope.ObjectKind.FORMAT, newer)
    log = txn_core.Log(storage)
    with pytest.raises(ConfigurationError, match=r"format version 99.*Upgrade txnlog"):
        log.consumer().assign([("t", 0)])
    with pytest.raises(ConfigurationError, match="Upgrade txnlog"):
        log.describe_topic("t")


def test_a_new_log_is_created_by_its_first_use_and_read_by_a_fresh_consumer() -> None:
    storage = MemoryStorage(uuid.uuid4().hex)
    log = txn_core.Log(storage, coordinator_partitions=3)
    assert _keys(storage) == [] or _keys(storage) == [paths.FORMAT_KEY]
    log.create_topic("t", 1, SCHEMA)
    assert log.coordinator_partitions == 3
    p = log.producer("p")
    p.init_transactions()
    p.begin_transaction()
    p.send("t", pa.table({"id": [1, 2]}, schema=SCHEMA), partition=0)
    p.commit_transaction()
    p.close()
    fresh = txn_core.Log(storage, coordinator_partitions=7)  # an existing log keeps its own
    c = fresh.consumer()
    c.assign([("t", 0)])
    assert c.poll().column("id").to_pylist() == [1, 2]
    assert fresh.coordinator_partitions == 3


class _FormatWaitsForMeta(MemoryStorage):
    """The format object's read waits (at most 5 s) until a topic's metadata is being read: it returns at
    once only when the two overlap."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.meta_read = threading.Event()
        self.overlapped: bool | None = None

    def _seen(self, key: str) -> None:
        if "/meta/" in key:
            self.meta_read.set()
        elif key == paths.FORMAT_KEY and self.overlapped is None:
            self.overlapped = self.meta_read.wait(5)

    def read(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        self._seen(key)
        return super().read(key, start, end)

    def read_buffer(self, key: str) -> Any:
        self._seen(key)
        return super().read_buffer(key)


def test_a_readers_topic_metadata_is_read_beside_the_format_object_and_its_error_comes_first() -> None:
    name = uuid.uuid4().hex
    with txn_core.Log(MemoryStorage(name)) as log:
        log.create_topic("t", 2, SCHEMA)
    storage = _FormatWaitsForMeta(name)
    metas = txn_core.Log(storage, create=False).topic_metas(["t"])
    assert metas["t"].partitions == 2 and storage.overlapped is True
    with pytest.raises(ConfigurationError, match="no txnlog at"):
        txn_core.Log(MemoryStorage(uuid.uuid4().hex), create=False).topic_metas(["t"])
