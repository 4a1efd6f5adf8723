"""``txnlog maintenance snapshot|compact|retention|sweep-staging`` (PROTOCOL.md "Snapshots", "Retention",
"Compaction", "Staged data"). Every one of them is safe to run at any time, concurrently with producers and
consumers, and safe to interrupt."""

from __future__ import annotations

import argparse
from typing import Any

from txn_core import maintenance
from txn_core.cli.common import (
    Parser,
    SubParsers,
    add_noun,
    add_verb,
    get_topic,
    non_negative_int,
    open_existing,
    positive_int,
)
from txn_core.cli.output import Progress, format_bytes, format_duration, print_json, print_table
from txn_core.errors import ConfigurationError


def register(sub: SubParsers, common: Parser) -> None:
    verbs = add_noun(
        sub,
        "maintenance",
        help="snapshots, transaction-log compaction, retention, staging cleanup",
        description="Maintenance tasks. Each is safe to run at any time next to producers and "
        "consumers, and safe to interrupt.",
        examples="  txnlog maintenance retention /data/log --topic orders\n"
        "  txnlog maintenance compact /data/log\n"
        "  txnlog maintenance snapshot /data/log",
    )

    p = add_verb(
        verbs,
        "snapshot",
        parents=[common],
        help="write transaction-buffer snapshots now",
        description="Write a transaction-buffer snapshot of every partition of the topics, so new "
        "readers start from it instead of replaying the partition.",
        examples="  txnlog maintenance snapshot /data/log\n  txnlog maintenance snapshot /data/log --topic orders",
    )
    p.add_argument("--topic", action="append", help="only this topic (repeatable; default: all)")
    p.set_defaults(func=snapshot)

    p = add_verb(
        verbs,
        "compact",
        parents=[common],
        help="compact the transaction log",
        description="Snapshot every coordinator partition of the transaction log and delete its "
        "records below the snapshot that are older than --min-age-ms.",
        examples="  txnlog maintenance compact /data/log\n  txnlog maintenance compact /data/log --min-age-ms 600000",
    )
    p.add_argument(
        "--min-age-ms",
        type=non_negative_int,
        metavar="MS",
        help="delete only records older than this (default: one hour)",
    )
    p.set_defaults(func=compact)

    p = add_verb(
        verbs,
        "retention",
        parents=[common],
        help="delete data the topics' retention no longer keeps",
        description="Apply retention: delete the oldest entries of each partition that are older "
        "than the retention time or beyond the retention size. Data of open transactions "
        "and entries younger than --min-age-ms are always kept. Without --topic, every "
        "topic with a retention setting.",
        examples="  txnlog maintenance retention /data/log\n"
        "  txnlog maintenance retention /data/log --topic orders --retention-ms 86400000\n"
        "  txnlog maintenance retention /data/log --topic orders --retention-bytes 1000000000",
    )
    p.add_argument("--topic", action="append", help="only this topic (repeatable)")
    p.add_argument("--retention-ms", type=positive_int, metavar="MS", help="override the topic's retention time")
    p.add_argument(
        "--retention-bytes",
        type=positive_int,
        metavar="BYTES",
        help="override the topic's retention size (per partition)",
    )
    p.add_argument(
        "--min-age-ms",
        type=non_negative_int,
        default=maintenance.MIN_ENTRY_AGE_MS,
        metavar="MS",
        help="never delete entries younger than this (default: 10 minutes; protects stalled writers)",
    )
    p.set_defaults(func=retention)

    p = add_verb(
        verbs,
        "sweep-staging",
        parents=[common],
        help="delete unreferenced staged objects",
        description="Delete staged objects (written by distributed writers such as Spark tasks) that "
        "no committed entry references and that are older than --older-than-ms. Scans "
        "every partition's headers: a task for quiet hours.",
        examples="  txnlog maintenance sweep-staging /data/log\n"
        "  txnlog maintenance sweep-staging /data/log --older-than-ms 3600000",
    )
    p.add_argument(
        "--older-than-ms",
        type=non_negative_int,
        default=24 * 3600 * 1000,
        metavar="MS",
        help="only objects older than this (default: one day)",
    )
    p.set_defaults(func=sweep_staging)


