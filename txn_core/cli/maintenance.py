"""``txnlog maintenance snapshot|compact|retention|roll|sweep-staging|damaged|mark-lost`` (PROTOCOL.md
"Snapshots", "Retention", "Segments", "Compaction", "Staged data", "Damage"). Every one of them is safe to
run at any time, concurrently with producers and consumers, and safe to interrupt. ``mark-lost`` is the one
operator act among them that changes what readers deliver: it asks for ``--yes`` and is recorded in the
log."""

from __future__ import annotations

import argparse
from typing import Any

from txn_core.cli.common import (
    Parser,
    SubParsers,
    add_noun,
    add_verb,
    get_topic,
    non_negative_int,
    open_existing,
    positive_int,
    readable_topics,
    report_damage,
)
from txn_core.cli.output import (
    Progress,
    format_bytes,
    format_duration,
    format_offsets,
    format_time,
    print_json,
    print_table,
)
from txn_core.coordinator.txnlog import COMPACTION_MIN_AGE_MS
from txn_core.errors import ConfigurationError, CorruptDataError
from txn_core.ops import damage, maintenance
from txn_core.ops.rolling import ROLL_BYTES, ROLL_ENTRIES, RollPolicy
from txn_core.partition import ages


def register(sub: SubParsers, common: Parser) -> None:
    verbs = add_noun(
        sub,
        "maintenance",
        help="snapshots, transaction-log compaction, retention, rolling into segments, staging cleanup",
        description="Maintenance tasks. Each is safe to run at any time next to producers and "
        "consumers, and safe to interrupt.",
        examples="  txnlog maintenance retention /data/log --topic orders\n"
        "  txnlog maintenance roll /data/log\n"
        "  txnlog maintenance compact /data/log\n"
        "  txnlog maintenance snapshot /data/log\n"
        "  txnlog maintenance damaged /data/log",
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
        examples="  txnlog maintenance compact /data/log\n  txnlog maintenance compact /data/log --min-age-ms 7200000",
    )
    p.add_argument(
        "--min-age-ms",
        type=non_negative_int,
        metavar="MS",
        help="delete only records older than this (default and least: one hour; writers rely on it)",
    )
    _age_check_flag(p)
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
        help="never delete entries younger than this (default: 10 minutes, least 2 minutes; protects stalled writers)",
    )
    _age_check_flag(p)
    p.set_defaults(func=retention)

    p = add_verb(
        verbs,
        "roll",
        parents=[common],
        help="roll partitions' decided history into segments",
        description="Roll each partition's fully decided entries (below the last stable offset) into "
        "segments, one object of up to 8192 entries each, when at least --entries entries or --bytes bytes "
        "are waiting; then delete the loose entries (and staged objects) that segments older than "
        "--min-age-ms hold. Readers read segments and loose entries alike.",
        examples="  txnlog maintenance roll /data/log\n"
        "  txnlog maintenance roll /data/log --topic orders --entries 500",
    )
    p.add_argument("--topic", action="append", help="only this topic (repeatable; default: all)")
    p.add_argument(
        "--entries",
        type=positive_int,
        default=ROLL_ENTRIES,
        metavar="N",
        help=f"roll once this many entries wait (default {ROLL_ENTRIES})",
    )
    p.add_argument(
        "--bytes",
        type=positive_int,
        default=ROLL_BYTES,
        metavar="BYTES",
        help=f"or once they hold this many bytes (default {ROLL_BYTES})",
    )
    p.add_argument(
        "--min-age-ms",
        type=non_negative_int,
        default=maintenance.MIN_ENTRY_AGE_MS,
        metavar="MS",
        help="delete rolled entries only when their segment is older than this (default: 10 minutes, "
        "least 2 minutes; protects readers and stalled writers)",
    )
    _age_check_flag(p)
    p.set_defaults(func=roll)

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
        help="only objects older than this (default: one day, least one hour: a batch's objects are "
        "unreferenced until it commits)",
    )
    _age_check_flag(p, "--older-than-ms", "no batch is being written")
    p.set_defaults(func=sweep_staging)

    p = add_verb(
        verbs,
        "damaged",
        parents=[common],
        help="list and inspect damaged entries",
        description="List the damaged entries of every partition (or of the given topics and partitions): "
        "which check each fails, its size, the offsets its neighbours give it, what its bytes still tell, "
        "and whether it is marked lost. Reads every entry header; --verify-payloads reads every record too. "
        "Exits with status 1 while anything is damaged and not marked lost.",
        examples="  txnlog maintenance damaged /data/log\n"
        "  txnlog maintenance damaged /data/log --topic orders --partition 3 --verify-payloads",
    )
    p.add_argument("--topic", action="append", help="only this topic (repeatable; default: all)")
    p.add_argument("--partition", type=non_negative_int, action="append", metavar="P", help="only this partition")
    p.add_argument(
        "--verify-payloads",
        action="store_true",
        help="also read every entry and staged object and check its records (reads all the data)",
    )
    p.set_defaults(func=damaged)

    p = add_verb(
        verbs,
        "mark-lost",
        parents=[common],
        help="mark a damaged entry's offsets lost (an operator act recorded in the log)",
        description="Record in the log that the records of a damaged entry are gone, so that readers skip "
        "its offsets (with a warning) instead of stopping at it. The offsets come from the entries around "
        "it; a damaged last entry needs --records (at least its record count: a larger count is safe, "
        "offsets are skipped and never reused) and is sealed by a one-offset entry after it. For every "
        "transaction open before it, the outcome the transaction log gives now is recorded, so readers "
        "decide it the same way whenever they read. Mark damaged entries in slot order. Nothing is deleted.",
        examples="  txnlog maintenance mark-lost /data/log --topic orders --partition 3 --slot 1207 "
        "--reason 'disk bit rot, no replica' --yes\n"
        "  txnlog maintenance mark-lost /data/log --topic orders --partition 3 --slot 1300 --records 500 "
        "--reason 'truncated by a failed copy' --yes",
    )
    p.add_argument("--topic", required=True, help="the topic")
    p.add_argument("--partition", type=non_negative_int, required=True, metavar="P", help="the partition")
    p.add_argument("--slot", type=non_negative_int, required=True, metavar="N", help="the damaged entry's slot")
    p.add_argument(
        "--records",
        type=positive_int,
        metavar="K",
        help="its record count, when no entry after it tells (the last entry, or one before another damaged one)",
    )
    p.add_argument("--reason", required=True, metavar="TEXT", help="why (recorded in the log with who and when)")
    p.add_argument("--yes", action="store_true", help="really mark it (without: show what would be marked)")
    p.set_defaults(func=mark_lost)


