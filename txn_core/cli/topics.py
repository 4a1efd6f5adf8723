"""``txnlog topics create|list|describe|add-partitions|set-retention``."""

from __future__ import annotations

import argparse
from typing import Any

from txn_core.cli.common import (
    Parser,
    SubParsers,
    add_noun,
    add_verb,
    get_topic,
    open_existing,
    open_or_create,
    optional_positive_int,
    positive_int,
    readable_topics,
    report_damage,
    schema_spec,
)
from txn_core.cli.output import (
    Progress,
    format_bytes,
    format_duration,
    format_offsets,
    print_fields,
    print_json,
    print_table,
)
from txn_core.cli.schemaspec import EXAMPLE, TYPES_HELP, format_schema
from txn_core.clients.topics import TopicConfig, TopicMeta
from txn_core.errors import ConfigurationError
from txn_core.log import PartitionDescription


def register(sub: SubParsers, common: Parser) -> None:
    verbs = add_noun(
        sub,
        "topics",
        help="create, list and describe topics",
        description="Create, list and describe topics; grow them; change their retention.",
        examples=f"  txnlog topics create /data/log orders --partitions 4 --schema '{EXAMPLE}'\n"
        "  txnlog topics list /data/log\n"
        "  txnlog topics describe /data/log orders",
    )

    p = add_verb(
        verbs,
        "create",
        parents=[common],
        help="create a topic (and the log, if new)",
        description="Create a topic with a fixed Arrow schema. Creates the log itself if the URL "
        f"holds none yet.\n\nSchema types: {TYPES_HELP}; add ' not null' after a type "
        "to forbid nulls.",
        examples=f"  txnlog topics create /data/log orders --partitions 4 --schema '{EXAMPLE}'\n"
        "  txnlog topics create s3://bucket/log clicks -p 8 -s 'url:string,ts:timestamp[ms, UTC]' "
        "--retention-ms 604800000",
    )
    p.add_argument("topic", metavar="TOPIC", help="topic name (letters, digits, '.', '_', '-')")
    p.add_argument("-p", "--partitions", type=positive_int, required=True, metavar="N", help="number of partitions")
    p.add_argument(
        "-s",
        "--schema",
        type=schema_spec,
        required=True,
        metavar="SPEC",
        help=f"columns as NAME:TYPE,..., e.g. '{EXAMPLE}'",
    )
    p.add_argument(
        "--retention-ms",
        type=positive_int,
        metavar="MS",
        help="delete data older than this many milliseconds (default: keep everything)",
    )
    p.add_argument(
        "--retention-bytes", type=positive_int, metavar="BYTES", help="keep at most this many bytes per partition"
    )
    p.set_defaults(func=create)

    p = add_verb(
        verbs,
        "list",
        parents=[common],
        help="list topics",
        description="List the topics of a log with their partition counts, retention and schema.",
        examples="  txnlog topics list /data/log\n  txnlog topics list s3://bucket/log -o anon=false --json",
    )
    p.set_defaults(func=list_topics)

    p = add_verb(
        verbs,
        "describe",
        parents=[common],
        help="per partition: offsets, open transactions, size",
        description="Describe a topic: per partition the log start and end, the last stable offset "
        "(LSO: read_committed readers stop there), how far open transactions hold it back, "
        "the open transactions with their age, aborted and committed transaction counts, "
        "and the size.\n\nLike every reader, describe aborts a transaction it finds open "
        'past its timeout (PROTOCOL.md "Timeouts").',
        examples="  txnlog topics describe /data/log orders\n"
        "  txnlog topics describe /data/log orders --partition 0 --partition 3 --json",
    )
    p.add_argument("topic", metavar="TOPIC")
    p.add_argument(
        "--partition", type=int, action="append", metavar="P", help="only this partition (repeatable; default: all)"
    )
    p.set_defaults(func=describe)

    p = add_verb(
        verbs,
        "add-partitions",
        parents=[common],
        help="grow a topic to more partitions",
        description="Grow a topic to a new total number of partitions (the count never shrinks; "
        "readers pick new partitions up from their beginning).",
        examples="  txnlog topics add-partitions /data/log orders --total 8",
    )
    p.add_argument("topic", metavar="TOPIC")
    p.add_argument("--total", type=positive_int, required=True, metavar="N", help="the new number of partitions")
    p.set_defaults(func=add_partitions)

    p = add_verb(
        verbs,
        "set-retention",
        parents=[common],
        help="change a topic's retention",
        description="Change how long a topic keeps data. Settings not given are kept; 'none' removes "
        "one. Retention is applied by 'txnlog maintenance retention'.",
        examples="  txnlog topics set-retention /data/log orders --retention-ms 86400000\n"
        "  txnlog topics set-retention /data/log orders --retention-bytes none",
    )
    p.add_argument("topic", metavar="TOPIC")
    p.add_argument(
        "--retention-ms",
        type=optional_positive_int,
        default=argparse.SUPPRESS,
        metavar="MS|none",
        help="delete data older than this many milliseconds",
    )
    p.add_argument(
        "--retention-bytes",
        type=optional_positive_int,
        default=argparse.SUPPRESS,
        metavar="BYTES|none",
        help="keep at most this many bytes per partition",
    )
    p.set_defaults(func=set_retention)


