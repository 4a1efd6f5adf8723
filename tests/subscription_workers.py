"""Functions run in child processes by the subscription tests (importable by ``spawn``)."""

from __future__ import annotations

import contextlib
import os
import random
import time
from typing import Any

import pyarrow as pa


def exactly_once_worker(
    url: str,
    options: dict[str, Any] | None,
    wid: int,
    stop_file: str,
    ack_timeout_ms: int,
    txn_timeout_ms: int,
    batch: int,
    pause_s: float,
    seed: int,
    subscription_type: str = "shared",
) -> None:
    """Consume ``in`` through the subscription ``work`` (of ``subscription_type``), write each record's id to
    ``out`` and acknowledge it in the same transaction, until ``stop_file`` exists. Restarted after a SIGKILL with the
    same ``wid`` (so the same transactional id: ``init_transactions`` fences the dead predecessor)."""
    import txn_core

    log = txn_core.open_log(url, options)
    rng = random.Random(seed)

    def new_producer() -> txn_core.Producer:
        p = log.producer(f"eo-worker-{wid}", transaction_timeout_ms=txn_timeout_ms)
        p.init_transactions()
        return p

    p = new_producer()
    c = log.subscribe(
        "in", 0, "work", consumer_name=f"w{wid}", ack_timeout_ms=ack_timeout_ms, create=False,
        subscription_type=subscription_type, session_timeout_ms=ack_timeout_ms,
        key_column="key" if subscription_type == "key_shared" else None,
    )  # fmt: skip
    while not os.path.exists(stop_file):
        recs = c.receive(batch, timeout_s=0.2)
        if not recs.num_rows:
            continue
        try:
            p.begin_transaction()
            p.send("out", pa.table({"id": recs.column("id"), "worker": [wid] * recs.num_rows}), partition=0)
            p.flush()  # the output is in the log before the acknowledgement: a kill leaves it aborted
            time.sleep(rng.uniform(0, pause_s))  # "processing"
            c.acknowledge(recs, transaction=p)
            time.sleep(rng.uniform(0, pause_s))
            p.commit_transaction()
        except txn_core.ProducerFencedError:  # frozen past the timeout: a zombie; start over
            with contextlib.suppress(txn_core.TxnLogError):
                p.close()
            p = new_producer()
            c.redeliver_unacknowledged()
        except txn_core.TxnLogError:  # a conflict (someone else holds a record): abort, take what is left
            try:
                p.abort_transaction()
            except txn_core.ProducerFencedError:
                p = new_producer()
            c.redeliver_unacknowledged()
    p.close()
    c.close()
