"""Shared pieces of the ``txnlog`` command line: the parser class, common options, opening the log.

Every verb takes the log URL first and ``-o/--storage-option KEY=VALUE`` (repeatable; fsspec storage
options such as ``-o key=... -o client_kwargs.endpoint_url=http://127.0.0.1:9000``), ``--json`` and
``--debug``. Argument errors exit with status 2, errors from the log with status 1, each as one line
``txnlog: error: ...`` on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any, NoReturn, TypeAlias

import pyarrow as pa

from txn_core.cli.schemaspec import SchemaSpecError, parse_schema
from txn_core.clients.topics import TopicMeta
from txn_core.errors import ConfigurationError, CorruptDataError, TopicNotFoundError
from txn_core.format import paths
from txn_core.format.paths import has_log
from txn_core.log import Log
from txn_core.storage import open_storage
from txn_core.storage.options import nest_storage_options

PROG = "txnlog"


class Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line naming the command and where to get help."""

    def error(self, message: str) -> NoReturn:
        where = self.prog.removeprefix(PROG).strip()
        prefix = f"{where}: " if where else ""
        self.exit(2, f"{PROG}: error: {prefix}{message}; see '{self.prog} --help'\n")


class HelpFormatter(argparse.HelpFormatter):
    """Wraps descriptions paragraph by paragraph, keeps indented lines (examples) as written."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=34, width=min(110, _terminal_width()))

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        import textwrap

        out = []
        for paragraph in text.split("\n\n"):
            lines = paragraph.splitlines()
            if any(line.startswith("  ") for line in lines) or paragraph.startswith("examples:"):
                out.append("\n".join(indent + line for line in lines))
            else:
                out.append(textwrap.fill(" ".join(lines), width, initial_indent=indent, subsequent_indent=indent))
        return "\n\n".join(out)


def _terminal_width() -> int:
    import shutil

    return shutil.get_terminal_size((100, 24)).columns


# --- argument types ----------------------------------------------------------------------------


def storage_option(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` → ``(key, value)``; the value is parsed as JSON when it is a number, true/false/null,
    an object or a list, else kept as a string. Dotted keys nest: ``client_kwargs.region_name=eu-west-1``."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise argparse.ArgumentTypeError(
            f"bad storage option {text!r}: write KEY=VALUE, e.g. -o anon=true or "
            "-o client_kwargs.endpoint_url=http://127.0.0.1:9000"
        )
    value: Any = raw
    stripped = raw.strip()
    if stripped in ("true", "false", "null") or stripped[:1] in ("{", "[") or _is_number(stripped):
        try:
            value = json.loads(stripped)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"storage option {key!r}: {raw!r} is not valid JSON ({exc})") from exc
    return key, value


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return text.lower() not in ("nan", "inf", "-inf", "infinity", "-infinity")


def storage_options(pairs: list[tuple[str, Any]] | None) -> dict[str, Any] | None:
    """Nest dotted keys into a dict for fsspec (None when no option was given)."""
    return nest_storage_options(pairs) if pairs else None


def schema_spec(text: str) -> pa.Schema:
    try:
        return parse_schema(text)
    except SchemaSpecError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def non_negative_int(text: str) -> int:
    try:
        value = int(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {value}")
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {value}")
    return value


def optional_positive_int(text: str) -> int | None:
    """A positive number, or ``none`` (unset)."""
    if text.strip().lower() in ("none", "null", "unlimited", "forever"):
        return None
    return positive_int(text)


# --- parser pieces -----------------------------------------------------------------------------


def common_options() -> Parser:
    """The options every verb takes (as an argparse parent): URL, storage options, --json, --debug."""
    p = Parser(add_help=False)
    p.add_argument(
        "url", metavar="URL", help="the log: a directory, file://DIR, s3://BUCKET/PREFIX, gs://..., abfs://..."
    )
    p.add_argument(
        "-o",
        "--storage-option",
        metavar="KEY=VALUE",
        dest="storage_options",
        action="append",
        type=storage_option,
        default=[],
        help="an fsspec storage option (repeatable; dotted keys nest, values are JSON or text)",
    )
    p.add_argument("--json", action="store_true", help="print JSON for scripts instead of tables")
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show the full traceback on errors")
    return p


SubParsers: TypeAlias = "argparse._SubParsersAction[Parser]"  # what add_subparsers() returns


def add_noun(sub: SubParsers, name: str, *, help: str, description: str, examples: str) -> SubParsers:
    """A noun's parser (``txnlog NOUN --help`` lists its verbs and examples); returns its verbs' subparsers."""
    parser = sub.add_parser(
        name, help=help, description=description, epilog=f"examples:\n{examples}", formatter_class=HelpFormatter
    )
    return parser.add_subparsers(dest="verb", required=True, metavar="VERB")


def add_verb(
    sub: SubParsers, name: str, *, parents: list[Parser], help: str, description: str, examples: str
) -> argparse.ArgumentParser:
    """A verb's parser with a description and an examples epilog."""
    parser = sub.add_parser(
        name,
        parents=parents,
        help=help,
        description=description,
        epilog=f"examples:\n{examples}",
        formatter_class=HelpFormatter,
    )
    parser.set_defaults(verb_parser=parser)  # so unknown arguments are reported by the verb (see main)
    return parser


