"""``txnlog produce URL TOPIC FILE``: append a file's rows to a topic in one transaction, exactly once per
``--app-id``/``--version`` (PROTOCOL.md "Application transactions").

The file (Parquet, Arrow IPC file or stream, CSV, or JSON lines; by its extension, or ``--format``) is read
with pyarrow, conformed to the topic's schema, staged, and committed as unit ``--version`` of application
``--app-id`` (committed under the transactional id ``APP.TOPIC``: versions are counted per topic, as Delta
counts them per table). Running the same command again, after a crash or by a retrying
scheduler, commits nothing and says so: a nightly load run twice loads once. Without ``--app-id`` the rows
are committed once per invocation (a one-shot write).
"""

from __future__ import annotations

import argparse
import uuid
from pathlib import Path
from typing import IO, Any

import pyarrow as pa

from txn_core.cli import jsonlines
from txn_core.cli.common import Parser, SubParsers, add_verb, get_topic, non_negative_int, storage_options
from txn_core.cli.output import print_json
from txn_core.clients.apptxn import AppCommitter
from txn_core.clients.appunit import APP_MARK, AppVersion
from txn_core.clients.topics import METADATA_COLUMNS
from txn_core.errors import ConfigurationError, ProducerFencedError
from txn_core.log import Log
from txn_core.storage import open_storage

FORMATS = ("parquet", "arrow", "csv", "jsonl")
_BY_SUFFIX = {
    ".parquet": "parquet",
    ".pq": "parquet",
    ".arrow": "arrow",
    ".ipc": "arrow",
    ".feather": "arrow",
    ".csv": "csv",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
}


def register(sub: SubParsers, common: Parser) -> None:
    p = add_verb(
        sub,
        "produce",
        parents=[common],
        help="append a file's rows to a topic, exactly once per --app-id/--version",
        description="Read a Parquet, Arrow, CSV or JSON-lines file, check it against the topic's schema and "
        "append its rows in one transaction. With --app-id and --version the write is unit VERSION of "
        "application APP_ID: running the same command again commits nothing (it reports 'replayed'), so "
        "a scheduler may retry it safely. Versions of one --run must grow.",
        examples="  txnlog produce /data/log orders day.parquet --app-id nightly-orders --version 20261123\n"
        "  txnlog produce /data/log orders extra.jsonl --key-column id\n"
        "  txnlog produce s3://bucket/log orders day.csv --app-id load --version 7 -o anon=false",
    )
    p.add_argument("topic", metavar="TOPIC", help="the topic to append to")
    p.add_argument("file", metavar="FILE", help="the rows: .parquet, .arrow/.ipc/.feather, .csv or .jsonl")
    p.add_argument("--format", choices=FORMATS, help="the file's format (default: from its extension)")
    p.add_argument(
        "--app-id",
        metavar="ID",
        help="the application: makes the write idempotent (versions are counted per topic; transactional id ID.TOPIC)",
    )
    p.add_argument("--version", type=non_negative_int, metavar="N", help="the unit of the application (with --app-id)")
    p.add_argument(
        "--run",
        default="default",
        metavar="NAME",
        help="the application's run; versions of one run must grow (default: 'default')",
    )
    route = p.add_mutually_exclusive_group()
    route.add_argument("--partition", type=non_negative_int, metavar="P", help="write every row to partition P")
    route.add_argument("--key-column", metavar="COLUMN", help="route rows by the hash of this column")
    p.set_defaults(func=produce)


def read_rows(path: str, fmt: str | None, schema: pa.Schema | None = None) -> pa.Table:
    """The file's rows as one table (a clear error for a missing file, an unknown format or a value that is
    not of its column's type).

    CSV holds text and JSON strings hold text: with ``schema`` (the topic's), its columns are parsed as the
    topic types them instead of by inference, which would make ``001`` a number and ``2026-01-02 03:04``
    a timestamp in a column the topic keeps as text (and then refuse the file)."""
    file = Path(path)
    if not file.is_file():
        raise ConfigurationError(f"{path}: no such file")
    fmt = fmt or _BY_SUFFIX.get(file.suffix.lower())
    if fmt is None:
        raise ConfigurationError(
            f"{path}: cannot tell the format from the extension; pass --format {'|'.join(FORMATS)}"
        )
    typed = {f.name: f.type for f in schema or () if _text_parses_to(f.type)}
    try:
        if fmt == "parquet":
            import pyarrow.parquet as pq

            return pq.read_table(file)
        if fmt == "arrow":
            try:
                return pa.ipc.open_file(file).read_all()
            except pa.ArrowInvalid:
                return pa.ipc.open_stream(file).read_all()
        if fmt == "csv":
            import pyarrow.csv as pcsv

            return pcsv.read_csv(file, convert_options=pcsv.ConvertOptions(column_types=typed))
        import pyarrow.json as pjson

        # pyarrow's JSON reader, unlike its CSV reader, takes a time without an offset as UTC in a column with a
        # time zone, and one with an offset as that instant: what dump writes for such a column.
        zoned = {f.name: f.type for f in schema or () if pa.types.is_timestamp(f.type) and f.type.tz is not None}
        typed_json = {**typed, **zoned}

        def flat(source: Path | IO[bytes], first: list[str]) -> pa.Table:
            present = [name for name in typed_json if name in first]
            explicit = pa.schema([(name, typed_json[name]) for name in present]) if present else None
            return pjson.read_json(
                source, parse_options=pjson.ParseOptions(explicit_schema=explicit, unexpected_field_behavior="infer")
            )

        try:
            if schema is not None and any(jsonlines.needs_conversion(f.type) for f in schema):
                return jsonlines.read(file, schema, flat)
            return flat(file, _first_line_fields(file))
        except pa.ArrowInvalid:
            if schema is None:
                raise
            return jsonlines.read(file, schema, flat, every=True)  # each value by its type, or named
    except (pa.ArrowInvalid, OSError) as exc:
        how = (
            f" (columns are read as the topic types them: {', '.join(f'{n} {t}' for n, t in typed.items())})"
            if typed and fmt in ("csv", "jsonl")
            else ""
        )
        raise ConfigurationError(f"{path}: not a readable {fmt} file: {exc}{how}") from exc


