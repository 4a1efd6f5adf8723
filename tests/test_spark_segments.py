"""Segments with Spark (PROTOCOL.md "Segments"; spark_txn_sink/PROTOCOL.md "Rolling history into segments").

* The sink's commit worker rolls the partitions it writes by itself; the output, read by Spark's source
  and by the core consumer, is exactly the input, and the staged objects of rolled batches are gone.
* A Spark batch read of a topic (planning on the driver, ranges read by executors) returns the same rows
  before and after the topic was rolled.
* ``chaos`` tier: a txnlog -> txnlog copy is SIGKILLed and restarted while its input is rolled by another
  process and its output by its own commit worker; the exactly-once check still holds.
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import sink_sources
from sink_driver import start_driver, wait_driver
from sink_helpers import garbage, ids, read_topic, staged_objects
from test_spark_sink_chaos import SCHEMA, ConcurrentReader, InputProducer, check_exactly_once, kill_round

import txn_core
from txn_core import maintenance, paths
from txn_core.rolling import RollPolicy

pytestmark = pytest.mark.spark


def _segments(log: txn_core.Log, topic: str) -> int:
    return sum(
        len(log.storage.list(paths.segments(paths.partition_log_path(topic, p))))
        for p in range(log.topics.get(topic).partitions)
    )


def _loose(log: txn_core.Log, topic: str) -> int:
    return sum(
        len(log.storage.list(paths.entries(paths.partition_log_path(topic, p))))
        for p in range(log.topics.get(topic).partitions)
    )


def _spark_rows(spark: Any, url: str, topic: str, isolation: str = "read_committed") -> list[tuple[Any, ...]]:
    df = spark.read.format("txnlog").option("topic", topic).option("isolationLevel", isolation).load(url)
    return sorted(tuple(r) for r in df.select("_partition", "_offset", "id").collect())


def test_the_sink_rolls_what_it_writes_and_readers_read_it_exactly(
    spark: Any, log: txn_core.Log, tmp_path: Path
) -> None:
    sink_sources.register(spark)
    df = spark.readStream.format("sinktest_counter").option("total", 400).option("perBatch", 10).load()
    query = (
        df.writeStream.format("txnlog")
        .option("checkpointLocation", str(tmp_path / "chk"))
        .option("topic", "out")
        .option("partitions", "2")
        .option("keyColumn", "key")
        .option("rollEntries", "10")
        .option("rollMinAgeMs", "0")
        .trigger(availableNow=True)
        .start(log.url)
    )
    query.awaitTermination()
    # The roller runs after each commit, off the commit's path: wait until it has rolled most entries.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (_segments(log, "out") >= 4 and _loose(log, "out") < 40):
        time.sleep(0.5)
    assert _segments(log, "out") >= 4, "the sink's commit worker rolled its output"
    assert _loose(log, "out") < 40, "and deleted the loose entries its segments hold (80 batches x 2 partitions)"
    assert ids(read_topic(log, "out")) == list(range(400))
    assert sorted(r[2] for r in _spark_rows(spark, log.url, "out")) == list(range(400))
    assert len(staged_objects(log)) < 40, "staged objects of rolled batches are deleted with their references"
    assert garbage(log, "out") == []


def _history(log: txn_core.Log) -> None:
    log.create_topic("h", 2, pa.schema([("id", pa.int64())]))
    p = log.producer("history")
    p.init_transactions()
    for i in range(120):
        p.begin_transaction()
        p.send("h", pa.table({"id": [i, i + 1000]}), partition=i % 2)
        p.flush()
        if i % 7 == 3:
            p.abort_transaction()
        else:
            p.commit_transaction()
    p.close()


def test_a_batch_read_of_a_rolled_topic_plans_and_reads_the_same_rows(spark: Any, log: txn_core.Log) -> None:
    _history(log)
    before = {iso: _spark_rows(spark, log.url, "h", iso) for iso in ("read_committed", "read_uncommitted")}
    assert len(before["read_committed"]) < len(before["read_uncommitted"])
    results = maintenance.roll_segments(log, "h", policy=RollPolicy(entries=10, max_entries=40), min_age_ms=0)
    assert all(r.segments >= 3 and r.deleted_entries == r.entries for r in results)
    after = {iso: _spark_rows(spark, log.url, "h", iso) for iso in ("read_committed", "read_uncommitted")}
    assert after == before


# --- chaos ----------------------------------------------------------------------------------------

#: Loose entries go this long after their segment: above the readers' listing re-check (5 s), so a
#: reader never takes a rolled slot for the end of the log (PROTOCOL.md "Segments", "Readers").
CHAOS_MIN_AGE_MS = 15_000


class InputRoller(threading.Thread):
    """Another process rolling the copy's input topic again and again."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.log = txn_core.open_log(url)
        self.stop_event = threading.Event()
        self.segments = 0
        self.errors: list[str] = []

    def run(self) -> None:
        policy = RollPolicy(entries=8, max_entries=64)
        while not self.stop_event.wait(1.0):
            try:
                results = maintenance.roll_segments(self.log, "in", policy=policy, min_age_ms=CHAOS_MIN_AGE_MS)
            except txn_core.TxnLogError as exc:
                self.errors.append(repr(exc))
                return
            self.segments += sum(r.segments for r in results)


