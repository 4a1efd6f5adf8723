"""``txnlog subscriptions list|describe|skip-lost``: Pulsar-style subscriptions (PROTOCOL.md "Subscriptions")."""

from __future__ import annotations

import argparse
import dataclasses

from txn_core.cli.common import Parser, SubParsers, add_noun, add_verb, get_topic, non_negative_int, open_existing
from txn_core.cli.output import Progress, print_json, print_table
from txn_core.clients.subscriptions.errors import SubscriptionNotFoundError
from txn_core.clients.subscriptions.store import SubscriptionRef, SubscriptionType, list_subscriptions, read_meta
from txn_core.clients.subscriptions.subscription import Subscription
from txn_core.errors import ConfigurationError
from txn_core.log import Log


def register(sub: SubParsers, common: Parser) -> None:
    verbs = add_noun(
        sub,
        "subscriptions",
        help="subscriptions: cursors, pending acknowledgements, backlog",
        description="List subscriptions, show their state, and give up records retention removed.",
        examples="  txnlog subscriptions list /data/log\n"
        "  txnlog subscriptions describe /data/log orders 0 billing\n"
        "  txnlog subscriptions skip-lost /data/log orders 0 billing",
    )

    p = add_verb(
        verbs,
        "list",
        parents=[common],
        help="list subscriptions",
        description="List every subscription of every topic partition (or of one topic).",
        examples="  txnlog subscriptions list /data/log\n  txnlog subscriptions list /data/log --topic orders",
    )
    p.add_argument("--topic", metavar="TOPIC", help="only this topic's subscriptions")
    p.set_defaults(func=list_all)

    for verb, help_text, description, func in (
        (
            "describe",
            "type, active consumer, mark-delete position, pending acknowledgements, backlog",
            "The subscription's type (shared, exclusive, failover or key_shared) and, for an exclusive or failover "
            "one, the consumer delivering now (and a failover or key_shared one's consumers; a key_shared one's key "
            "column and the hash ranges each consumer holds now); its state replayed from its ack log: the "
            "mark-delete position (every offset below it is acknowledged), records acknowledged above it, open "
            "transactions holding acknowledgements, and the backlog (offsets between the mark-delete position and "
            "the last stable offset); the records moved to its dead-letter topic.",
            describe,
        ),
        (
            "skip-lost",
            "give up records retention removed before they were acknowledged",
            "Once retention removed records a subscription had not acknowledged, its consumers fail with "
            "DataLossError. This moves the subscription on to the partition's log start, for every consumer "
            "(one 'lost' record in its ack log; Pulsar's cursor reset). Needs write access. Does nothing when "
            "no record was lost.",
            skip_lost,
        ),
    ):
        p = add_verb(
            verbs,
            verb,
            parents=[common],
            help=help_text,
            description=description,
            examples=f"  txnlog subscriptions {verb} /data/log orders 0 billing",
        )
        p.add_argument("topic", metavar="TOPIC")
        p.add_argument("partition", metavar="PARTITION", type=non_negative_int)
        p.add_argument("name", metavar="SUBSCRIPTION")
        if verb == "describe":
            p.add_argument(
                "--dead-letter-topic",
                metavar="TOPIC",
                help="where its consumers' dead letters go (default: TOPIC-SUBSCRIPTION-DLQ, Pulsar's name)",
            )
        p.set_defaults(func=func)


def list_all(args: argparse.Namespace) -> int:
    log = open_existing(args)
    topics = [args.topic] if args.topic else log.list_topics()
    rows: list[list[object]] = []
    for topic in topics:
        for partition in range(get_topic(log, topic).partitions):
            for name in list_subscriptions(log.storage, topic, partition):
                kind = read_meta(log.storage, SubscriptionRef(topic, partition, name)).type.value
                rows.append([topic, partition, name, kind])
    if args.json:
        print_json([{"topic": t, "partition": p, "subscription": n, "type": k} for t, p, n, k in rows])
        return 0
    print_table(["topic", "partition", "subscription", "type"], rows, empty=f"no subscriptions in {log.url}")
    return 0


def _subscription(log: Log, args: argparse.Namespace) -> Subscription:
    """The named subscription of an existing topic partition."""
    meta = get_topic(log, args.topic)
    if args.partition >= meta.partitions:
        raise ConfigurationError(
            f"topic {meta.name!r} has no partition {args.partition}: its partitions are 0..{meta.partitions - 1}"
        )
    try:
        return log.subscription(args.topic, args.partition, args.name)
    except SubscriptionNotFoundError as exc:
        names = list_subscriptions(log.storage, args.topic, args.partition)
        raise SubscriptionNotFoundError(
            f"subscription {args.name!r} of {args.topic}-{args.partition} does not exist; its subscriptions: "
            f"{', '.join(names) if names else '(none: a consumer creates one when it subscribes)'}"
        ) from exc


def describe(args: argparse.Namespace) -> int:
    log = open_existing(args)
    with Progress(f"replaying subscription {args.name}"):
        d = _subscription(log, args).describe(dead_letter_topic=args.dead_letter_topic)
    if args.json:
        value = dataclasses.asdict(d)
        value["pending"] = {str(t): list(o) for t, o in d.pending.items()}
        value["pending_cumulative"] = {str(t): c for t, c in d.pending_cumulative.items()}
        value["type"] = d.type.value
        print_json(value)
        return 0
    shared = (SubscriptionType.SHARED, SubscriptionType.KEY_SHARED)
    active = "" if d.type in shared else (d.active_consumer or "(none)")
    header = ["topic", "partition", "subscription", "type", "active consumer", "mark-delete", "acked above"]
    row = [d.topic, d.partition, d.name, d.type.value, active, d.mark_delete, d.acked_above_mark_delete]
    print_table([*header, "pending txns", "backlog"], [[*row, len(d.pending), d.backlog]])
    if d.type in (SubscriptionType.FAILOVER, SubscriptionType.KEY_SHARED):
        print(f"  consumers: {', '.join(d.consumers) or '(none)'}")
    if d.type is SubscriptionType.KEY_SHARED:
        print(f"  keys: column {d.key_column!r}, {d.key_mode}")
        for consumer, ranges in d.key_holders.items():
            print(f"  key ranges of {consumer}: {', '.join(f'{a}-{b}' for a, b in ranges)}")
    if d.dead_lettered is not None:
        print(f"  dead letters: {d.dead_lettered} in {d.dead_letter_topic}")
    for txn, offsets in sorted(d.pending.items(), key=lambda item: str(item[0])):
        print(f"  transaction {txn} holds {len(offsets)} record(s)")
    return 0


def skip_lost(args: argparse.Namespace) -> int:
    log = open_existing(args)
    subscription = _subscription(log, args)
    moved = subscription.skip_lost()
    mark_delete = subscription.state().mark_delete
    if args.json:
        print_json({"moved": moved, "mark_delete": mark_delete})
    elif moved:
        print(
            f"moved the subscription from {mark_delete - moved} to {mark_delete}, past offsets retention removed "
            "before they were acknowledged"
        )
    else:
        print(f"nothing was lost: the subscription is at {mark_delete}, at or above the partition's log start")
    return 0
