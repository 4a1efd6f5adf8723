"""The ``txnlog`` command line (placeholder until the full CLI lands): ``txnlog demo``."""

from __future__ import annotations

import argparse
import sys
import tempfile


def _demo(args: argparse.Namespace) -> int:
    import pyarrow as pa

    import txn_core

    directory = args.dir or tempfile.mkdtemp(prefix="txnlog-demo-")
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
            producer.abort_transaction()
        else:
            producer.commit_transaction()
            committed.extend(ids)
    consumer = log.consumer()
    consumer.assign([("demo", 0), ("demo", 1)])
    seen = sorted(consumer.poll().column("id").to_pylist())
    print(f"log: {log.url}")
    print(f"committed {len(committed)} rows in 3 transactions, aborted 10 rows in 1")
    print(f"read_committed consumer saw {len(seen)} rows; exactly the committed ones: {seen == sorted(committed)}")
    return 0 if seen == sorted(committed) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="txnlog", description="txnlog command line")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run the end-to-end demo")
    demo.add_argument("--dir", help="where to put the demo log (default: a temporary directory)")
    demo.set_defaults(func=_demo)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
