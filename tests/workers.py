"""Functions run in child processes by multi-process tests (importable by ``spawn``)."""

from __future__ import annotations

import os
import time
from typing import Any

import pyarrow as pa


def race_creates(url: str, options: dict[str, Any] | None, worker: int, keys: list[str], start_at: float) -> list[str]:
    """Try to create every key; return the keys this worker won."""
    from txn_core.errors import ObjectExistsError
    from txn_core.storage import open_storage

    storage = open_storage(url, options)
    while time.time() < start_at:
        time.sleep(0.001)
    won = []
    for key in keys:
        body = f"worker={worker};key={key};".encode() * 200
        try:
            storage.create(key, [body[:10], body[10:]])
            won.append(key)
        except ObjectExistsError:
            pass
    return won


def append_rows(
    url: str, options: dict[str, Any] | None, topic: str, worker: int, batches: int, rows: int, start_at: float
) -> list[tuple[int, int]]:
    """Idempotent producer appending ``batches`` entries to partition 0; returns (base offset, count)."""
    import txn_core

    log = txn_core.open_log(url, options)
    p = log.producer(batch_bytes=1 << 30)
    while time.time() < start_at:
        time.sleep(0.001)
    out = []
    for b in range(batches):
        ids = [worker * 1_000_000 + b * rows + i for i in range(rows)]
        p.send(topic, pa.table({"id": ids, "worker": [worker] * rows}), partition=0)
        for md in p.flush():
            out.append((md.base_offset, md.record_count))
    p.close()
    return out


def transactional_copier(
    url: str,
    options: dict[str, Any] | None,
    topic: str,
    tid: str,
    worker: int,
    txns: int,
    rows: int,
    abort_every: int,
    start_at: float,
) -> dict[str, list[int]]:
    """Run transactions of ``rows`` ids on every partition; abort every ``abort_every``-th one.

    A transaction that outlives its timeout (a stalled store: a request waits out the client's 30 s timeout
    before its retry) is aborted by a reader, as the protocol says; this copier then does what the error
    tells an application to do: it counts those ids as aborted (nothing of them is visible), opens a new
    producer and goes on. The ids of such transactions are returned under ``timed_out`` as well."""
    import txn_core
    from txn_core.errors import TransactionTimedOutError

    log = txn_core.open_log(url, options)

    def new_producer() -> Any:
        producer = log.producer(tid, transaction_timeout_ms=30000)
        producer.init_transactions()
        return producer

    p = new_producer()
    parts = log.topics.get(topic).partitions
    while time.time() < start_at:
        time.sleep(0.001)
    committed: list[int] = []
    aborted: list[int] = []
    timed_out: list[int] = []
    for t in range(txns):
        ids = [worker * 10_000_000 + t * rows + i for i in range(rows)]
        try:
            p.begin_transaction()
            for part in range(parts):
                chunk = [i for i in ids if i % parts == part]
                if chunk:
                    p.send(topic, pa.table({"id": chunk, "worker": [worker] * len(chunk)}), partition=part)
            p.flush()
            if abort_every and t % abort_every == abort_every - 1:
                p.abort_transaction()
                aborted.extend(ids)
            else:
                p.commit_transaction()
                committed.extend(ids)
        except TransactionTimedOutError:
            aborted.extend(ids)
            timed_out.extend(ids)
            p.close(flush=False)
            p = new_producer()
    p.close()
    return {"committed": committed, "aborted": aborted, "timed_out": timed_out}


def pid() -> int:
    return os.getpid()


def fencing_worker(
    url: str, options: dict[str, Any] | None, topic: str, tid: str, worker: int, txns: int, start_at: float
) -> dict[str, list[int]]:
    """Two of these share one transactional id: each re-inits when fenced. Returns committed ids."""
    import txn_core

    log = txn_core.open_log(url, options)
    parts = log.topics.get(topic).partitions
    while time.time() < start_at:
        time.sleep(0.001)
    committed: list[int] = []
    fenced: list[int] = []
    p = None
    for t in range(txns):
        ids = [worker * 10_000_000 + t * 10 + i for i in range(10)]
        try:
            if p is None:
                p = log.producer(tid, transaction_timeout_ms=30000)
                p.init_transactions()
            p.begin_transaction()
            for part in range(parts):
                p.send(
                    topic,
                    pa.table(
                        {
                            "id": [i for i in ids if i % parts == part],
                            "worker": [worker] * len([i for i in ids if i % parts == part]),
                        }
                    ),
                    partition=part,
                )
            p.flush()
            p.commit_transaction()
            committed.extend(ids)
        except txn_core.ProducerFencedError:
            fenced.extend(ids)
            p = None
    return {"committed": committed, "fenced": fenced}


def reader_until(url: str, options: dict[str, Any] | None, topic: str, stop_file: str) -> list[int]:
    """A read_committed consumer polling until ``stop_file`` exists (then drains); returns ids in order."""
    import txn_core

    log = txn_core.open_log(url, options)
    parts = log.topics.get(topic).partitions
    c = log.consumer()
    c.assign([(topic, p) for p in range(parts)])
    seen: list[int] = []
    while not os.path.exists(stop_file):
        seen.extend(c.poll().column("id").to_pylist())
        time.sleep(0.01)
    while (got := c.poll()).num_rows:
        seen.extend(got.column("id").to_pylist())
    return seen


#: ids per transaction of :func:`journaled_writer`; a transaction's ids are ``base .. base + JOURNAL_ROWS - 1``
JOURNAL_ROWS = 6


def journaled_writer(
    url: str, options: dict[str, Any] | None, topic: str, tid: str, base: int, journal: str, pause_s: float = 0.0
) -> None:
    """Transactions back to back under ``tid`` until killed or fenced, each of :data:`JOURNAL_ROWS` ids from
    ``base`` on, spread over every partition; after each commit returns, ``committed <first id>`` is appended to
    ``journal`` (fsynced), so a process killed between its commit point and that line leaves a committed
    transaction unjournaled. Fenced (a newer process took ``tid`` over), it journals ``fenced`` and returns.
    SIGUSR1 writes the stack of every thread to ``journal + ".stacks"``.
    ``pause_s`` between transactions: writers appending to the same partitions back to back starve one another,
    on local disk under load as on a store answering in 50 ms (the loser of a slot reads back and probes before
    its next try, while the winner, knowing its tail, appends at once: PROTOCOL.md "Partition log", no
    fairness), which is a test of fairness, not of what this one checks."""
    import faulthandler
    import signal

    import txn_core
    from txn_core.errors import ProducerFencedError

    # A writer that stops making progress explains itself: SIGUSR1 writes every thread's stack beside the journal.
    stacks = open(journal + ".stacks", "w")  # noqa: SIM115 - open for the life of the process
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
    log = txn_core.open_log(url, options)
    parts = log.topics.get(topic).partitions
    producer = log.producer(tid, transaction_timeout_ms=60_000)
    producer.init_transactions()
    with open(journal, "a") as out:
        out.write("ready\n")
        out.flush()
        for first in range(base, base + 10_000_000, JOURNAL_ROWS):
            ids = list(range(first, first + JOURNAL_ROWS))
            try:
                producer.begin_transaction()
                for part in range(parts):
                    chunk = [i for i in ids if i % parts == part]
                    producer.send(topic, pa.table({"id": chunk, "worker": [base] * len(chunk)}), partition=part)
                producer.commit_transaction()
            except ProducerFencedError:
                out.write("fenced\n")
                out.flush()
                return
            out.write(f"committed {first}\n")
            out.flush()
            os.fsync(out.fileno())
            time.sleep(pause_s)
