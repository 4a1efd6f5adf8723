"""Source options, parsed once into a frozen :class:`SourceOptions`.

=========================  ===================================================================================
``path`` (or ``load(p)``)  log URL: ``file://``, ``s3://...``, any fsspec URL (required)
``topic``                  one topic, or a comma-separated list (required)
``startingOffsets``        ``earliest`` (batch default), ``latest`` (streaming default: the last stable
                           offset), ``group``, or JSON ``{"t": {"0": 12, "1": -2}}`` (-2 earliest,
                           -1 latest; every partition of every topic must be given)
``startingTimestamp``      first offsets whose entry timestamp is >= this (ms since the epoch)
``endingOffsets``          batch only: ``latest`` (default) or JSON (-1 latest); cut back to the last stable
                           offset
``maxOffsetsPerTrigger``   streaming only: at most this many offsets per micro-batch, split fairly
``isolationLevel``         ``read_committed`` (default) or ``read_uncommitted``
``consumerGroup``          the group whose committed offsets ``startingOffsets=group`` resumes from
                           (partitions without one start at the earliest offset)
``includeMetadata``        ``true`` (default): add ``_topic``, ``_partition``, ``_offset``, ``_timestamp``
                           (Spark converts them row by row like any column: a read ran at ~0.76x of its
                           speed without them, README "Benchmarks"); ``false`` for copies not needing them
``failOnDataLoss``         ``true`` (default): offsets removed by retention, and damaged entries nobody marked
                           lost, fail the query; ``false``: skip them with a warning
``minPartitions``          at least this many Spark tasks per batch (ranges are split by offsets)
``timestampPrecision``     ``exact`` (default): a timestamp or duration stored with a part below microseconds
                           (pandas writes nanoseconds) fails the task, naming topic, partition, offset and
                           column; ``truncate``: that part is dropped (toward zero)
``storage.<key>``          passed to fsspec as ``storage_options`` (JSON values decoded; a dotted key nests:
                           ``storage.client_kwargs.endpoint_url`` -> ``{"client_kwargs": {"endpoint_url": ..}}``)
=========================  ===================================================================================

Spark hands options over as a case-insensitive map with lower-cased keys; every error names the option the
way users spell it (``startingOffsets``), the bad value, and the accepted values. Parsing does no I/O: the
log is opened later, by the schema, planning and reading code.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from txn_core.errors import ConfigurationError, InvalidNameError
from txn_core.format.ids import is_int, validate_name
from txn_core.partition.reader import ISOLATION_LEVELS, READ_COMMITTED
from txn_core.storage.options import nest_storage_options

#: Canonical spelling of every option, keyed by the lower-cased name Spark passes.
OPTIONS = {
    name.lower(): name
    for name in (
        "path",
        "topic",
        "startingOffsets",
        "startingTimestamp",
        "endingOffsets",
        "maxOffsetsPerTrigger",
        "isolationLevel",
        "consumerGroup",
        "includeMetadata",
        "failOnDataLoss",
        "minPartitions",
        "timestampPrecision",
    )
}
#: Options of the txnlog sink, accepted and ignored by the source, so that one set of options (a view or a
#: catalog table used for reading and writing) serves both sides.
SINK_ONLY_OPTIONS = frozenset(
    {
        "partitions",
        "keycolumn",
        "transactionalid",
        "transactiontimeoutms",
        "txnappid",
        "txnversion",
        "allownonemptypath",
        "rollentries",
        "rollbytes",
        "rollminagems",
        "checkpointlocation",
        "queryname",
    }
)
STORAGE_PREFIX = "storage."
EARLIEST, LATEST, GROUP = "earliest", "latest", "group"
#: In JSON offsets: -2 means the partition's earliest offset, -1 its latest.
JSON_EARLIEST, JSON_LATEST = -2, -1

#: Offsets per topic-partition, as given in JSON (``{"topic": {"0": 12, "1": -2}}``).
OffsetSpec = dict[str, dict[int, int]]


class SourceOptionError(ConfigurationError):
    """A txnlog source option is unknown, missing or has a bad value."""


@dataclass(frozen=True, slots=True)
class SourceOptions:
    """The parsed options of one ``txnlog`` read. Picklable; shipped to executors as is.

    ``starting`` is ``"earliest"``, ``"latest"``, ``"group"``, ``"timestamp"`` or ``"offsets"`` (then
    ``starting_offsets`` holds the JSON); ``ending`` is ``"latest"`` or ``"offsets"`` (batch only).
    """

    path: str
    topics: tuple[str, ...]
    streaming: bool
    starting: str
    starting_offsets: OffsetSpec = field(default_factory=dict)
    starting_timestamp: int | None = None
    ending: str = LATEST
    ending_offsets: OffsetSpec = field(default_factory=dict)
    max_offsets_per_trigger: int | None = None
    isolation: str = READ_COMMITTED
    consumer_group: str | None = None
    include_metadata: bool = True
    fail_on_data_loss: bool = True
    min_partitions: int | None = None
    storage_options: dict[str, Any] = field(default_factory=dict)
    timestamp_precision: str = "exact"


#: ``timestampPrecision``: ``exact`` refuses a stored value with a part below Spark's microseconds, naming
#: its offset; ``truncate`` drops that part (toward zero).
TIMESTAMP_PRECISIONS = ("exact", "truncate")


def parse_options(options: Mapping[str, str], *, streaming: bool | None) -> SourceOptions:
    """Validate and parse ``options`` (keys in any case) for a streaming (True) or batch (False) read.

    ``streaming=None`` checks only what both kinds share (``DataSource.schema()`` cannot tell them apart).
    """
    opts: dict[str, str] = {}
    storage_items: dict[str, str] = {}
    for key, value in options.items():
        low = key.lower()
        if low.startswith(STORAGE_PREFIX) and len(low) > len(STORAGE_PREFIX):
            storage_items[key[len(STORAGE_PREFIX) :]] = value
        elif low in OPTIONS:
            opts[low] = value
        elif low in SINK_ONLY_OPTIONS:
            continue
        else:
            raise SourceOptionError(_unknown(key))
    storage = nest_storage_options(
        ((k, _storage_value(v)) for k, v in storage_items.items()), prefix=STORAGE_PREFIX, error=SourceOptionError
    )
    path = opts.get("path", "").strip()
    if not path and not options:
        raise SourceOptionError(
            "the txnlog source was opened with no options at all. PySpark's Python data source API (4.3) "
            "passes no options when it reads a catalog table it did not learn them for: a table made with a "
            "column list (CREATE TABLE name (...) USING txnlog), or by an older txnlog's saveAsTable. Give the "
            "options again (spark.read.format('txnlog').option('topic', T).load(URL)), or make the table with "
            "CREATE TABLE name USING txnlog OPTIONS (path 'URL', topic 'T') (no column list: the columns are "
            "the topic's; or CREATE TEMPORARY VIEW), which remembers them"
        )
    if not path:
        raise SourceOptionError(
            "option 'path' is missing: give the log URL with .option('path', URL) or .load(URL), e.g. "
            "file:///data/log or s3://bucket/log"
        )
    topics = _topics(opts.get("topic"))
    isolation = _choice(opts, "isolationlevel", ISOLATION_LEVELS, READ_COMMITTED)
    group = opts.get("consumergroup")
    if group is not None:
        try:
            validate_name("consumer group", group)
        except InvalidNameError as exc:
            raise SourceOptionError(f"option 'consumerGroup': {exc}") from exc
    starting, starting_offsets, starting_ts = _starting(opts, streaming, group)
    ending, ending_offsets = _ending(opts, streaming)
    for spec, name in ((starting_offsets, "startingOffsets"), (ending_offsets, "endingOffsets")):
        unknown = sorted(set(spec) - set(topics))
        if unknown:
            raise SourceOptionError(
                f"option '{name}' names topic(s) {unknown} that option 'topic' does not read "
                f"({', '.join(topics)}); list them in 'topic' or remove them from '{name}'"
            )
    max_per_trigger = _positive_int(opts, "maxoffsetspertrigger")
    if max_per_trigger is not None and streaming is False:
        raise SourceOptionError(
            "option 'maxOffsetsPerTrigger' applies to streaming reads (readStream) only; remove it from this batch read"
        )
    return SourceOptions(
        path=path,
        topics=topics,
        streaming=bool(streaming),
        starting=starting,
        starting_offsets=starting_offsets,
        starting_timestamp=starting_ts,
        ending=ending,
        ending_offsets=ending_offsets,
        max_offsets_per_trigger=max_per_trigger,
        isolation=isolation,
        consumer_group=group,
        include_metadata=_bool(opts, "includemetadata", True),
        fail_on_data_loss=_bool(opts, "failondataloss", True),
        min_partitions=_positive_int(opts, "minpartitions"),
        storage_options=storage,
        timestamp_precision=_choice(opts, "timestampprecision", TIMESTAMP_PRECISIONS, "exact"),
    )


def _unknown(key: str) -> str:
    import difflib  # only for this message; every query's driver process imports this module

    accepted = sorted(OPTIONS.values(), key=str.lower)
    close = difflib.get_close_matches(key.lower(), list(OPTIONS), n=1)
    hint = f" Did you mean '{OPTIONS[close[0]]}'?" if close else ""
    return (
        f"unknown option '{key}' for format txnlog.{hint} Accepted options (case-insensitive): "
        f"{', '.join(accepted)}, and 'storage.<key>' for fsspec storage options."
    )


def _storage_value(value: str) -> Any:
    """Storage options arrive as strings: JSON objects, lists and booleans are decoded, the rest kept."""
    text = value.strip()
    if text[:1] in "{[" or text in ("true", "false", "null"):
        try:
            return json.loads(text)
        except ValueError:
            return value
    return value


def _topics(value: str | None) -> tuple[str, ...]:
    if value is None or not value.strip():
        raise SourceOptionError(
            "option 'topic' is missing: name one topic or a comma-separated list, e.g. .option('topic', 'orders')"
        )
    out: list[str] = []
    for name in (t.strip() for t in value.split(",")):
        try:
            validate_name("topic", name)
        except InvalidNameError as exc:
            raise SourceOptionError(f"option 'topic' = {value!r}: {exc}") from exc
        if name not in out:
            out.append(name)
    return tuple(out)


def _choice(opts: dict[str, str], key: str, accepted: tuple[str, ...], default: str) -> str:
    value = opts.get(key)
    if value is None:
        return default
    if value.strip().lower() not in accepted:
        raise SourceOptionError(
            f"option '{OPTIONS[key]}' = {value!r} is not valid; accepted values: {', '.join(accepted)}"
        )
    return value.strip().lower()


def _bool(opts: dict[str, str], key: str, default: bool) -> bool:
    return _choice(opts, key, ("true", "false"), str(default).lower()) == "true"


def _int(opts: dict[str, str], key: str, what: str, minimum: int) -> int | None:
    value = opts.get(key)
    if value is None:
        return None
    try:
        number = int(value.strip())
    except ValueError:
        number = minimum - 1
    if number < minimum:
        raise SourceOptionError(f"option '{OPTIONS[key]}' = {value!r} is not valid; accepted values: {what}")
    return number


def _positive_int(opts: dict[str, str], key: str) -> int | None:
    return _int(opts, key, "a positive integer", 1)


def _starting(opts: dict[str, str], streaming: bool | None, group: str | None) -> tuple[str, OffsetSpec, int | None]:
    value = opts.get("startingoffsets")
    timestamp = _int(opts, "startingtimestamp", "milliseconds since the epoch (an integer >= 0)", 0)
    if timestamp is not None:
        if value is not None:
            raise SourceOptionError(
                "options 'startingOffsets' and 'startingTimestamp' exclude each other; give only one"
            )
        if group is not None:
            raise SourceOptionError("option 'consumerGroup' applies to startingOffsets=group only; remove it")
        return "timestamp", {}, timestamp
    accepted = f'{EARLIEST}, {LATEST}, {GROUP}, or JSON such as {{"topic": {{"0": 12, "1": -2}}}}'
    if value is None:
        starting = GROUP if group is not None else (LATEST if streaming else EARLIEST)
        return starting, {}, None
    text = value.strip()
    if text.lower() in (EARLIEST, LATEST, GROUP):
        starting = text.lower()
        if starting == LATEST and streaming is False:
            raise SourceOptionError(
                "option 'startingOffsets' = 'latest' is not valid for a batch read (it would read nothing); "
                f"accepted values: {EARLIEST}, {GROUP}, or JSON offsets"
            )
        if starting == GROUP and group is None:
            raise SourceOptionError(
                "option 'startingOffsets' = 'group' needs option 'consumerGroup' naming the group whose "
                "committed offsets to resume from"
            )
        if starting != GROUP and group is not None:
            raise SourceOptionError(
                f"option 'consumerGroup' applies to startingOffsets=group only, not {starting!r}; remove one"
            )
        return starting, {}, None
    if group is not None:
        raise SourceOptionError("option 'consumerGroup' applies to startingOffsets=group only; remove one")
    spec = _offset_json("startingOffsets", value, accepted, (JSON_EARLIEST, JSON_LATEST))
    if streaming is False and any(o == JSON_LATEST for parts in spec.values() for o in parts.values()):
        raise SourceOptionError(
            "option 'startingOffsets': -1 (latest) is not valid for a batch read; use -2 (earliest) or an offset"
        )
    return "offsets", spec, None


def _ending(opts: dict[str, str], streaming: bool | None) -> tuple[str, OffsetSpec]:
    value = opts.get("endingoffsets")
    if value is None:
        return LATEST, {}
    if streaming is True:
        raise SourceOptionError(
            "option 'endingOffsets' applies to batch reads (spark.read) only; a stream has no end. Use "
            "Trigger.AvailableNow to stop at the offsets available when the query starts"
        )
    if value.strip().lower() == LATEST:
        return LATEST, {}
    accepted = f'{LATEST} or JSON such as {{"topic": {{"0": 100, "1": -1}}}} (-1 = latest)'
    return "offsets", _offset_json("endingOffsets", value, accepted, (JSON_LATEST,))


def _offset_json(name: str, value: str, accepted: str, specials: tuple[int, ...]) -> OffsetSpec:
    try:
        raw = json.loads(value)
    except ValueError:
        raise SourceOptionError(f"option '{name}' = {value!r} is not valid; accepted values: {accepted}") from None
    if not isinstance(raw, dict) or not raw:
        raise SourceOptionError(f"option '{name}' = {value!r} is not valid; accepted values: {accepted}")
    spec: OffsetSpec = {}
    for topic, parts in raw.items():
        if not isinstance(parts, dict) or not parts:
            raise SourceOptionError(
                f"option '{name}': topic {topic!r} must map partition numbers to offsets, e.g. "
                f'{{"{topic}": {{"0": 12}}}}; got {parts!r}'
            )
        out: dict[int, int] = {}
        for p, off in parts.items():
            try:
                partition = int(p)
            except ValueError:
                partition = -1
            bad = not is_int(off) or (off < 0 and off not in specials)
            if partition < 0 or bad:
                allowed = " or ".join(str(s) for s in specials)
                raise SourceOptionError(
                    f"option '{name}': topic {topic!r} partition {p!r} offset {off!r} is not valid; use a "
                    f"partition number mapped to an offset >= 0 or {allowed}"
                )
            out[partition] = off
        spec[str(topic)] = out
    return spec
