"""Topics: names, creation races, descriptions, growing partitions."""

from __future__ import annotations

import threading
import uuid

import pyarrow as pa
import pytest

import txn_core
from txn_core.errors import ConfigurationError, InvalidNameError, TopicExistsError, TopicNotFoundError
from txn_core.storage import MemoryStorage

SCHEMA = pa.schema([("id", pa.int64())])


@pytest.fixture
def log() -> txn_core.Log:
    return txn_core.Log(MemoryStorage(uuid.uuid4().hex))


@pytest.mark.parametrize("name", ["", "..", ".", "a/b", "../etc", "has space", "x" * 201, "__internal", "é"])
def test_bad_topic_names_are_refused_with_the_rule(log: txn_core.Log, name: str) -> None:
    with pytest.raises(InvalidNameError, match="invalid topic name"):
        log.create_topic(name, 1, SCHEMA)


@pytest.mark.parametrize("name", ["orders", "orders.v2", "a_b-c", "X9"])
def test_good_topic_names(log: txn_core.Log, name: str) -> None:
    log.create_topic(name, 1, SCHEMA)
    assert name in log.list_topics()


def test_create_twice_raises_topic_exists(log: txn_core.Log) -> None:
    log.create_topic("t", 2, SCHEMA)
    with pytest.raises(TopicExistsError, match="'t' already exists"):
        log.create_topic("t", 3, SCHEMA)
    assert log.topics.get("t").partitions == 2


def test_racing_creators_have_exactly_one_winner(log: txn_core.Log) -> None:
    wins, errors = [], []

    def create(i: int) -> None:
        try:
            txn_core.Log(log.storage).create_topic("race", i + 1, SCHEMA)
            wins.append(i)
        except TopicExistsError:
            errors.append(i)

    threads = [threading.Thread(target=create, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 1 and len(errors) == 7
    assert log.topics.get("race").partitions == wins[0] + 1


@pytest.mark.parametrize(
    ("partitions", "schema", "fragment"),
    [
        (0, SCHEMA, "partitions must be an integer"),
        (True, SCHEMA, "partitions must be an integer"),
        (2, pa.schema([("_offset", pa.int64())]), "reserved column name"),
        (2, "id long", "must be a pyarrow.Schema"),
        (2, pa.schema([]), "no columns"),
    ],
)
def test_bad_topic_definitions(log: txn_core.Log, partitions: object, schema: object, fragment: str) -> None:
    with pytest.raises(ConfigurationError, match=fragment):
        log.create_topic("t", partitions, schema)  # type: ignore[arg-type]


def test_describe_unknown_topic_lists_existing(log: txn_core.Log) -> None:
    log.create_topic("a", 1, SCHEMA)
    log.create_topic("b", 1, SCHEMA)
    with pytest.raises(TopicNotFoundError, match="unknown topic 'c'; existing topics: a, b"):
        log.describe_topic("c")


def test_describe_reports_offsets_and_sizes(log: txn_core.Log) -> None:
    log.create_topic("t", 2, SCHEMA)
    p = log.producer()
    p.send("t", pa.table({"id": [1, 2, 3]}), partition=1)
    p.flush()
    d = log.describe_topic("t")
    assert d.schema == SCHEMA
    assert [(x.partition, x.log_end_offset, x.last_stable_offset) for x in d.partitions] == [(0, 0, 0), (1, 3, 3)]
    assert d.partitions[1].size_bytes > 0 and d.partitions[0].size_bytes == 0


def test_partitions_can_grow_not_shrink(log: txn_core.Log) -> None:
    log.create_topic("t", 2, SCHEMA)
    assert log.add_partitions("t", 5).partitions == 5
    assert len(log.describe_topic("t").partitions) == 5
    with pytest.raises(ConfigurationError, match="can only grow"):
        log.add_partitions("t", 3)
    # Another client sees the new count.
    assert txn_core.Log(log.storage).topics.get("t").partitions == 5
