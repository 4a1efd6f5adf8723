"""The ``txnlog`` command line: ``txnlog [--debug] NOUN VERB URL [ARGS] [-o KEY=VALUE ...] [--json]``.

Nouns and verbs::

    topics        create | list | describe | add-partitions | set-retention
    transactions  list | describe | abort | find-hanging | expire
    groups        list | describe
    dump          URL TOPIC [--partition P] [--isolation L] [--from O] [--to O] [--limit N] [--show-control]
    produce       URL TOPIC FILE [--app-id ID --version N] [--partition P | --key-column C]
    maintenance   snapshot | compact | retention | sweep-staging | damaged | mark-lost
    demo          [--core] [--dir DIR]

Tables for people, ``--json`` for scripts, progress bars on stderr when it is a terminal. Errors are one
line, ``txnlog: error: ...`` on stderr, with exit status 1 (2 for bad arguments); ``--debug`` shows the
traceback. The console script is ``txnlog = txn_core.cli:main``; ``python -m txn_core.cli`` works too.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback

from txn_core.cli import demo, dump, groups, maintenance, produce, subscriptions, topics, transactions
from txn_core.cli.common import PROG, HelpFormatter, Parser, common_options
from txn_core.errors import TxnLogError

__all__ = ["build_parser", "main"]

EXAMPLES = """\
examples:
  txnlog topics create /data/log orders --partitions 4 --schema 'id:int64,name:string,ts:timestamp[ms]'
  txnlog topics describe /data/log orders
  txnlog dump /data/log orders --isolation read_uncommitted --show-control
  txnlog produce /data/log orders day.parquet --app-id nightly-orders --version 20261123
  txnlog transactions find-hanging /data/log
  txnlog transactions abort /data/log copier-1
  txnlog groups describe /data/log billing
  txnlog subscriptions describe /data/log orders 0 billing
  txnlog maintenance retention /data/log --topic orders
  txnlog topics list s3://bucket/log -o client_kwargs.endpoint_url=http://127.0.0.1:9000 --json

Every verb takes the log URL first; run 'txnlog NOUN VERB --help' for its options."""


def build_parser() -> argparse.ArgumentParser:
    from txn_core import __version__

    parser = Parser(
        prog=PROG,
        formatter_class=HelpFormatter,
        epilog=EXAMPLES,
        description="Inspect and operate a txnlog: a transactional log (Kafka/Pulsar transaction "
        "semantics) on any fsspec filesystem, with no broker.",
    )
    parser.add_argument("--debug", action="store_true", help="show the full traceback on errors")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="noun", required=True, metavar="COMMAND")
    common = common_options()
    topics.register(sub, common)
    transactions.register(sub, common)
    groups.register(sub, common)
    subscriptions.register(sub, common)
    dump.register(sub, common)
    produce.register(sub, common)
    maintenance.register(sub, common)
    demo.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns the exit status (0 ok, 1 error, 2 bad arguments, 130 interrupted)."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        getattr(args, "verb_parser", parser).error(f"unrecognized arguments: {' '.join(extra)}")
    debug = bool(getattr(args, "debug", False))
    try:
        return int(args.func(args))
    except TxnLogError as exc:
        return _fail(str(exc), debug)
    except KeyboardInterrupt:
        if debug:
            traceback.print_exc()
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader of our output went away (e.g. `txnlog dump ... | head`): not an error.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except Exception as exc:
        hint = "" if debug else "; this is probably a bug: rerun with --debug and report the traceback"
        return _fail(f"unexpected {type(exc).__name__}: {exc}{hint}", debug)


def _fail(message: str, debug: bool) -> int:
    if debug:
        traceback.print_exc()
    first, *rest = message.strip().splitlines() or [""]
    # One line: a multi-line message (e.g. a schema mismatch listing differences) is joined.
    line = first if not rest else first + " " + " ".join(r.strip() for r in rest)
    print(f"{PROG}: error: {line}", file=sys.stderr)
    return 1
