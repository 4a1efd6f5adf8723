"""Hidden corners of reading and planning: a storage that corrupts one read, slows one request, or fails
one request once, at every read, listing and existence check of a consumer's catch-up, of a range's
planning and reading (what the Spark source does on the driver and in tasks), and of a transaction-buffer
rebuild.

Whatever the fault and wherever it lands: no record of an aborted transaction, none twice, none wrong;
an error is a ``TxnLogError`` naming what happened; a fault that passes costs nothing once the caller
retries (a fresh reader from the position reached delivers exactly the rest).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest

import txn_core
from txn_core.errors import StorageError, TxnLogError
from txn_core.partition.ranges import available_end, plan_range, read_range
from txn_core.partition.reader import READ_COMMITTED
from txn_core.storage.base import DelegatingStorage, Storage

SCHEMA = pa.schema([("id", pa.int64())])
PATH = "topics/t/00000"
FAULTS = ["corrupt", "slow", "fail_once"]


class ReadFaults(DelegatingStorage):
    """Request number ``at`` (counting ``read``, ``read_buffer``, ``list`` and ``exists``) is slowed or fails
    once, or, for a read, is corrupted (a listing or an existence answer carries no checksum to catch a
    lie with: the storage contract vouches for them)."""

    def __init__(self, inner: Storage, fault: str | None = None, at: int = -1) -> None:
        super().__init__(inner)
        self.fault, self.at = fault, at
        self.reads = 0
        self._lock = threading.Lock()

    def _hit(self) -> bool:
        with self._lock:
            i, self.reads = self.reads, self.reads + 1
        return i == self.at

    def _request(self, what: str) -> bool:
        """Count a request; fail it once or slow it when it is the one. True if it is the one."""
        hit = self._hit()
        if hit and self.fault == "fail_once":
            raise StorageError(f"{what} failed: injected connection reset")
        if hit and self.fault == "slow":
            time.sleep(0.05)
        return hit

    def read(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        hit = self._request(f"read of {key}")
        data = self.inner.read(key, start, end)
        if hit and self.fault == "corrupt" and data:
            flipped = bytearray(data)
            flipped[len(flipped) // 2] ^= 0x5A
            return bytes(flipped)
        return data

    def read_buffer(self, key: str) -> Any:
        return pa.py_buffer(self.read(key))

    def list(self, prefix: str) -> list[str]:
        self._request(f"listing of {prefix}")
        return self.inner.list(prefix)

    def exists(self, key: str) -> bool:
        self._request(f"existence check of {key}")
        return self.inner.exists(key)


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[int]]:
    """Committed ids 0..29 over three transactions, an aborted one (100..109) between, plain writes."""
    url = f"file://{tmp_path_factory.mktemp('faults')}/log"
    committed: list[int] = []
    with txn_core.open_log(url) as log:
        log.create_topic("t", 1, SCHEMA)
        producer = log.producer("writer")
        producer.init_transactions()
        for t in range(4):
            ids = list(range(100, 110)) if t == 2 else list(range(len(committed), len(committed) + 10))
            producer.begin_transaction()
            for chunk in (ids[:5], ids[5:]):
                producer.send("t", pa.table({"id": chunk}, schema=SCHEMA))
                producer.flush()
            if t == 2:
                producer.abort_transaction()
            else:
                producer.commit_transaction()
                committed += ids
        producer.wait_for_completion()
        producer.close()
        with log.producer() as plain:
            plain.send("t", pa.table({"id": [200, 201]}, schema=SCHEMA))
        committed += [200, 201]
    return url, committed


def consume(log: txn_core.Log, start: int = 0) -> tuple[list[int], int, TxnLogError | None]:
    consumer = log.consumer()
    consumer.assign([("t", 0)])
    consumer.seek(("t", 0), start)
    got: list[int] = []
    try:
        while (table := consumer.poll(7)).num_rows:
            got.extend(table.column("id").to_pylist())
    except TxnLogError as exc:
        return got, consumer.position(("t", 0)), exc
    return got, consumer.position(("t", 0)), None


def planned(log: txn_core.Log) -> list[int]:
    state = log.partition_state(PATH, shared=False)
    end = available_end(state, READ_COMMITTED)
    rng = plan_range(state, "t", 0, 0, end, READ_COMMITTED)
    worker = txn_core.Log(log.storage).partition_log(PATH)
    return [i for b in read_range(worker, rng) for i in b.column("id").to_pylist()]


def rebuilt(log: txn_core.Log) -> list[int]:
    state = log.partition_state(PATH, shared=False)
    state.scan_to_end()
    return [state.buffer.position, state.read_bound(), state.buffer.committed_count, state.buffer.aborted_count]


def faulty(url: str, fault: str | None, at: int, run: Callable[[txn_core.Log], Any]) -> Any:
    """``run`` on a log opened through a faulty storage (opening it reads too)."""
    storage = ReadFaults(txn_core.open_log(url).storage, fault, at)
    return run(txn_core.Log(storage))


def reads_of(url: str, run: Callable[[txn_core.Log], object]) -> int:
    storage = ReadFaults(txn_core.open_log(url).storage)
    run(txn_core.Log(storage))
    return storage.reads


@pytest.mark.parametrize("fault", FAULTS)
def test_a_consumer_catching_up_survives_a_bad_read_anywhere(written: tuple[str, list[int]], fault: str) -> None:
    url, committed = written
    for at in range(reads_of(url, consume)):
        try:
            got, position, error = faulty(url, fault, at, consume)
        except TxnLogError as exc:  # opening the log met the fault
            got, position, error = [], 0, exc
        if error is None:
            assert got == committed, (fault, at)
            continue
        assert fault != "slow", f"a slow read is not an error: {error!r}"
        assert got == committed[: len(got)], (fault, at, "only committed records, in order, none twice")
        rest, _, again = consume(txn_core.open_log(url), position)  # the caller retries from its position
        assert again is None and got + rest == committed, (fault, at)


@pytest.mark.parametrize("fault", FAULTS)
def test_planning_and_reading_a_range_survive_a_bad_read_anywhere(written: tuple[str, list[int]], fault: str) -> None:
    url, committed = written
    for at in range(reads_of(url, planned)):
        try:
            got = faulty(url, fault, at, planned)
        except TxnLogError:
            assert fault != "slow"
            assert planned(txn_core.open_log(url)) == committed, "a retried task reads exactly the range"
            continue
        assert got == committed, (fault, at, "never a wrong or aborted record")


@pytest.mark.parametrize("fault", FAULTS)
def test_a_buffer_rebuild_survives_a_bad_read_anywhere(written: tuple[str, list[int]], fault: str) -> None:
    url, _ = written
    expected = rebuilt(txn_core.open_log(url))
    for at in range(reads_of(url, rebuilt)):
        try:
            got = faulty(url, fault, at, rebuilt)
        except TxnLogError:
            assert fault != "slow"
            continue
        assert got == expected, (fault, at, "a wrong read bound would expose uncommitted data")


def test_the_fixture_has_what_the_faults_need(written: tuple[str, list[int]]) -> None:
    url, committed = written
    assert committed == [*range(30), 200, 201]
    got, _, error = consume(txn_core.open_log(url))
    assert error is None and got == committed