def _text_parses_to(t: pa.DataType) -> bool:
    """Whether the file's text is parsed straight into ``t``: flat types. Nested ones are inferred and checked
    against the topic afterwards; so are timestamps with a time zone, whose values without an offset the
    schema check takes as UTC (pyarrow's CSV reader would refuse them)."""
    if pa.types.is_timestamp(t) and t.tz is not None:
        return False
    return not (pa.types.is_nested(t) or pa.types.is_dictionary(t) or pa.types.is_null(t))


def _first_line_fields(file: Path) -> list[str]:
    """The fields of the JSON-lines file's first line: the topic's columns among them are read with their
    types (an explicit schema would otherwise add a column of nulls for each one the file lacks, hiding a
    missing column from the schema check)."""
    import json

    with file.open("rb") as f:
        first = f.readline()
    try:
        row = json.loads(first) if first.strip() else {}
    except ValueError:
        return []  # pyarrow's reader reports the malformed line
    return list(row) if isinstance(row, dict) else []


#: The metadata columns every dump writes: a file holding them all is taken as a dump (or a source's output).
DUMP_COLUMNS = frozenset(("_partition", "_offset", "_timestamp"))


def _without_dump_columns(table: pa.Table, file: Any) -> pa.Table:
    """``table`` without the metadata columns readers add (dump writes them; no topic can hold their names),
    so that a dump loads again. Invariant: a user's own column is never dropped: a file with only some of
    them (a column of its own named ``_timestamp``, say) is refused, naming the column and the fix."""
    present = [name for name in METADATA_COLUMNS if name in table.column_names]
    if not present:
        return table
    if DUMP_COLUMNS.issubset(present):
        return table.drop_columns(present)
    raise ConfigurationError(
        f"{file}: column(s) {present} have names txnlog reserves for the metadata readers add, and no topic can "
        f"hold them; they are dropped only from a file that has all of {sorted(DUMP_COLUMNS)} (what dump "
        "writes), and this file does not. Nothing was written. Rename the column(s) to keep their values "
        "(and add them to the topic), or remove them from the file"
    )


def produce(args: argparse.Namespace) -> int:
    if (args.app_id is None) != (args.version is None):
        raise ConfigurationError("--app-id and --version go together: both make the write idempotent, or neither")
    storage = open_storage(args.url, storage_options(args.storage_options))  # the self-test before the first write
    log = Log(storage, create=False)
    meta = get_topic(log, args.topic)
    topic = meta.name
    table = read_rows(args.file, args.format, meta.schema)
    table = _without_dump_columns(table, args.file)
    if args.app_id is not None:
        unit = AppVersion(args.app_id, APP_MARK, args.run, args.version)
    else:
        unit = AppVersion(f"txnlog-produce-{uuid.uuid4().hex[:16]}", APP_MARK, write_id=uuid.uuid4().hex)
    try:
        with AppCommitter(log) as committer:
            result = committer.write_once(unit, topic, table, partition=args.partition, key_column=args.key_column)
    except ProducerFencedError as exc:
        if args.app_id is None:
            raise
        raise exc.reworded(
            f"another run of application {args.app_id!r} (run {args.run!r}) started while this one was writing "
            f"version {args.version} and took over, and this one stopped. Run the same command again once the "
            "other has finished: it commits the version if no run did, and otherwise says it was already "
            f"committed ({exc})"
        ) from exc
    out: dict[str, Any] = {
        "outcome": result.outcome,
        "topic": topic,
        "rows": result.rows,
        "app_id": args.app_id,
        "version": args.version,
    }
    if args.json:
        print_json(out)
    elif result.outcome == "replayed":
        print(
            f"version {args.version} of {args.app_id} is already committed, or older than the last version "
            "committed for it (every version up to that one counts as written): nothing written"
        )
    else:
        print(
            f"committed {result.rows} rows to {topic}"
            + (f" as version {args.version} of {args.app_id}" if args.app_id else "")
        )
    return 0