# --- helpers -----------------------------------------------------------------------------------


def meta_json(meta: TopicMeta) -> dict[str, Any]:
    return {
        "name": meta.name,
        "partitions": meta.partitions,
        "schema": format_schema(meta.schema),
        "version": meta.version,
        "created_ms": meta.created_ms,
        "retention_ms": meta.config.retention_ms,
        "retention_bytes": meta.config.retention_bytes,
    }


def retention_text(config: TopicConfig) -> str:
    parts = []
    if config.retention_ms is not None:
        parts.append(format_duration(config.retention_ms))
    if config.retention_bytes is not None:
        parts.append(format_bytes(config.retention_bytes) + "/partition")
    return ", ".join(parts) if parts else "forever"


def partition_json(d: PartitionDescription) -> dict[str, Any]:
    """A partition's description as JSON; ``damaged_entries`` appears only when it has some."""
    out = {
        "partition": d.partition,
        "log_start_offset": d.log_start_offset,
        "log_end_offset": d.log_end_offset,
        "last_stable_offset": d.last_stable_offset,
        "held_back": d.lso_lag,
        "ongoing_transactions": [
            {
                "txn": str(o.txn),
                "transactional_id": o.transactional_id,
                "state": o.state,
                "first_offset": o.first_offset,
                "last_offset": o.last_offset,
                "producer_id": o.producer_id,
                "producer_epoch": o.producer_epoch,
                "age_ms": o.age_ms,
            }
            for o in d.ongoing_transactions
        ],
        "aborted_transactions": d.aborted_transactions,
        "committed_transactions": d.committed_transactions,
        "size_bytes": d.size_bytes,
    }
    if d.damaged_entries:
        out["damaged_entries"] = [
            {
                "slot": e.slot,
                "key": e.key,
                "check": e.check,
                "first_offset": e.first_offset,
                "next_offset": e.next_offset,
                "marked_lost": e.marked_lost,
                "reason": e.reason,
                "by": e.by,
                "marked_ms": e.marked_ms,
            }
            for e in d.damaged_entries
        ]
    return out


# --- verbs -------------------------------------------------------------------------------------


def create(args: argparse.Namespace) -> int:
    log = open_or_create(args)
    meta = log.create_topic(
        args.topic, args.partitions, args.schema, retention_ms=args.retention_ms, retention_bytes=args.retention_bytes
    )
    if args.json:
        print_json(meta_json(meta))
    else:
        print(
            f"created topic {meta.name!r} in {log.url}: {meta.partitions} partition(s), "
            f"schema {format_schema(meta.schema)}, retention {retention_text(meta.config)}"
        )
    return 0


def list_topics(args: argparse.Namespace) -> int:
    log = open_existing(args)
    names = log.list_topics()
    with Progress("reading topics", len(names), unit="topics") as bar:
        metas, damaged = readable_topics(log, names, bar.advance)
    if args.json:
        print_json([meta_json(m) for m in metas])
        return report_damage("topic metadata", damaged)
    print_table(
        ["topic", "partitions", "retention", "schema"],
        [[m.name, m.partitions, retention_text(m.config), format_schema(m.schema)] for m in metas],
        empty=f"no topics in {log.url}",
    )
    return report_damage("topic metadata", damaged)


