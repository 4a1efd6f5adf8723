"""``txnlog transactions list|describe|abort|find-hanging|expire`` (PROTOCOL.md "Admin")."""

from __future__ import annotations

import argparse
from typing import Any

from txn_core.cli.common import Parser, SubParsers, add_noun, add_verb, get_topic, non_negative_int, open_existing
from txn_core.cli.output import Progress, format_duration, format_time, print_fields, print_json, print_table
from txn_core.errors import ConfigurationError
from txn_core.format.ids import TxnId
from txn_core.format.states import CoordinatorState
from txn_core.ops.admin import HangingTransaction, TransactionDescription

_OPEN = {CoordinatorState.ONGOING.value, CoordinatorState.PREPARE_COMMIT.value, CoordinatorState.PREPARE_ABORT.value}


def register(sub: SubParsers, common: Parser) -> None:
    verbs = add_noun(
        sub,
        "transactions",
        help="list, describe, abort and find hanging transactions",
        description="Inspect and end transactions (like Kafka's kafka-transactions.sh).",
        examples="  txnlog transactions list /data/log\n"
        "  txnlog transactions find-hanging /data/log\n"
        "  txnlog transactions abort /data/log copier-1",
    )

    p = add_verb(
        verbs,
        "list",
        parents=[common],
        help="list open transactions (or all transactional ids)",
        description="List the transactional ids with an open transaction (Ongoing, PrepareCommit, "
        "PrepareAbort), with their age and timeout; --all lists every transactional id.",
        examples="  txnlog transactions list /data/log\n  txnlog transactions list /data/log --all --json",
    )
    p.add_argument("--all", action="store_true", help="include transactional ids with no open transaction")
    p.set_defaults(func=list_transactions)

    p = add_verb(
        verbs,
        "describe",
        parents=[common],
        help="one transactional id in detail",
        description="Describe a transactional id: state, producer id and epoch, the current or last "
        "transaction, its participants, timeout and age, the metadata of its last "
        "committed transaction, and why its last transaction was aborted.",
        examples="  txnlog transactions describe /data/log copier-1",
    )
    p.add_argument("transactional_id", metavar="TRANSACTIONAL_ID")
    p.set_defaults(func=describe)

    p = add_verb(
        verbs,
        "abort",
        parents=[common],
        help="abort a transactional id's open transaction",
        description="Abort the open transaction of a transactional id, as an operator: its producer "
        "is fenced (its next call fails) and every partition's last stable offset moves "
        "past it. A prepared transaction is completed instead (its outcome is decided).",
        examples="  txnlog transactions abort /data/log copier-1\n"
        "  txnlog transactions abort /data/log --topic orders --partition 1 --txn 11:4",
    )
    p.add_argument(
        "transactional_id",
        metavar="TRANSACTIONAL_ID",
        nargs="?",
        help="the transactional id whose open transaction to abort",
    )
    p.add_argument(
        "--topic",
        help="with --partition and --txn: abort a hanging transaction in one partition "
        "(KIP-664), e.g. one that wrote there without registering it",
    )
    p.add_argument("--partition", type=non_negative_int, metavar="P")
    p.add_argument("--txn", metavar="C:S[.I]", help="the transaction id find-hanging printed")
    p.set_defaults(func=abort)

    p = add_verb(
        verbs,
        "find-hanging",
        parents=[common],
        help="transactions holding back a last stable offset",
        description="Find hanging transactions (KIP-664): open in a partition past their timeout, "
        "open longer than --max-age-ms, or with data in a partition that never got their "
        "marker. End them with 'txnlog transactions abort' or 'txnlog transactions expire'.",
        examples="  txnlog transactions find-hanging /data/log\n"
        "  txnlog transactions find-hanging /data/log --topic orders --max-age-ms 60000",
    )
    p.add_argument("--topic", help="only this topic (default: all)")
    p.add_argument(
        "--max-age-ms", type=non_negative_int, metavar="MS", help="also report transactions open longer than this"
    )
    p.set_defaults(func=find_hanging)

    p = add_verb(
        verbs,
        "expire",
        parents=[common],
        help="abort every transaction past its timeout",
        description="Abort every transaction that is open past its timeout (and complete those "
        "prepared for too long) - what any reader would do on meeting them.",
        examples="  txnlog transactions expire /data/log",
    )
    p.set_defaults(func=expire)


