"""A consumer of quiet partitions: at most one request per partition per poll, fewer as they stay quiet
(txn_core/clients/idle.py; ISSUE 34 item 4), and nothing delivered late beyond the back-off's maximum."""

from __future__ import annotations

import time
import uuid

import pyarrow as pa
import pytest
from fakeclock import FakeClock
from latency_storage import DelayedStorage

import txn_core
from txn_core.clients.idle import FIRST_INTERVAL_S, FREE_POLLS, IdleBackoff
from txn_core.errors import ConfigurationError
from txn_core.storage import MemoryStorage

SCHEMA = pa.schema([("id", pa.int64())])
PARTITIONS = 8


def _quiet_log() -> tuple[DelayedStorage, txn_core.Log]:
    inner = MemoryStorage(uuid.uuid4().hex)
    log = txn_core.Log(inner)
    log.create_topic("t", PARTITIONS, SCHEMA)
    with log.producer() as p:
        for part in range(PARTITIONS):
            p.send("t", pa.table({"id": [part]}, schema=SCHEMA), partition=part)
    storage = DelayedStorage(inner)
    return storage, txn_core.Log(storage)


def _caught_up(log: txn_core.Log, backoff_ms: int) -> txn_core.Consumer:
    c = log.consumer(idle_backoff_max_ms=backoff_ms)
    c.assign([("t", p) for p in range(PARTITIONS)])
    rows = 0
    while got := c.poll().num_rows:
        rows += got
    assert rows == PARTITIONS
    return c


@pytest.mark.parametrize("backoff_ms", [0, 1000])
def test_a_poll_of_quiet_partitions_costs_at_most_one_request_each_and_fewer_as_they_stay_quiet(
    backoff_ms: int,
) -> None:
    storage, log = _quiet_log()
    c = _caught_up(log, backoff_ms)
    polls = 40
    per_poll = []
    for _ in range(polls):
        before = storage.total()
        assert c.poll().num_rows == 0
        per_poll.append(storage.total() - before)
    assert max(per_poll) <= PARTITIONS, per_poll
    if backoff_ms == 0:
        assert per_poll == [PARTITIONS] * polls  # every poll asks every partition
    else:
        # after the free polls each partition waits 10 ms, 20 ms, ... (the loop takes well under a second)
        assert sum(per_poll) < PARTITIONS * (FREE_POLLS + 8), per_poll
        assert per_poll[-1] == 0


def test_a_record_sent_to_a_quiet_partition_arrives_within_the_back_off() -> None:
    _, log = _quiet_log()
    c = _caught_up(log, 200)
    for _ in range(30):  # well into the back-off
        c.poll()
    with log.producer() as p:
        p.send("t", pa.table({"id": [99]}, schema=SCHEMA), partition=3)
    sent = time.monotonic()
    got: list[int] = []
    while not got and time.monotonic() - sent < 10:
        got = c.poll().column("id").to_pylist()
    assert got == [99]
    assert time.monotonic() - sent < 5  # bounded by the 0.2 s maximum (a generous margin for a loaded machine)


def test_a_seek_reads_at_the_next_poll_whatever_the_back_off() -> None:
    _, log = _quiet_log()
    c = _caught_up(log, 60_000)
    for _ in range(20):
        c.poll()
    c.seek(("t", 5), 0)
    assert c.poll().column("id").to_pylist() == [5]


def test_the_schedule_doubles_up_to_its_maximum_and_resets_on_records() -> None:
    now = [0.0]
    b = IdleBackoff(100, monotonic=lambda: now[0])
    for _ in range(FREE_POLLS):
        b.empty("p")
        assert b.due("p")
    waits = []
    for _ in range(8):
        b.empty("p")
        assert not b.due("p")
        start = now[0]
        while not b.due("p"):
            now[0] += 0.001
        waits.append(round(now[0] - start, 3))
    assert waits[:3] == [FIRST_INTERVAL_S, 2 * FIRST_INTERVAL_S, 4 * FIRST_INTERVAL_S]
    assert max(waits) == 0.1
    b.found("p")
    b.empty("p")
    assert b.due("p")


def test_a_negative_back_off_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="idle_backoff_max_ms"):
        txn_core.Log(MemoryStorage(uuid.uuid4().hex)).consumer(idle_backoff_max_ms=-1)


def test_a_quiet_end_costs_one_request_per_read_and_a_full_look_once_a_minute() -> None:
    """A reader that keeps finding its next slot absent re-lists the segments and the log start (and probes
    for holes) once per TAIL_RECHECK_S, not at every LOG_START_RECHECK_S (txn_core/partition/holes.py)."""
    inner = MemoryStorage(uuid.uuid4().hex)
    txn_core.Log(inner).create_topic("t", 1, SCHEMA)
    with txn_core.Log(inner).producer() as p:
        p.send("t", pa.table({"id": [1]}, schema=SCHEMA), partition=0)
    clock = FakeClock()
    storage = DelayedStorage(inner)
    c = txn_core.Log(storage, clock=clock).consumer(idle_backoff_max_ms=0)
    c.assign([("t", 0)])
    assert c.poll().num_rows == 1
    per_poll = []
    for _ in range(130):  # 130 s of the log's clock, a poll a second
        clock.now += 1000
        before = storage.total()
        assert c.poll().num_rows == 0
        per_poll.append(storage.total() - before)
    looks = [i for i, n in enumerate(per_poll) if n > 1]
    assert len(looks) <= 3, per_poll  # at 5 s (the listing from the open aged), then once a minute
    assert all(n >= 1 for n in per_poll)  # every poll still asks for the slot
    with txn_core.Log(inner).producer() as p:
        p.send("t", pa.table({"id": [2]}, schema=SCHEMA), partition=0)
    assert c.poll().column("id").to_pylist() == [2]
