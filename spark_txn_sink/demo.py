"""The end-to-end demo: an exactly-once streaming job on txnlog, crashed part-way and restarted.

:func:`run_demo` does, on the local filesystem:

1. produce input into topic ``orders``: transactions of 1,000 rows each, every fourth one aborted;
2. run a streaming transform ``orders`` -> ``orders_enriched`` (txnlog source, exactly-once txnlog sink,
   offsets committed to group ``enricher``) as its own Spark driver process, and SIGKILL that driver --
   JVM and Python workers included -- inside the commit of micro-batch 2, right after its commit point,
   before Spark records the batch in its checkpoint (the sink's ``testing.fault`` hook);
3. restart the job on the same checkpoint: Spark replays batch 2, the sink recognises it as committed
   and commits nothing twice, and the job runs to the end of the input;
4. read the output with a read_committed consumer and check that every committed input row appears
   exactly once, no aborted row appears, and the group's offsets are at the end of the input.

It prints a short summary and returns 0 when exactly-once held, 1 otherwise.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

INPUT, OUTPUT, GROUP = "orders", "orders_enriched", "enricher"
TXNS, ROWS_PER_TXN, OFFSETS_PER_BATCH = 24, 1_000, 4_000
KILL_BATCH = 2


def produce_input(log: Any) -> tuple[list[int], list[int]]:
    """Transactions of ``ROWS_PER_TXN`` orders over 3 partitions; every fourth aborted."""
    import pyarrow as pa

    schema = pa.schema([("order_id", pa.int64()), ("customer", pa.string()), ("amount", pa.float64())])
    log.create_topic(INPUT, 3, schema)
    producer = log.producer("demo-order-service")
    producer.init_transactions()
    committed: list[int] = []
    aborted: list[int] = []
    for t in range(TXNS):
        ids = list(range(t * ROWS_PER_TXN, (t + 1) * ROWS_PER_TXN))
        producer.begin_transaction()
        producer.send(
            INPUT,
            pa.table(
                {
                    "order_id": ids,
                    "customer": [f"customer-{i % 37}" for i in ids],
                    "amount": [round((i % 500) * 1.25, 2) for i in ids],
                },
                schema=schema,
            ),
            key_column="customer",
        )
        producer.flush()  # the rows reach the log either way; an abort must hide them
        if t % 4 == 3:
            producer.abort_transaction()
            aborted.extend(ids)
        else:
            producer.commit_transaction()
            committed.extend(ids)
    producer.close()
    return committed, aborted


def _job(config: dict[str, Any]) -> int:
    """The streaming job, run as its own driver process (``python -m spark_txn_sink.demo --job CONFIG``)."""
    if os.getsid(0) == os.getpid():
        os.environ["TXNLOG_SINK_TEST_SESSION"] = str(os.getpid())  # arms the kill fault for this session only
    from pyspark.sql import SparkSession

    from spark_txn_source.datasource import register

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("txnlog-demo")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.python.filterPushdown.enabled", "true")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    orders = (
        spark.readStream.format("txnlog")
        .option("topic", INPUT)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(OFFSETS_PER_BATCH))
        .load(config["log"])
    )
    enriched = orders.selectExpr(
        "order_id",
        "customer",
        "amount",
        "round(amount * 1.2, 2) AS amount_with_tax",
        "_partition AS source_partition",
        "_offset AS source_offset",
    )
    writer = (
        enriched.writeStream.format("txnlog")
        .option("checkpointLocation", config["checkpoint"])
        .option("topic", OUTPUT)
        .option("partitions", "2")
        .option("keyColumn", "customer")
        .option("consumerGroup", GROUP)
        .trigger(availableNow=True)
    )
    if config.get("fault"):
        writer = writer.option("testing.fault", config["fault"])
    query = writer.start(config["log"])
    try:
        query.awaitTermination()
    finally:
        spark.stop()
    return 0


def _run_job(config: dict[str, Any], output: Path) -> int:
    package_root = str(Path(__file__).resolve().parent.parent)
    env = dict(
        os.environ,
        PYSPARK_PYTHON=sys.executable,
        PYTHONPATH=os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p),
    )
    with open(output, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "spark_txn_sink.demo", "--job", json.dumps(config)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=package_root,
        )
        code = proc.wait()
    _kill_leftovers(proc.pid)
    return code


def _kill_leftovers(session: int) -> None:
    """After a killed driver: make sure nothing of its session (JVM, Python workers) lingers."""
    import signal

    from spark_txn_sink.faults import session_pids

    for pid in session_pids(session):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _read_output(log: Any) -> list[int]:
    consumer = log.consumer(isolation_level="read_committed")
    consumer.assign([(OUTPUT, p) for p in range(log.topics.get(OUTPUT).partitions)])
    ids: list[int] = []
    while True:
        table = consumer.poll()
        if table.num_rows == 0:
            break
        ids.extend(table.column("order_id").to_pylist())
    consumer.close()
    return ids


def run_demo(directory: str | None = None) -> int:
    """Run the demo in ``directory`` (default: a new temporary directory); 0 if exactly-once held."""
    import txn_core

    root = Path(directory or tempfile.mkdtemp(prefix="txnlog-demo-")).resolve()
    root.mkdir(parents=True, exist_ok=True)
    log = txn_core.open_log(str(root / "log"))
    checkpoint = root / "checkpoint"
    driver_log = root / "spark-driver.log"
    print(f"txnlog demo in {root} (Spark output: {driver_log.name})")

    committed, aborted = produce_input(log)
    print(
        f"1. produced {TXNS} transactions into topic {INPUT!r} (3 partitions): "
        f"{len(committed) // ROWS_PER_TXN} committed ({len(committed):,} rows), "
        f"{len(aborted) // ROWS_PER_TXN} aborted ({len(aborted):,} rows)"
    )

    config = {"log": log.url, "checkpoint": str(checkpoint)}
    print(
        f"2. streaming job {INPUT} -> {OUTPUT} (exactly-once txnlog sink, offsets to group {GROUP!r}, "
        f"{OFFSETS_PER_BATCH:,} offsets per micro-batch)"
    )
    started = time.time()
    code = _run_job({**config, "fault": f"after_prepare:kill@{KILL_BATCH}"}, driver_log)
    from spark_txn_sink.writer import default_transactional_id

    tid = default_transactional_id(json.loads((checkpoint / "metadata").read_text())["id"], GROUP)
    progress = log.transaction_metadata(tid) or {}
    recorded = (checkpoint / "commits" / str(KILL_BATCH)).exists()
    print(
        f"   run 1: driver SIGKILLed (exit {code}) inside the commit of micro-batch {KILL_BATCH}, after its "
        f"commit point; txnlog says batch {progress.get('batch_id')} is committed, Spark's checkpoint "
        f"{'has' if recorded else 'has no'} record of batch {KILL_BATCH}"
    )
    code2 = _run_job(config, driver_log)
    last = (log.transaction_metadata(tid) or {}).get("batch_id")
    print(
        f"   run 2: restarted on the same checkpoint (exit {code2}); Spark replayed batch {KILL_BATCH}, the sink "
        f"committed it no second time, and the job finished after batch {last} "
        f"({time.time() - started:.0f} s for both runs)"
    )

    out = _read_output(log)
    counts = Counter(out)
    duplicates = sum(n - 1 for n in counts.values() if n > 1)
    leaked = len(set(out) & set(aborted))
    missing = len(set(committed) - set(out))
    ends = {p.partition: p.last_stable_offset for p in log.describe_topic(INPUT).partitions}
    group = {tp.partition: o.offset for tp, o in log.groups.committed(GROUP).items() if tp.topic == INPUT}
    ok = (
        code == -9
        and code2 == 0
        and not duplicates
        and not leaked
        and not missing
        and len(out) == len(committed)
        and group == ends
    )
    print("3. checked with a read_committed consumer:")
    print(
        f"   committed input rows {len(committed):,}; output rows {len(out):,}; duplicates {duplicates}; "
        f"aborted rows in output {leaked}; committed rows missing {missing}"
    )
    print(f"   group {GROUP!r} offsets at the end of {INPUT!r} on every partition: {'yes' if group == ends else 'no'}")
    print(f"exactly-once: {'OK' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--job":
        sys.exit(_job(json.loads(sys.argv[2])))
    sys.exit(run_demo(sys.argv[1] if len(sys.argv) > 1 else None))