def describe_json(d: TransactionDescription) -> dict[str, Any]:
    return {
        "transactional_id": d.transactional_id,
        "state": d.state,
        "producer_id": d.producer_id,
        "producer_epoch": d.producer_epoch,
        "txn": str(d.txn) if d.txn else None,
        "timeout_ms": d.timeout_ms,
        "start_ms": d.start_ms,
        "age_ms": d.age_ms,
        "participants": list(d.participants),
        "last_committed_metadata": d.last_committed_metadata,
        "abort_reason": d.abort_reason,
        "ahead": str(d.ahead) if d.ahead else None,
    }


def hanging_json(h: HangingTransaction) -> dict[str, Any]:
    return {
        "topic": h.topic_partition.topic,
        "partition": h.topic_partition.partition,
        "txn": str(h.txn),
        "transactional_id": h.transactional_id,
        "first_offset": h.first_offset,
        "age_ms": h.age_ms,
        "reason": h.reason,
    }


def list_transactions(args: argparse.Namespace) -> int:
    log = open_existing(args)
    with Progress("reading the transaction log"):
        listing = log.list_transactions(include_complete=args.all)
    rows: list[dict[str, Any]] = []
    now = log.clock()
    for t in listing:
        st = log.views.get(t.coordinator).state(t.transactional_id)
        is_open = t.state in _OPEN
        age = now - st.start_ms if st is not None and is_open and st.start_ms and not t.begun_ahead else None
        rows.append(
            {
                "transactional_id": t.transactional_id,
                "state": t.state,
                "begun_ahead": t.begun_ahead,
                "producer_id": t.producer_id,
                "producer_epoch": t.producer_epoch,
                "txn": str(t.txn) if t.txn else None,
                "coordinator": t.coordinator,
                "timeout_ms": st.timeout_ms if st else None,
                "age_ms": age,
                "participants": len(st.participants) if st and is_open else 0,
            }
        )
    if args.json:
        print_json(rows)
        return 0
    what = "transactional ids" if args.all else "open transactions"
    print_table(
        ["transactional id", "state", "txn", "producer", "epoch", "participants", "timeout", "age"],
        [
            [
                r["transactional_id"],
                f"{r['state']} (begun ahead)" if r["begun_ahead"] else r["state"],
                r["txn"] if r["state"] in _OPEN or args.all else None,
                r["producer_id"],
                r["producer_epoch"],
                r["participants"],
                format_duration(r["timeout_ms"]),
                format_duration(r["age_ms"]),
            ]
            for r in rows
        ],
        empty=f"no {what} in {log.url}",
    )
    return 0


def _print_description(d: TransactionDescription) -> None:
    is_open = d.state in _OPEN
    print_fields(
        [
            ("transactional id", d.transactional_id),
            ("state", d.state),
            ("producer", f"id {d.producer_id}, epoch {d.producer_epoch}"),
            ("transaction" if is_open else "last transaction", str(d.txn) if d.txn else None),
            ("timeout", format_duration(d.timeout_ms)),
            (
                "started",
                (format_time(d.start_ms) if d.start_ms is not None else "at its first write (begun ahead)")
                if d.txn
                else None,
            ),
            ("age", format_duration(d.age_ms) if is_open else None),
            ("participants", ", ".join(d.participants) if d.participants else None),
            ("last committed metadata", d.last_committed_metadata),
            ("abort reason", d.abort_reason),
            (
                "next transaction",
                f"{d.ahead} (begun ahead: open wherever its producer has written under it, idle otherwise)"
                if d.ahead
                else None,
            ),
        ]
    )