def _age_check_flag(
    p: argparse.ArgumentParser, option: str = "--min-age-ms", when: str = "no other process writes to the log"
) -> None:
    p.add_argument(
        "--no-age-check",
        action="store_true",
        help=f"accept a {option} below the safe least (only while {when})",
    )


def _check_age(args: argparse.Namespace, what: str, floor_ms: int, age_ms: int | None = None, **kw: str) -> None:
    """A --min-age-ms (or ``age_ms``) below ``floor_ms`` is refused before anything is opened, naming
    --no-age-check: the verbs then call maintenance with ``check_min_age=False`` (checked here already)."""
    if not args.no_age_check:
        value = args.min_age_ms if age_ms is None else age_ms
        ages.check_min_age_of(what, value, floor_ms, flag="--no-age-check", **kw)


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
    if args.min_age_ms is not None:
        _check_age(args, "transaction-log compaction", COMPACTION_MIN_AGE_MS)
    log = open_existing(args)
    with Progress(f"compacting {log.coordinator_partitions} coordinator partitions"):
        deleted = maintenance.compact_transaction_log(log, min_age_ms=args.min_age_ms, check_min_age=False)
    if args.json:
        print_json({"records_deleted": deleted, "coordinator_partitions": log.coordinator_partitions})
    else:
        print(
            f"snapshotted {log.coordinator_partitions} coordinator partitions; deleted {deleted} "
            "transaction-log record(s)"
        )
    return 0


def retention(args: argparse.Namespace) -> int:
    _check_age(args, "retention", ages.SAFE_ENTRY_AGE_MS)
    log = open_existing(args)
    explicit = args.retention_ms is not None or args.retention_bytes is not None
    if args.topic:
        topics = [get_topic(log, t).name for t in args.topic]
        keeps_all = [
            t
            for t in topics
            if not explicit
            and log.topics.get(t).config.retention_ms is None
            and log.topics.get(t).config.retention_bytes is None
        ]
        if keeps_all:
            raise ConfigurationError(
                f"topic {keeps_all[0]!r} keeps everything (no retention setting): set one with 'txnlog topics "
                "set-retention', or pass --retention-ms/--retention-bytes"
            )
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
                log,
                t,
                retention_ms=args.retention_ms,
                retention_bytes=args.retention_bytes,
                min_age_ms=args.min_age_ms,
                check_min_age=False,
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


def roll(args: argparse.Namespace) -> int:
    _check_age(args, "rolling", ages.SAFE_ENTRY_AGE_MS)
    log = open_existing(args)
    topics = [get_topic(log, t).name for t in args.topic] if args.topic else log.list_topics()
    policy = RollPolicy(entries=args.entries, bytes=args.bytes)
    rows: list[dict[str, Any]] = []
    with Progress("rolling into segments", len(topics), unit="topics") as bar:
        for topic in topics:
            for p, r in enumerate(
                maintenance.roll_segments(log, topic, policy=policy, min_age_ms=args.min_age_ms, check_min_age=False)
            ):
                rows.append(
                    {
                        "topic": topic,
                        "partition": p,
                        "segments_created": r.segments,
                        "entries_rolled": r.entries,
                        "rolled_through_slot": r.chain_end,
                        "entries_deleted": r.deleted_entries,
                        "staged_deleted": r.deleted_staged,
                    }
                )
            bar.advance()
    if args.json:
        print_json(rows)
        return 0
    print_table(
        ["topic", "partition", "segments", "entries rolled", "rolled through slot", "loose deleted", "staged deleted"],
        [
            [
                r["topic"],
                r["partition"],
                r["segments_created"],
                r["entries_rolled"],
                r["rolled_through_slot"],
                r["entries_deleted"],
                r["staged_deleted"],
            ]
            for r in rows
        ],
        empty="no topics to roll",
    )
    print(
        f"\nrolled {sum(r['entries_rolled'] for r in rows)} entries into {sum(r['segments_created'] for r in rows)} "
        f"segment(s); deleted {sum(r['entries_deleted'] for r in rows)} loose entries of segments older than "
        f"{format_duration(args.min_age_ms)}"
    )
    return 0


