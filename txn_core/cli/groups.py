"""``txnlog groups list|describe``: consumer groups, committed offsets and lag (PROTOCOL.md "Consumer groups")."""

from __future__ import annotations

import argparse

from txn_core.cli.common import Parser, SubParsers, add_noun, add_verb, open_existing
from txn_core.cli.output import Progress, format_time, print_json, print_table
from txn_core.errors import GroupNotFoundError


def register(sub: SubParsers, common: Parser) -> None:
    verbs = add_noun(
        sub,
        "groups",
        help="consumer groups: committed offsets and lag",
        description="List consumer groups and show their committed offsets and lag.",
        examples="  txnlog groups list /data/log\n  txnlog groups describe /data/log billing",
    )

    p = add_verb(
        verbs,
        "list",
        parents=[common],
        help="list consumer groups",
        description="List the consumer groups that have committed offsets.",
        examples="  txnlog groups list /data/log",
    )
    p.set_defaults(func=list_groups)

    p = add_verb(
        verbs,
        "describe",
        parents=[common],
        help="committed offsets and lag per partition",
        description="Per topic-partition the group has committed: the committed offset (as a "
        "read_committed reader sees it: offsets committed inside a transaction count once "
        "it commits), the last stable offset, the log end, and the lag = LSO - committed "
        "(records the group can read but has not processed yet; records of open "
        "transactions are not lag).",
        examples="  txnlog groups describe /data/log billing\n  txnlog groups describe /data/log billing --json",
    )
    p.add_argument("group", metavar="GROUP")
    p.set_defaults(func=describe)


def list_groups(args: argparse.Namespace) -> int:
    log = open_existing(args)
    names = log.list_groups()
    if args.json:
        print_json(names)
        return 0
    print_table(["group"], [[n] for n in names], empty=f"no consumer groups in {log.url}")
    return 0


def describe(args: argparse.Namespace) -> int:
    log = open_existing(args)
    names = log.list_groups()
    if args.group not in names:
        raise GroupNotFoundError(
            f"unknown consumer group {args.group!r} (it never committed offsets); existing groups: "
            f"{', '.join(names) if names else '(none)'}"
        )
    with Progress(f"reading group {args.group}"):
        rows = log.describe_group(args.group)
        commit_ms = {(o.topic, o.partition): o.commit_ms for o in log.groups.committed(args.group).values()}
    for r in rows:
        r["commit_ms"] = commit_ms.get((r["topic"], r["partition"]))
    if args.json:
        print_json({"group": args.group, "partitions": rows, "total_lag": sum(r["lag"] or 0 for r in rows)})
        return 0
    print_table(
        ["topic", "partition", "committed", "LSO", "log end", "lag", "committed at", "metadata"],
        [
            [
                r["topic"],
                r["partition"],
                r["committed"],
                _known(r["last_stable_offset"]),
                _known(r["log_end_offset"]),
                r["lag"],
                format_time(r["commit_ms"]),
                r["metadata"],
            ]
            for r in rows
        ],
        empty=f"group {args.group!r} has no committed offsets",
    )
    if rows:
        print(f"\ntotal lag: {sum(r['lag'] or 0 for r in rows)}")
    return 0


def _known(offset: int) -> int | None:
    return offset if offset >= 0 else None