def snapshot(args: argparse.Namespace) -> int:
    log = open_existing(args)
    topics = [get_topic(log, t).name for t in args.topic] if args.topic else log.list_topics()
    rows: list[dict[str, Any]] = []
    with Progress("writing snapshots", len(topics), unit="topics") as bar:
        for topic in topics:
            for p, position in enumerate(maintenance.take_snapshots(log, topic)):
                rows.append({"topic": topic, "partition": p, "position": position})
            bar.advance()
    if args.json:
        print_json(rows)
        return 0
    print_table(
        ["topic", "partition", "snapshot at offset"],
        [[r["topic"], r["partition"], r["position"]] for r in rows],
        empty="no topics to snapshot",
    )
    return 0


def compact(args: argparse.Namespace) -> int:
    log = open_existing(args)
    with Progress(f"compacting {log.coordinator_partitions} coordinator partitions"):
        deleted = maintenance.compact_transaction_log(log, min_age_ms=args.min_age_ms)
    if args.json:
        print_json({"records_deleted": deleted, "coordinator_partitions": log.coordinator_partitions})
    else:
        print(
            f"snapshotted {log.coordinator_partitions} coordinator partitions; deleted {deleted} "
            "transaction-log record(s)"
        )
    return 0


def retention(args: argparse.Namespace) -> int:
    log = open_existing(args)
    explicit = args.retention_ms is not None or args.retention_bytes is not None
    if args.topic:
        topics = [get_topic(log, t).name for t in args.topic]
    else:
        topics = []
        for t in log.list_topics():
            config = log.topics.get(t).config
            if explicit or config.retention_ms is not None or config.retention_bytes is not None:
                topics.append(t)
        if not topics:
            raise ConfigurationError(
                "no topic has a retention setting: set one with 'txnlog topics set-retention', or pass --topic "
                "with --retention-ms/--retention-bytes"
            )
    rows: list[dict[str, Any]] = []
    with Progress("applying retention", len(topics), unit="topics") as bar:
        for t in topics:
            results = maintenance.apply_retention(
                log, t, retention_ms=args.retention_ms, retention_bytes=args.retention_bytes, min_age_ms=args.min_age_ms
            )
            rows.extend(
                {
                    "topic": r.topic,
                    "partition": r.partition,
                    "old_start": r.old_start,
                    "new_start": r.new_start,
                    "entries_deleted": r.entries_deleted,
                    "bytes_deleted": r.bytes_deleted,
                }
                for r in results
            )
            bar.advance()
    if args.json:
        print_json(rows)
        return 0
    print_table(
        ["topic", "partition", "old start", "new start", "entries deleted", "freed"],
        [
            [
                r["topic"],
                r["partition"],
                r["old_start"],
                r["new_start"],
                r["entries_deleted"],
                format_bytes(r["bytes_deleted"]),
            ]
            for r in rows
        ],
    )
    total = sum(r["entries_deleted"] for r in rows)
    print(
        f"\ndeleted {total} entr{'y' if total == 1 else 'ies'}, {format_bytes(sum(r['bytes_deleted'] for r in rows))}"
        f" (entries younger than {format_duration(args.min_age_ms)} and data of open transactions are kept)"
    )
    return 0


def sweep_staging(args: argparse.Namespace) -> int:
    log = open_existing(args)
    with Progress("sweeping staged objects"):
        deleted = maintenance.sweep_staging(log, older_than_ms=args.older_than_ms)
    if args.json:
        print_json({"staged_objects_deleted": deleted})
    else:
        print(f"deleted {deleted} unreferenced staged object(s) older than {format_duration(args.older_than_ms)}")
    return 0
