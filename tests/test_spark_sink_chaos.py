"""Kafka's transactions_test, for the Spark sink: a copier hard-killed again and again, checked to the row.

An input topic receives committed and aborted transactions (some before the copier starts, the rest while
it runs). A streaming txnlog -> txnlog copy with ``consumerGroup`` runs as its own driver process and is
SIGKILLed -- with its JVM and Python workers -- at random moments and at each step of the sink's commit
protocol, then restarted on the same checkpoint. A read_committed reader polls the output all along.
Meanwhile another process rolls the input into segments again and again, and the copy's commit worker
rolls its output (PROTOCOL.md "Segments"): the copy reads segments and loose entries interchangeably.
``TXNLOG_CHAOS_SEED`` picks the kill schedule.

At the end: the output is exactly the committed input (no duplicate, no aborted row, nothing lost), in
input order per key; the concurrent reader never saw an uncommitted or duplicated row; the group's
offsets equal the input's end; no transaction is left open and no staged garbage is left behind.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from sink_driver import kill_driver, start_driver, wait_driver
from sink_helpers import garbage, ids, read_topic, staged_objects

import txn_core
from txn_core.format import paths
from txn_core.ops import maintenance
from txn_core.ops.rolling import RollPolicy

pytestmark = [pytest.mark.spark, pytest.mark.chaos]

SCHEMA = pa.schema([("id", pa.int64()), ("key", pa.string()), ("payload", pa.string())])
TXN_ROWS = 150


class InputProducer:
    """Transactions of ``TXN_ROWS`` rows keyed over 3 partitions; every fourth aborted."""

    def __init__(self, log: txn_core.Log) -> None:
        self.producer = log.producer("chaos-input", transaction_timeout_ms=30_000)
        self.producer.init_transactions()
        self.committed: list[int] = []
        self.aborted: list[int] = []
        self.txn = 0

    def produce(self, txns: int, pause: float = 0.0, stop: threading.Event | None = None) -> None:
        for _ in range(txns):
            if stop is not None and stop.is_set():
                return
            t = self.txn
            self.txn += 1
            batch = list(range(t * TXN_ROWS, (t + 1) * TXN_ROWS))
            self.producer.begin_transaction()
            self.producer.send(
                "in",
                pa.table(
                    {"id": batch, "key": [f"k{i % 17}" for i in batch], "payload": [f"p{i:08d}" * 4 for i in batch]},
                    schema=SCHEMA,
                ),
                key_column="key",
            )
            self.producer.flush()  # the rows reach the log either way; an abort must hide them
            if t % 4 == 3:
                self.producer.abort_transaction()
                self.aborted.extend(batch)
            else:
                self.producer.commit_transaction()
                self.committed.extend(batch)
            time.sleep(pause)


class ConcurrentReader(threading.Thread):
    """A read_committed consumer of the output, polling until stopped; records every violation."""

    def __init__(self, log: txn_core.Log, forbidden: set[int]) -> None:
        super().__init__(daemon=True)
        self.log = log
        self.forbidden = forbidden
        self.seen: Counter[int] = Counter()
        self.violations: list[str] = []
        self.stop_event = threading.Event()

    def run(self) -> None:
        consumer = None
        while not self.stop_event.is_set() or consumer is not None:
            try:
                if consumer is None:
                    if "out" not in self.log.list_topics():
                        time.sleep(0.2)
                        continue
                    consumer = self.log.consumer(isolation_level="read_committed")
                    consumer.assign([("out", p) for p in range(self.log.topics.get("out").partitions)])
                table = consumer.poll()
            except Exception as exc:  # a reader must never fail on the sink's output
                self.violations.append(f"reader failed: {exc!r}")
                return
            for i in table.column("id").to_pylist() if table.num_rows else []:
                self.seen[i] += 1
                if i in self.forbidden:
                    self.violations.append(f"read aborted row {i}")
                if self.seen[i] == 2:
                    self.violations.append(f"read row {i} twice")
            if table.num_rows == 0:
                if self.stop_event.is_set():
                    return
                time.sleep(0.2)


def next_batch(checkpoint: Path) -> int:
    """The batch id the next run will start with (a replay of an uncommitted planned batch counts)."""
    commits = [int(p.name) for p in (checkpoint / "commits").glob("[0-9]*")] if checkpoint.exists() else []
    return max(commits, default=-1) + 1


def kill_round(
    base: dict[str, Any], chk: Path, log_dir: Path, i: int, mode: str, rng: random.Random, lasting: tuple[float, float]
) -> None:
    """Round ``i`` of a copier run continuously (a batch a second): killed from outside after a random time
    in ``lasting`` seconds (``mode`` "random"), or by a fault point of the sink's commit (``mode``)."""
    cfg = {**base, "trigger": 1}
    if mode != "random":
        # next_batch() may be a replay of a batch the sink already committed (a no-op commit where no
        # fault point is reached): aim at a batch after it.
        cfg["sink"] = {**base["sink"], "testing.fault": f"{mode}@{next_batch(chk) + 1 + rng.randint(0, 1)}"}
    proc = start_driver(cfg, log_dir / f"driver-{i}.log")
    if mode == "random":
        deadline = time.time() + rng.uniform(*lasting)
        while time.time() < deadline and proc.poll() is None:
            time.sleep(0.1)
        kill_driver(proc)
        code = proc.returncode
    else:
        code = wait_driver(proc, timeout=300)
    assert code == -9, f"round {i} ({mode}) was not killed: " + (log_dir / f"driver-{i}.log").read_text()[-3000:]


