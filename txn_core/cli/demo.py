"""``txnlog demo``: the Quickstart's end-to-end run.

By default it runs the exactly-once Spark pipeline of ``spark_txn_sink.demo.run_demo`` when that module is
importable; ``--core`` (or a missing Spark demo, with a note on stderr) runs the core-only demo below: a few
transactions, one aborted, read back by a read_committed consumer - no Spark, a second or two.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import tempfile
from collections.abc import Callable

from txn_core.cli.common import HelpFormatter, SubParsers, warn

SPARK_DEMO = "spark_txn_sink.demo"


def register(sub: SubParsers) -> None:
    p = sub.add_parser(
        "demo",
        help="run the end-to-end demo (the Quickstart)",
        formatter_class=HelpFormatter,
        description="Run the end-to-end demo: an exactly-once Spark pipeline through txnlog "
        f"({SPARK_DEMO}), or with --core a short core-only demo without Spark.",
        epilog="examples:\n  txnlog demo\n  txnlog demo --core --dir /tmp/txnlog-demo",
    )
    p.add_argument("--dir", help="where to put the demo log (default: a new temporary directory)")
    p.add_argument("--core", action="store_true", help="run the core-only demo (no Spark; a second or two)")
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show the full traceback on errors")
    p.set_defaults(func=demo, verb_parser=p)


def demo(args: argparse.Namespace) -> int:
    if not args.core:
        run = spark_demo()
        if run is not None:
            return int(run(args.dir))
    return core_demo(args.dir)


def spark_demo() -> Callable[[str | None], int] | None:
    """``spark_txn_sink.demo.run_demo`` if it can be imported; else None, with a note on stderr."""
    try:
        spec = importlib.util.find_spec(SPARK_DEMO)
    except ImportError as exc:  # the parent package itself does not import (e.g. pyspark missing)
        warn(f"the Spark demo cannot start ({exc}); running the core demo instead (txnlog demo --core)")
        return None
    if spec is None:
        warn(f"the Spark demo ({SPARK_DEMO}) is not installed; running the core demo instead (txnlog demo --core)")
        return None
    try:
        module = importlib.import_module(SPARK_DEMO)
    except ImportError as exc:
        warn(f"the Spark demo cannot start ({exc}); running the core demo instead (txnlog demo --core)")
        return None
    run = getattr(module, "run_demo", None)
    if not callable(run):
        warn(f"{SPARK_DEMO} has no run_demo(); running the core demo instead (txnlog demo --core)")
        return None
    return run  # type: ignore[no-any-return]


def core_demo(directory: str | None) -> int:
    """Four transactions (one aborted) into a two-partition topic, read back exactly once."""
    import pyarrow as pa

    import txn_core

    directory = directory or tempfile.mkdtemp(prefix="txnlog-demo-")
    log = txn_core.open_log(directory)
    log.create_topic("demo", 2, pa.schema([("id", pa.int64())]))
    producer = log.producer("demo-producer")
    producer.init_transactions()
    committed = []
    for t in range(4):
        producer.begin_transaction()
        ids = list(range(t * 10, t * 10 + 10))
        producer.send("demo", pa.table({"id": ids}), key_column="id")
        if t == 2:
            producer.flush()  # the rows reach the log, then the transaction aborts: readers must drop them
            producer.abort_transaction()
        else:
            producer.commit_transaction()
            committed.extend(ids)
    producer.close()
    consumer = log.consumer()
    consumer.assign([("demo", 0), ("demo", 1)])
    seen: list[int] = []
    while (got := consumer.poll()).num_rows:
        seen.extend(got.column("id").to_pylist())
    seen.sort()
    uncommitted = log.consumer(isolation_level="read_uncommitted")
    uncommitted.assign([("demo", 0), ("demo", 1)])
    raw = 0
    while (got := uncommitted.poll()).num_rows:
        raw += got.num_rows
    ok = seen == sorted(committed)
    print(f"log: {log.url}")
    print(f"committed {len(committed)} rows in 3 transactions, aborted 10 rows in 1")
    print(f"read_uncommitted consumer saw {raw} rows (aborted ones included)")
    print(f"read_committed consumer saw {len(seen)} rows; exactly the committed ones: {ok}")
    print(
        f"inspect it: txnlog topics describe {directory} demo; "
        f"txnlog dump {directory} demo --isolation read_uncommitted --show-control"
    )
    return 0 if ok else 1