def sweep_staging(args: argparse.Namespace) -> int:
    _check_age(
        args,
        "sweeping staged objects",
        maintenance.SAFE_STAGED_AGE_MS,
        args.older_than_ms,
        risk=maintenance.STAGED_RISK,
        when="no batch is written",
    )
    log = open_existing(args)
    with Progress("sweeping staged objects"):
        deleted = maintenance.sweep_staging(log, older_than_ms=args.older_than_ms, check_min_age=False)
    if args.json:
        print_json({"staged_objects_deleted": deleted})
    else:
        print(f"deleted {deleted} unreferenced staged object(s) older than {format_duration(args.older_than_ms)}")
    return 0


def damaged(args: argparse.Namespace) -> int:
    log = open_existing(args)
    topics = [get_topic(log, t).name for t in args.topic] if args.topic else log.list_topics()
    found: list[damage.DamagedEntry] = []
    metas, damaged_metas = readable_topics(log, topics)
    with Progress("checking entries", len(metas), unit="topics") as bar:
        for meta in metas:
            for p in args.partition or range(meta.partitions):
                found.extend(damage.find_damaged(log, meta.name, p, payloads=args.verify_payloads))
            bar.advance()
    records = damaged_metas + ([] if args.topic else damaged_coordinator_records(log))
    # Exit status 1 when anything is damaged and not resolved (entries marked lost are): scripts can check.
    unresolved = 1 if any(d.lost is None for d in found) else 0
    if args.json:
        print_json([damaged_json(d) for d in found])
        return report_damage("metadata or transaction log", records) or unresolved
    checked = "headers and records" if args.verify_payloads else "headers; --verify-payloads checks every record"
    print_table(
        ["topic", "partition", "slot", "offsets", "size", "check failed", "marked lost"],
        [
            [
                d.topic,
                d.partition,
                d.slot,
                format_offsets(d.first_offset, d.next_offset),
                format_bytes(d.size),
                d.check,
                f"yes, by {d.lost.by} at {format_time(d.lost.marked_ms)}: {d.lost.reason}" if d.lost else "no",
            ]
            for d in found
        ],
        empty=f"no damaged entries ({checked})",
        full=["check failed", "marked lost"],
    )
    for d in found:
        if d.hint and d.lost is None:
            print(f"{d.key}: {d.hint}")
    return report_damage("metadata or transaction log", records) or unresolved


def damaged_coordinator_records(log: Any) -> list[CorruptDataError]:
    """The damaged records of the transaction log that readers and producers would read (from each coordinator
    partition's newest snapshot on), one per coordinator partition: its replay stops at the first."""
    out = []
    for c in range(log.coordinator_partitions):
        try:
            log.views.get(c).refresh()
        except CorruptDataError as exc:
            out.append(exc)
    return out


def mark_lost(args: argparse.Namespace) -> int:
    log = open_existing(args)
    get_topic(log, args.topic)
    if not args.yes:
        entry = damage.inspect(log, args.topic, args.partition, args.slot)
        if entry is not None:
            hint = f"; {entry.hint}" if entry.hint else ""
            print(
                f"{entry.key}: {entry.check}; offsets {format_offsets(entry.first_offset, entry.next_offset)}{hint}"
                + (f"; marked lost already by {entry.lost.by}" if entry.lost else "")
            )
        raise ConfigurationError(
            "nothing was marked: marking an entry lost is an operator act recorded in the log (readers then "
            "skip its offsets). Pass --yes to do it"
        )
    lost = damage.mark_lost(log, args.topic, args.partition, args.slot, reason=args.reason, records=args.records)
    if args.json:
        print_json(lost.to_json())
        return 0
    print(
        f"marked offsets [{lost.first_offset}, {lost.next_offset}) of {args.topic}-{args.partition} lost "
        f"({lost.records} record(s) in {lost.key}), by {lost.by}: {lost.reason}"
    )
    if lost.sealed:
        print(f"sealed: slot {lost.slot + 1} now holds a one-offset SEAL entry at offset {lost.next_offset}")
    for txn, outcome in lost.outcomes:
        print(f"transaction {txn}, open before it: {outcome}")
    return 0


def damaged_json(d: damage.DamagedEntry) -> dict[str, Any]:
    return {
        "topic": d.topic,
        "partition": d.partition,
        "slot": d.slot,
        "key": d.key,
        "check": d.check,
        "size": d.size,
        "first_offset": d.first_offset,
        "next_offset": d.next_offset,
        "header_intact": d.header_intact,
        "kind": d.kind,
        "hint": d.hint,
        "marked_lost": d.lost.to_json() if d.lost else None,
    }