@pytest.mark.chaos
def test_a_copy_killed_and_restarted_while_input_and_output_are_rolled_stays_exactly_once(
    log: txn_core.Log, tmp_path: Path
) -> None:
    rng = random.Random(20261122)
    log.create_topic("in", 3, SCHEMA)
    producer = InputProducer(log)
    producer.produce(30)
    stop_input = threading.Event()
    background = threading.Thread(target=producer.produce, args=(10_000, 0.25, stop_input), daemon=True)
    background.start()
    roller = InputRoller(log.url)
    roller.start()
    reader = ConcurrentReader(log, forbidden=set())
    reader.start()
    chk = tmp_path / "chk"
    base = {
        "log": log.url,
        "checkpoint": str(chk),
        "source": "txnlog",
        "input": "in",
        "topic": "out",
        "read": {"startingOffsets": "earliest", "maxOffsetsPerTrigger": 600},
        "sink": {
            "partitions": 2,
            "keyColumn": "key",
            "consumerGroup": "copier",
            "rollEntries": 6,
            "rollMinAgeMs": CHAOS_MIN_AGE_MS,
        },
    }
    for i, mode in enumerate(["random", "after_prepare:kill", "random", "after_commit:kill", "random"]):
        kill_round(base, chk, tmp_path, i, mode, rng, (15, 30))
        reader.forbidden.update(producer.aborted)
    stop_input.set()
    background.join()
    reader.forbidden.update(producer.aborted)
    time.sleep(CHAOS_MIN_AGE_MS / 1000)  # the last input segments become old enough to lose their loose entries
    final = start_driver(base, tmp_path / "driver-final.log")
    assert wait_driver(final, timeout=600) == 0, (tmp_path / "driver-final.log").read_text()[-3000:]
    time.sleep(1)
    reader.stop_event.set()
    reader.join(timeout=120)
    roller.stop_event.set()
    roller.join(timeout=120)

    assert roller.errors == []
    assert roller.segments > 0 and _segments(log, "in") > 0, "the input was rolled while the copy read it"
    assert _segments(log, "out") > 0, "the copy's commit worker rolled its output"
    counts = check_exactly_once(log, producer, "copier")
    assert reader.violations == []
    got = ids(read_topic(log, "out"))
    assert sorted(reader.seen) == got and max(reader.seen.values()) == 1
    print(f"\nrolled while killed: {counts}, input segments {_segments(log, 'in')}, output {_segments(log, 'out')}")