def _batch_of(key: str) -> int:
    """The batch number of a staged object's key (``staging/<owner>/<query id>.<batch>/<name>``)."""
    return int(key.split("/")[2].rsplit(".", 1)[1])


def check_exactly_once(log: txn_core.Log, producer: InputProducer, group_id: str) -> dict[str, int]:
    """The copy's output is exactly the committed input, in order per key, with the group at the input's end
    and nothing left open or staged. Returns the row counts."""
    out = read_topic(log, "out")
    got = ids(out)
    assert len(got) == len(set(got)), "zero duplicates"
    assert set(got) & set(producer.aborted) == set(), "zero aborted rows"
    assert got == sorted(producer.committed), "the output is exactly the committed input"
    by_key: dict[str, list[int]] = {}
    for key, i in zip(out.column("key").to_pylist(), out.column("id").to_pylist(), strict=True):
        by_key.setdefault(key, []).append(i)
    assert all(v == sorted(v) for v in by_key.values()), "input order is kept per key"
    ends = {p.partition: p.last_stable_offset for p in log.describe_topic("in").partitions}
    group = {tp.partition: o.offset for tp, o in log.groups.committed(group_id).items()}
    assert group == ends, "the group's offsets are at the input's end"
    desc = log.describe_topic("out")
    left_open = [(p.log_end_offset, o) for p in desc.partitions for o in p.ongoing_transactions]
    assert [o for _, o in left_open if not o.state.startswith("Prepare")] == [], "nothing left undecided"
    # On an object store the last batch's markers run behind its returned commit (below): decided, visible,
    # completed by the next participant. Nothing older may be left.
    assert len({o.txn for _, o in left_open}) <= (1 if log.storage.overlap_reads else 0), left_open
    assert all(o.last_offset == end - 1 for end, o in left_open), ("only the last batch's", left_open)
    left = garbage(log, "out")
    if left and log.storage.overlap_reads:
        # On an object store a batch's markers and cleanup run behind its returned commit (txn_core
        # PROTOCOL.md "Application transactions"): a driver that exits right after its last batch leaves
        # that batch's cleanup to the query's next run, or to sweep-staging. Nothing older may be left.
        last = max(_batch_of(k) for k in staged_objects(log))
        assert {_batch_of(k) for k in left} == {last}, left
        maintenance.sweep_staging(log, older_than_ms=0, check_min_age=False)
        assert ids(read_topic(log, "out")) == got, "the sweep deleted only what nothing references"
        left = garbage(log, "out")
    assert left == [], "every staged object left is referenced by the output"
    return {"committed": len(producer.committed), "aborted": len(producer.aborted), "output": len(got)}