def describe(args: argparse.Namespace) -> int:
    log = open_existing(args)
    meta = get_topic(log, args.topic)
    wanted = args.partition if args.partition else list(range(meta.partitions))
    bad = [p for p in wanted if not 0 <= p < meta.partitions]
    if bad:
        raise ConfigurationError(
            f"topic {meta.name!r} has no partition {bad[0]}: its partitions are 0..{meta.partitions - 1}"
        )
    descs = []
    with Progress(f"describing {meta.name}", len(wanted), unit="partitions") as bar:
        for p in wanted:
            d = log.describe_partition(meta.name, p, meta=meta)
            if any(o.state != "Ongoing" for o in d.ongoing_transactions):
                # Computing the LSO ended a transaction (a timeout) or found one decided whose markers were
                # being written: describe again so the new markers are counted.
                d = log.describe_partition(meta.name, p, meta=meta)
            descs.append(d)
            bar.advance()
    if args.json:
        print_json({**meta_json(meta), "partition_details": [partition_json(d) for d in descs]})
        return 0
    print_fields(
        [
            ("topic", meta.name),
            ("partitions", meta.partitions),
            ("schema", format_schema(meta.schema)),
            ("retention", retention_text(meta.config)),
            ("version", meta.version),
        ]
    )
    print()
    print_table(
        ["partition", "log start", "log end", "LSO", "held back", "open txns", "aborted", "committed", "size"],
        [
            [
                d.partition,
                d.log_start_offset,
                d.log_end_offset,
                d.last_stable_offset,
                d.lso_lag,
                len(d.ongoing_transactions),
                d.aborted_transactions,
                d.committed_transactions,
                format_bytes(d.size_bytes),
            ]
            for d in descs
        ],
    )
    damaged = [(d.partition, e) for d in descs for e in d.damaged_entries]
    if damaged:
        print()
        print("damaged entries (reads stop at one not marked lost; see 'txnlog maintenance damaged'):")
        print_table(
            ["partition", "slot", "offsets", "check failed", "marked lost"],
            [
                [
                    p,
                    e.slot,
                    format_offsets(e.first_offset, e.next_offset),
                    e.check,
                    f"yes, by {e.by}: {e.reason}" if e.marked_lost else "no",
                ]
                for p, e in damaged
            ],
            full=["check failed", "marked lost"],
        )
    ongoing = [(d.partition, o) for d in descs for o in d.ongoing_transactions]
    print()
    if not ongoing:
        print("no open transactions")
        return 0
    print("open transactions:")
    print_table(
        ["partition", "txn", "transactional id", "state", "first offset", "last offset", "producer", "epoch", "age"],
        [
            [
                p,
                str(o.txn),
                o.transactional_id,
                o.state,
                o.first_offset,
                o.last_offset,
                o.producer_id,
                o.producer_epoch,
                format_duration(o.age_ms),
            ]
            for p, o in ongoing
        ],
    )
    return 0


def add_partitions(args: argparse.Namespace) -> int:
    log = open_existing(args)
    before = get_topic(log, args.topic).partitions
    meta = log.add_partitions(args.topic, args.total)
    if args.json:
        print_json({**meta_json(meta), "previous_partitions": before})
    elif before == meta.partitions:
        print(f"topic {meta.name!r} already has {meta.partitions} partition(s)")
    else:
        print(f"topic {meta.name!r} now has {meta.partitions} partitions (was {before})")
    return 0


def set_retention(args: argparse.Namespace) -> int:
    if not hasattr(args, "retention_ms") and not hasattr(args, "retention_bytes"):
        raise ConfigurationError(
            "set-retention needs --retention-ms and/or --retention-bytes (a number, or 'none' to keep forever)"
        )
    log = open_existing(args)
    current = get_topic(log, args.topic).config
    retention_ms = getattr(args, "retention_ms", current.retention_ms)
    retention_bytes = getattr(args, "retention_bytes", current.retention_bytes)
    meta = log.set_retention(args.topic, retention_ms=retention_ms, retention_bytes=retention_bytes)
    if args.json:
        print_json(meta_json(meta))
    else:
        print(f"topic {meta.name!r} now keeps data: {retention_text(meta.config)}")
    return 0
