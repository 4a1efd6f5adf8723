"""``txnlog dump URL TOPIC``: print a topic's records with their offsets (PROTOCOL.md "Reading").

Records are read with a :class:`~txn_core.clients.consumer.Consumer` under the chosen isolation level, one
partition at a time, from ``--from`` (default: the log start) up to ``--to`` (exclusive; default: the last
stable offset under read_committed, the log end under read_uncommitted), at most ``--limit`` records in all.
With ``--show-control`` the entry headers of the range are scanned too: every row gets the transaction it
belongs to, and the COMMIT/ABORT markers are listed in offset order with the records.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from txn_core.cli.common import Parser, SubParsers, add_verb, get_topic, non_negative_int, open_existing, warn
from txn_core.cli.output import Progress, json_line, print_table
from txn_core.errors import ConfigurationError, CorruptDataError, DamagedEntryError
from txn_core.format import paths
from txn_core.format.entry import EntryHeader, EntryKind, decode_json
from txn_core.log import Log
from txn_core.partition.readahead import HeaderReadAhead
from txn_core.partition.reader import ISOLATION_LEVELS, READ_COMMITTED

DEFAULT_LIMIT = 100
POLL_RECORDS = 10_000
_META = ("_partition", "_offset", "_timestamp", "_kind", "_txn")


def register(sub: SubParsers, common: Parser) -> None:
    p = add_verb(
        sub,
        "dump",
        parents=[common],
        help="print a topic's records with their offsets",
        description="Print records of a topic with partition, offset and append time, as a table or "
        "(--json) as JSON lines. read_committed (the default) shows only committed and "
        "non-transactional records, up to the last stable offset; read_uncommitted shows "
        "every record, aborted and open ones too. --show-control adds each record's "
        "transaction and lists the COMMIT/ABORT markers.",
        examples="  txnlog dump /data/log orders\n"
        "  txnlog dump /data/log orders --partition 0 --from 100 --to 200 --limit 0\n"
        "  txnlog dump /data/log orders --isolation read_uncommitted --show-control\n"
        "  txnlog dump /data/log orders --json --limit 0 > orders.jsonl",
    )
    p.add_argument("topic", metavar="TOPIC", help="the topic to read")
    p.add_argument(
        "--partition",
        type=int,
        action="append",
        metavar="P",
        help="only this partition (repeatable; default: all, one after the other)",
    )
    p.add_argument(
        "--isolation",
        choices=ISOLATION_LEVELS,
        default=READ_COMMITTED,
        help="read_committed (default) or read_uncommitted",
    )
    p.add_argument(
        "--from",
        dest="start",
        type=non_negative_int,
        metavar="OFFSET",
        help="first offset, in every selected partition (default: the log start)",
    )
    p.add_argument(
        "--to",
        dest="stop",
        type=non_negative_int,
        metavar="OFFSET",
        help="stop before this offset (exclusive; default: as far as the isolation level allows)",
    )
    p.add_argument(
        "--limit",
        type=non_negative_int,
        default=DEFAULT_LIMIT,
        metavar="N",
        help=f"print at most this many records in all (default {DEFAULT_LIMIT}; 0 = no limit)",
    )
    p.add_argument(
        "--show-control", action="store_true", help="show each record's transaction and the COMMIT/ABORT marker entries"
    )
    p.set_defaults(func=dump)


@dataclass
class _Partition:
    """What was read from one partition."""

    partition: int
    rows: list[dict[str, Any]] = field(default_factory=list)  # kept only when they are annotated afterwards
    count: int = 0  # records read
    reached: int = 0  # records before this offset were considered
    more: bool = False  # the limit stopped the read while records were left
    error: CorruptDataError | None = None  # damage the read stopped at (the records before it were read)


def dump(args: argparse.Namespace) -> int:
    if args.start is not None and args.stop is not None and args.stop < args.start:
        raise ConfigurationError(f"--to {args.stop} is before --from {args.start}: --to is the exclusive end")
    log = open_existing(args)
    meta = get_topic(log, args.topic)
    wanted = list(dict.fromkeys(args.partition)) if args.partition else list(range(meta.partitions))  # each once
    bad = [p for p in wanted if not 0 <= p < meta.partitions]
    if bad:
        raise ConfigurationError(
            f"topic {meta.name!r} has no partition {bad[0]}: its partitions are 0..{meta.partitions - 1}"
        )
    limit = args.limit or None
    columns = meta.schema.names
    headers = ["partition", "offset", "timestamp"] + (["kind", "txn"] if args.show_control else []) + columns
    total = 0
    table_rows: list[list[Any]] = []
    truncated = False
    failure: CorruptDataError | None = None

    def emit(rows: list[dict[str, Any]]) -> None:
        for r in rows:
            if args.json:
                sys.stdout.write(json_line(r) + "\n")
            else:
                table_rows.append(_table_row(r, columns, args.show_control))

    with Progress(f"dumping {meta.name}", unit="offsets") as bar:
        spans = {p: _span(log, meta.name, p, args.start, args.stop) for p in wanted}
        bar.total = sum(max(0, end - start) for start, end in spans.values()) or None
        done = 0
        for p in wanted:
            first = spans[p][0]
            remaining = None if limit is None else limit - total
            if remaining is not None and remaining <= 0:
                truncated = truncated or spans[p][1] > first
                continue
            base = done - first  # progress: offsets covered in earlier partitions, then in this one

            def progress(position: int, base: int = base) -> None:
                bar.update(base + position)

            got = _read_partition(
                log,
                meta.name,
                p,
                args.isolation,
                args.start,
                args.stop,
                remaining,
                sink=None if args.show_control else emit,
                progress=progress,
            )
            if args.show_control:
                _annotate(log, meta.name, got, first)
                emit(got.rows)
            total += got.count
            done += max(0, got.reached - first)
            bar.update(done)
            truncated = truncated or got.more
            if got.error is not None:  # what was read before it is shown, then the error (exit status 1)
                failure = got.error
                break
    if not args.json:
        print_table(headers, table_rows, empty=f"no records in {meta.name} for these offsets and isolation level")
    if truncated:
        warn(f"showing the first {limit} records; pass --limit N for more (--limit 0 for all)")
    if failure is not None:
        raise failure
    return 0


def _span(log: Log, topic: str, partition: int, start: int | None, stop: int | None) -> tuple[int, int]:
    """The offset range ``[first, end)`` a dump of the partition covers at most."""
    plog = log.partition_log(paths.partition_log_path(topic, partition))
    first = plog.log_start(refresh=True).offset if start is None else start
    end = plog.readable_end() if stop is None else stop
    return first, end


def _read_partition(
    log: Log,
    topic: str,
    partition: int,
    isolation: str,
    start: int | None,
    stop: int | None,
    limit: int | None,
    *,
    sink: Callable[[list[dict[str, Any]]], None] | None,
    progress: Callable[[int], None],
) -> _Partition:
    """Read records ``[start, stop)`` (at most ``limit``); hand them to ``sink`` as they come, or keep them.
    Damage the read meets is kept as ``error`` with what was read before it; damage at or past ``stop`` is no
    concern of this read."""
    out = _Partition(partition)
    consumer = log.consumer(isolation_level=isolation)

    def take(rows: list[dict[str, Any]]) -> None:
        out.count += len(rows)
        if sink is None:
            out.rows.extend(rows)
        else:
            sink(rows)

    try:
        tp = (topic, partition)
        consumer.assign([tp])
        if start is not None:
            consumer.seek(tp, start)
        while (limit is None or out.count < limit) and (stop is None or consumer.position(tp) < stop):
            want = POLL_RECORDS if limit is None else min(POLL_RECORDS, limit - out.count)
            try:
                table = consumer.poll(max_records=want)
            except CorruptDataError as exc:
                at = _damage_start(exc)
                if stop is not None and at is not None and at >= stop:
                    break  # every wanted record lies before it
                out.error = exc
                break
            if table.num_rows == 0:
                break
            rows = [
                {"_partition": r.pop("_partition"), "_offset": r.pop("_offset"), "_timestamp": r.pop("_timestamp"), **r}
                for r in _nanosecond_times_as_text(table.drop_columns(["_topic"])).to_pylist()
            ]
            if stop is not None and rows[-1]["_offset"] >= stop:
                take([r for r in rows if r["_offset"] < stop])
                out.reached = stop
                return out
            take(rows)
            progress(consumer.position(tp))
        out.reached = consumer.position(tp) if stop is None else min(stop, consumer.position(tp))
        if limit is not None and out.count >= limit:
            try:
                nxt = consumer.poll(max_records=1)
            except CorruptDataError as exc:  # damage before --to: a larger limit meets (and reports) it
                at = _damage_start(exc)
                out.more = stop is None or at is None or at < stop
                return out
            out.more = nxt.num_rows > 0 and (stop is None or nxt.column("_offset")[0].as_py() < stop)
        return out
    finally:
        consumer.close()


def _damage_start(exc: CorruptDataError) -> int | None:
    """The first offset of the damaged entry ``exc`` names, when known (from the reader, or its intact header)."""
    if not isinstance(exc, DamagedEntryError):
        return None
    if exc.first_offset is not None:
        return exc.first_offset
    return exc.header.base_offset if exc.header is not None else None


def _annotate(log: Log, topic: str, got: _Partition, first: int) -> None:
    """Add ``_kind``/``_txn`` to the rows and the marker entries of ``[first, got.reached)``, in offset order."""
    plog = log.partition_log(paths.partition_log_path(topic, got.partition))
    bases: list[int] = []  # base offsets of the data entries scanned, with their transactions
    txns: list[str | None] = []
    markers: list[dict[str, Any]] = []
    if got.reached > first:
        tail_slot, _end = plog.readable_tail(refresh=True)
        slot = plog.slot_for_offset(first)
        headers = HeaderReadAhead(plog, slot)
        while slot < tail_slot:
            try:
                header = headers.next(slot)
            except DamagedEntryError:
                break  # the rows read stop before it (the consumer said so)
            if header.base_offset >= got.reached:
                break
            txn = str(header.txn) if header.txn is not None else None
            if header.is_control:
                if header.base_offset >= first:
                    entry = plog.read_entry(slot)
                    payload = decode_json(entry.payload(), entry.key)
                    markers.append(_marker_row(got.partition, header, header.kind, txn, payload.get("tid")))
            else:
                if header.carried is not None and header.base_offset >= first:
                    # a carried marker names its transaction only
                    carried = header.carried
                    markers.append(_marker_row(got.partition, header, carried.kind, str(carried.txn), None))
                bases.append(header.base_offset)
                txns.append(txn)
            slot += 1
    for r in got.rows:
        i = bisect_right(bases, r["_offset"]) - 1
        r["_kind"] = "data"
        r["_txn"] = txns[i] if i >= 0 else None
    # Keys in a stable order: metadata first, then the topic's columns.
    rows = [
        {
            "_partition": r["_partition"],
            "_offset": r["_offset"],
            "_timestamp": r["_timestamp"],
            "_kind": r["_kind"],
            "_txn": r["_txn"],
            **{k: v for k, v in r.items() if k not in _META},
        }
        for r in got.rows
    ]
    got.rows = sorted(markers + rows, key=lambda r: int(r["_offset"]))  # a carried marker before its entry's rows


def _marker_row(
    partition: int, header: EntryHeader, kind: EntryKind, txn: str | None, tid: str | None
) -> dict[str, Any]:
    """The dump's row of a marker (alone in ``header``'s entry, or carried by it): at the entry's base offset."""
    return {
        "_partition": partition,
        "_offset": header.base_offset,
        "_timestamp": _ts(header.timestamp_ms),
        "_kind": kind.name,
        "_txn": txn,
        "_transactional_id": tid,
    }


def _ts(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC)


def _table_row(r: dict[str, Any], columns: list[str], show_control: bool) -> list[Any]:
    row = [r["_partition"], r["_offset"], r["_timestamp"]]
    if show_control:
        txn = r.get("_txn")
        if r.get("_kind") != "data" and r.get("_transactional_id"):
            txn = f"{txn} ({r['_transactional_id']})"
        row += [r.get("_kind"), txn]
    return row + [r.get(c) for c in columns]


def _nanosecond_times_as_text(table: pa.Table) -> pa.Table:
    """``table`` with its ``time64[ns]`` columns as ISO-8601 text (pyarrow hands Python a ``datetime.time``,
    which keeps microseconds: a dump would drop the rest)."""
    for i, column in enumerate(table.schema):
        if pa.types.is_time64(column.type) and column.type.unit == "ns":
            table = table.set_column(i, column.with_type(pa.string()), table.column(i).cast(pa.string()))
    return table