#: Rolled loose entries go this long after their segment: above the readers' listing re-check (5 s), so a
#: reader never takes a rolled slot for the end of the log (PROTOCOL.md "Segments", "Readers").
CHAOS_MIN_AGE_MS = 15_000


class InputRoller(threading.Thread):
    """A separate client (its own Log) rolling the copy's input topic into segments again and again."""

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
                results = maintenance.roll_segments(
                    self.log, "in", policy=policy, min_age_ms=CHAOS_MIN_AGE_MS, check_min_age=False
                )
            except txn_core.TxnLogError as exc:
                self.errors.append(repr(exc))
                return
            self.segments += sum(r.segments for r in results)


def segment_count(log: txn_core.Log, topic: str) -> int:
    return sum(
        len(log.storage.list(paths.segments(paths.partition_log_path(topic, p))))
        for p in range(log.topics.get(topic).partitions)
    )


#: The kill schedule: CI's form kills the copier right after a commit point and at random (a task's write,
#: and a failure before the commit point, after it and after the markers fail a batch in the default
#: tier's test_spark_sink.py and test_spark_sink_protocol.py); the soak's kills it four times at random and
#: once at every step of the sink's commit.
ROUNDS = {
    "ci": ["after_prepare:kill", "random"],
    "soak": [
        "random",
        "before_commit:kill",
        "random",
        "after_prepare:kill",
        "write:kill",
        "random",
        "after_commit:kill",
        "before_init:kill",
        "random",
    ],
}


@pytest.mark.parametrize("strength", ["ci", pytest.param("soak", marks=pytest.mark.soak)])
def test_copier_killed_at_random_and_in_every_commit_step_outputs_committed_input_exactly_once(
    log: txn_core.Log, tmp_path: Path, strength: str
) -> None:
    """Input arrives continuously (with aborted transactions) while another process rolls it into segments;
    the copy rolls its own output; the copier is killed at random and at every step of its commit."""
    seed = int(os.environ.get("TXNLOG_CHAOS_SEED", "20240611"))
    rng = random.Random(seed)
    log.create_topic("in", 3, SCHEMA)
    producer = InputProducer(log)
    producer.produce(40)
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
        "read": {"startingOffsets": "earliest", "maxOffsetsPerTrigger": 900},
        "sink": {
            "partitions": 2,
            "keyColumn": "key",
            "consumerGroup": "copier",
            "rollEntries": 6,
            "testing.rollMinAgeMs": CHAOS_MIN_AGE_MS,
        },
    }
    # Until the final run, the copier runs continuously (a batch a second) while input keeps arriving.
    outcomes = []
    for i, mode in enumerate(ROUNDS[strength]):
        kill_round(base, chk, tmp_path, i, mode, rng, (8, 30) if strength == "soak" else (8, 15))
        outcomes.append(mode)
        # forbidden rows are known once produced; the reader checks them as it goes
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

    got = ids(read_topic(log, "out"))
    check_exactly_once(log, producer, "copier")
    assert reader.violations == []
    assert sorted(reader.seen) == got and max(reader.seen.values()) == 1
    assert roller.errors == []
    assert roller.segments > 0 and segment_count(log, "in") > 0, "the input was rolled while the copy read it"
    assert segment_count(log, "out") > 0, "the copy's commit worker rolled its output"
    print(
        f"\nchaos seed {seed}: {len(outcomes)} kills ({', '.join(outcomes)}), "
        f"{len(producer.committed):,} committed and {len(producer.aborted):,} aborted input rows, "
        f"{len(got):,} output rows, the reader saw {sum(reader.seen.values()):,}; "
        f"segments: input {segment_count(log, 'in')}, output {segment_count(log, 'out')}"
    )