def describe(args: argparse.Namespace) -> int:
    log = open_existing(args)
    d = log.describe_transaction(args.transactional_id)
    if args.json:
        print_json(describe_json(d))
    else:
        _print_description(d)
    return 0


def abort(args: argparse.Namespace) -> int:
    log = open_existing(args)
    if args.topic is not None or args.txn is not None or args.partition is not None:
        if args.topic is None or args.txn is None or args.partition is None or args.transactional_id:
            raise ConfigurationError(
                "abort one partition's hanging transaction with all of --topic, "
                "--partition and --txn, and no transactional id"
            )
        get_topic(log, args.topic)
        offset = log.abort_hanging_transaction(args.topic, args.partition, TxnId.parse(args.txn))
        if args.json:
            print_json({"topic": args.topic, "partition": args.partition, "txn": args.txn, "marker_offset": offset})
        else:
            print(f"wrote an ABORT marker for {args.txn} into {args.topic}-{args.partition} at offset {offset}")
        return 0
    if not args.transactional_id:
        raise ConfigurationError("give a TRANSACTIONAL_ID, or --topic, --partition and --txn")
    before = log.describe_transaction(args.transactional_id)
    after = log.abort_transaction(args.transactional_id)
    acted = before.state in _OPEN
    if args.json:
        print_json(
            {
                "aborted": before.state == CoordinatorState.ONGOING.value,
                "completed": acted,
                "before": describe_json(before),
                "after": describe_json(after),
            }
        )
        return 0
    if before.state == CoordinatorState.ONGOING.value:
        print(
            f"aborted transaction {before.txn} of {before.transactional_id!r} (open for "
            f"{format_duration(before.age_ms)}, {len(before.participants)} participant(s)); its producer is "
            f"fenced (epoch {before.producer_epoch} -> {after.producer_epoch}); state now {after.state}"
        )
    elif acted:
        print(
            f"transaction {before.txn} of {before.transactional_id!r} was already decided ({before.state}); "
            f"completed it: state now {after.state}"
        )
    else:
        print(f"{before.transactional_id!r} has no open transaction (state {before.state}); nothing to abort")
    return 0


def find_hanging(args: argparse.Namespace) -> int:
    log = open_existing(args)
    with Progress("scanning partitions for hanging transactions"):
        if args.topic:
            get_topic(log, args.topic)  # unknown topic: a clear error listing the topics
        found = log.find_hanging_transactions(args.topic, max_age_ms=args.max_age_ms)
    if args.json:
        print_json([hanging_json(h) for h in found])
        return 0
    print_table(
        ["topic", "partition", "txn", "transactional id", "first offset", "age", "reason"],
        [
            [
                h.topic_partition.topic,
                h.topic_partition.partition,
                str(h.txn),
                h.transactional_id,
                h.first_offset,
                format_duration(h.age_ms),
                h.reason,
            ]
            for h in found
        ],
        empty="no hanging transactions",
        full=("reason",),
    )
    if found:
        tids = sorted({h.transactional_id for h in found if h.transactional_id})
        if tids:
            print(
                f"\nto release them: txnlog transactions abort {args.url} {tids[0]}"
                + (f" (and {', '.join(tids[1:])})" if len(tids) > 1 else "")
            )
        for h in found:
            if not h.transactional_id or "no marker" in h.reason:
                p = h.topic_partition
                print(
                    f"for the partition without a marker: txnlog transactions abort {args.url} "
                    f"--topic {p.topic} --partition {p.partition} --txn {h.txn}"
                )
    return 0


def expire(args: argparse.Namespace) -> int:
    log = open_existing(args)
    with Progress("expiring transactions"):
        n = log.expire_transactions()
    if args.json:
        print_json({"expired": n})
    else:
        print(f"ended {n} transaction(s) past their timeout" if n else "no transaction is past its timeout")
    return 0