# --- opening the log ---------------------------------------------------------------------------


def open_existing(args: argparse.Namespace) -> Log:
    """The log at ``args.url``, which must exist: a typo in a URL never creates an empty log."""
    options = storage_options(args.storage_options)
    storage = open_storage(args.url, options, self_test=False)
    if not has_log(storage):
        raise ConfigurationError(
            f"no txnlog at {storage.url} (it has no {paths.FORMAT_KEY}): check the URL and storage options, or "
            f"create a log with '{PROG} topics create {args.url} TOPIC --partitions N --schema SPEC'"
        )
    return Log(storage, create=False)  # reading writes nothing: read-only access is enough


def open_or_create(args: argparse.Namespace) -> Log:
    """The log at ``args.url``, created if absent (``topics create``)."""
    options = storage_options(args.storage_options)
    storage = open_storage(args.url, options)  # the self-test runs before the first write
    return Log(storage)


def get_topic(log: Log, name: str) -> TopicMeta:
    """The topic's metadata; an unknown topic's error lists the existing ones and says how to create it."""
    try:
        return log.topics.get(name)
    except TopicNotFoundError as exc:
        existing = log.list_topics()
        raise TopicNotFoundError(
            f"unknown topic {name!r}; existing topics: {', '.join(existing) if existing else '(none)'}. Create "
            f"it with '{PROG} topics create URL {name} --partitions N --schema SPEC'"
        ) from exc


def readable_topics(
    log: Log, names: list[str], each: Callable[[], object] = lambda: None
) -> tuple[list[TopicMeta], list[CorruptDataError]]:
    """The metadata of each topic in ``names`` that can be read, and the errors of those whose metadata is
    damaged: a log-wide command goes on with the other topics and reports them (:func:`report_damage`).
    ``each`` runs after each topic (a progress bar's advance)."""
    metas: list[TopicMeta] = []
    damaged: list[CorruptDataError] = []
    for name in names:
        try:
            metas.append(log.topics.get(name))
        except CorruptDataError as exc:
            damaged.append(exc)
        each()
    return metas, damaged


def report_damage(what: str, errors: list[CorruptDataError]) -> int:
    """Damage a command went past, on stderr (exit status 1 when there is any)."""
    for exc in errors:
        print(f"{PROG}: error: damaged {what}: {exc}", file=sys.stderr)
    return 1 if errors else 0


def warn(message: str) -> None:
    """A note for people on stderr (never mixed into JSON on stdout)."""
    print(f"{PROG}: {message}", file=sys.stderr)
