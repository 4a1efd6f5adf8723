"""The sink's options, parsed once into a frozen, picklable :class:`SinkOptions` (see PROTOCOL.md here).

Spark hands a data source its options as a case-insensitive dict with lower-cased keys, all values
strings. Every option is checked here, before anything is written; an unknown or bad option raises
:class:`txn_core.ConfigurationError` naming the option, the accepted values and the fix.

``storage.<key>`` options become fsspec ``storage_options``: ``storage.key=...`` -> ``{"key": ...}``;
a dotted key nests (``storage.client_kwargs.endpoint_url=...`` -> ``{"client_kwargs": {"endpoint_url":
...}}``); a value that is a JSON object or list, or ``true``/``false``, is decoded.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from txn_core import ConfigurationError
from txn_core.clients.topics import MAX_PARTITIONS, METADATA_COLUMNS
from txn_core.format.ids import validate_name
from txn_core.ops.rolling import MIN_AGE_MS, ROLL_BYTES, ROLL_ENTRIES
from txn_core.partition.ages import SAFE_ENTRY_AGE_MS
from txn_core.storage.options import nest_storage_options

#: Columns a txnlog source adds, the names the core reserves (no topic has them). The sink drops them when a
#: frame carries all of them in the source's types, so that a copy pipeline works as written, and refuses
#: any other column with one of these names (:func:`spark_txn_sink.topic.ignored_columns`).
SOURCE_METADATA_COLUMNS: tuple[str, ...] = METADATA_COLUMNS
#: Upper bound of ``transactionTimeoutMs`` (the core's limit: 15 minutes).
MAX_TRANSACTION_TIMEOUT_MS = 15 * 60 * 1000
DEFAULT_TRANSACTION_TIMEOUT_MS = 60_000

_KNOWN = {
    "path": "the log URL (or pass it to save(path) / start(path))",
    "topic": "the target topic",
    "partitions": "partition count for a topic the sink creates",
    "keycolumn": "route rows by a stable hash of this column",
    "transactionalid": "the transactional id (default: derived from the streaming query id)",
    "consumergroup": "streaming writes: commit the consumed txnlog source offsets to this group in each batch's "
    "transaction (batch writes ignore it: it is then the source's option of a view or table)",
    "transactiontimeoutms": "timeout of the sink's transactions in ms (default 60000)",
    "allownonemptypath": "true: create the log in a directory or prefix that holds other files (default: refuse)",
    "txnappid": "batch writes: an application id; with txnVersion, a write whose (txnAppId, txnVersion) "
    "already committed to the topic commits nothing (idempotent writes from foreachBatch; versions are "
    "counted per topic, as Delta counts them per table)",
    "txnversion": "batch writes: the version of this write under txnAppId (e.g. foreachBatch's batch id); "
    "versions at or below the last one committed to the topic are no-ops",
    "rollentries": f"roll partitions' history into segments once this many entries are decided since the last "
    f"segment (default {ROLL_ENTRIES}; 0: the sink does not roll)",
    "rollbytes": f"...or once they hold this many bytes (default {ROLL_BYTES})",
    "rollminagems": f"delete rolled loose entries only when their segment is older than this (default {MIN_AGE_MS}, "
    f"least {SAFE_ENTRY_AGE_MS}: a writer in another process may still append at a deleted slot below it)",
    "checkpointlocation": "set by Spark for streaming queries given .option('checkpointLocation', DIR)",
    "queryname": "set by Spark for named streaming queries",
    "testing.fault": "test-only fault injection (see spark_txn_sink.faults)",
    "testing.stats": "test-only: a local directory for per-commit storage request counts",
    "testing.rollminagems": "test-only: rollMinAgeMs without its least value (no other writer)",
}
#: Options of the txnlog source, accepted and ignored by the sink, so that one set of options (a view or a
#: catalog table used for reading and writing) serves both sides.
SOURCE_ONLY_OPTIONS = frozenset(
    {
        "startingoffsets",
        "startingtimestamp",
        "endingoffsets",
        "maxoffsetspertrigger",
        "isolationlevel",
        "includemetadata",
        "failondataloss",
        "timestampprecision",
        "minpartitions",
    }
)
_HIDDEN = ("checkpointlocation", "queryname", "testing.fault", "testing.stats", "testing.rollminagems")


_PATH = "the log URL: .option('path', URL) or .save(URL)"
_PATH_STREAMING = (
    "the log URL: .option('path', URL) or .start(URL). (writeStream.toTable(name) cannot write to a txnlog "
    "table: txnlog tables are read-only to Spark, since PySpark's Python data source API (4.3) tells a sink "
    "nothing about the table it writes to; write with writeStream.format('txnlog').option('topic', "
    "T).start(URL), the table's path and topic.)"
)


@dataclass(frozen=True, slots=True)
class SinkOptions:
    """Every setting of one sink, validated. Picklable: it travels to Spark tasks and commit workers."""

    url: str
    storage_items: tuple[tuple[str, Any], ...]
    topic: str
    partitions: int | None
    key_column: str | None
    transactional_id: str | None
    consumer_group: str | None
    transaction_timeout_ms: int
    checkpoint_location: str | None
    query_name: str | None
    fault: str | None
    stats_dir: str | None
    app_id: str | None = None
    app_version: int | None = None
    allow_non_empty: bool = False
    roll_entries: int = ROLL_ENTRIES  # 0: the sink does not roll (PROTOCOL.md "Segments")
    roll_bytes: int = ROLL_BYTES
    roll_min_age_ms: int = MIN_AGE_MS

    @property
    def storage_options(self) -> dict[str, Any] | None:
        """The fsspec storage options (a fresh dict), or None when none were given."""
        return dict(self.storage_items) if self.storage_items else None


def parse_sink_options(options: Mapping[str, str], *, streaming: bool) -> SinkOptions:
    """Validate Spark's writer options (keys lower-cased by Spark) into :class:`SinkOptions`."""
    opts = {str(k).lower(): v for k, v in options.items()}
    opts = {k: v for k, v in opts.items() if k not in SOURCE_ONLY_OPTIONS}
    unknown = sorted(k for k in opts if k not in _KNOWN and not k.startswith("storage."))
    if unknown:
        accepted = "; ".join(f"{k} ({v})" for k, v in _KNOWN.items() if k not in _HIDDEN)
        raise ConfigurationError(
            f"unknown txnlog sink option(s) {unknown}. Accepted: {accepted}; storage.<key> (fsspec storage "
            "options). Option names are case-insensitive."
        )
    if not opts:
        raise ConfigurationError(
            "the txnlog sink was opened with no options at all, as PySpark's Python data source API (4.3) "
            "opens a sink writing to a catalog table (INSERT INTO, insertInto, writeTo, CREATE TABLE ... AS "
            "SELECT): txnlog tables are read-only to Spark, since the sink cannot learn which table it writes "
            "to. Nothing was written. Write with df.write.format('txnlog').option('topic', "
            "T).mode('append').save(URL), or with SQL through a temporary view, which hands the sink its "
            "options: CREATE TEMPORARY VIEW v USING txnlog OPTIONS (path 'URL', topic 'T'), then INSERT INTO v"
        )
    url = _required(opts, "path", _PATH_STREAMING if streaming else _PATH)
    scheme = urlsplit(url).scheme.lower()
    if scheme == "memory":
        raise ConfigurationError(
            f"path {url!r}: a memory:// log lives inside one process, but Spark writes from worker processes "
            "and commits from another; use a local directory (file://...) or an object store (s3://...)"
        )
    topic = _required(opts, "topic", "the target topic")
    if "," in topic:
        raise ConfigurationError(
            f"option topic = {topic!r} names several topics, but a txnlog write goes to one topic. A view or "
            "table that reads several topics cannot be written to: write each topic with "
            "df.write.format('txnlog').option('topic', T).mode('append').save(URL), or make a view of one "
            "topic for writing"
        )
    validate_name("topic", topic)
    partitions = _int(opts, "partitions", 1, MAX_PARTITIONS)
    key_column = opts.get("keycolumn") or None
    tid = opts.get("transactionalid") or None
    if tid is not None:
        validate_name("transactional id", tid)
    # consumerGroup means "commit the source offsets" to a streaming sink only; a batch write has no source
    # offsets, and gets the option from a view or table that reads from the group: the source's meaning
    group = (opts.get("consumergroup") or None) if streaming else None
    if group is not None:
        validate_name("group", group)
    timeout = _int(opts, "transactiontimeoutms", 1, MAX_TRANSACTION_TIMEOUT_MS)
    app_id, app_version = _app_version(opts, streaming)
    # None for a stream: Spark checkpoints under the session's spark.sql.streaming.checkpointLocation (it refuses
    # a query with neither), a location only the write tasks can learn (spark_txn_sink.checkpoint)
    checkpoint = opts.get("checkpointlocation") or None
    return SinkOptions(
        url=url,
        storage_items=tuple(sorted(_storage_options(opts).items())),
        topic=topic,
        partitions=partitions,
        key_column=key_column,
        transactional_id=tid,
        consumer_group=group,
        transaction_timeout_ms=timeout if timeout is not None else DEFAULT_TRANSACTION_TIMEOUT_MS,
        checkpoint_location=checkpoint,
        query_name=opts.get("queryname") or None,
        fault=_fault(opts.get("testing.fault")),
        stats_dir=opts.get("testing.stats") or None,
        app_id=app_id,
        app_version=app_version,
        allow_non_empty=_flag(opts, "allownonemptypath"),
        roll_entries=_or(_int(opts, "rollentries", 0, 2**31), ROLL_ENTRIES),
        roll_bytes=_or(_int(opts, "rollbytes", 1, 2**62), ROLL_BYTES),
        roll_min_age_ms=_or(
            _int(opts, "testing.rollminagems", 0, 2**62),
            _or(_int(opts, "rollminagems", SAFE_ENTRY_AGE_MS, 2**62), MIN_AGE_MS),
        ),
    )


def _or(value: int | None, default: int) -> int:
    return default if value is None else value


def _flag(opts: dict[str, str], name: str) -> bool:
    raw = str(opts.get(name, "false")).strip().lower()
    if raw not in ("true", "false"):
        raise ConfigurationError(f"txnlog sink option {name!r} must be true or false, got {opts.get(name)!r}")
    return raw == "true"


def _app_version(opts: dict[str, str], streaming: bool) -> tuple[str | None, int | None]:
    """``txnAppId`` and ``txnVersion``: both or neither, batch writes only (Delta's idempotent writes)."""
    app_id = (opts.get("txnappid") or "").strip() or None
    raw = (opts.get("txnversion") or "").strip() or None
    if app_id is None and raw is None:
        return None, None
    if streaming:
        raise ConfigurationError(
            "options txnAppId and txnVersion apply to batch writes (df.write, e.g. inside foreachBatch); a "
            "streaming txnlog sink is exactly-once by itself. Remove them."
        )
    if app_id is None or raw is None:
        raise ConfigurationError(
            "options txnAppId and txnVersion go together: txnAppId names the application, txnVersion the "
            "write (e.g. foreachBatch's batch id); give both or neither"
        )
    validate_name("txnAppId", app_id)
    version = _int({"txnversion": raw}, "txnversion", 0, 2**62)
    return app_id, version


def _fault(spec: str | None) -> str | None:
    if not spec:
        return None
    from spark_txn_sink.faults import parse_faults

    parse_faults(spec)  # validate now, before anything is written
    return spec


def _required(opts: dict[str, str], name: str, what: str) -> str:
    value = opts.get(name)
    if value is None or not str(value).strip():
        raise ConfigurationError(f"txnlog sink option {name!r} is required: {what}")
    return str(value).strip()


def _int(opts: dict[str, str], name: str, low: int, high: int) -> int | None:
    raw = opts.get(name)
    if raw is None or str(raw).strip() == "":
        return None
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise ConfigurationError(f"txnlog sink option {name!r} must be an integer, got {raw!r}") from None
    if not low <= value <= high:
        raise ConfigurationError(f"txnlog sink option {name!r} must be in [{low}, {high}], got {value}")
    return value


def _storage_options(opts: dict[str, str]) -> dict[str, Any]:
    items = [(k[len("storage.") :], _decode(k, opts[k])) for k in opts if k.startswith("storage.")]
    return nest_storage_options(items, prefix="storage.")


def _decode(key: str, value: str) -> Any:
    text = str(value).strip()
    if text in ("true", "false"):
        return text == "true"
    if text[:1] in ("{", "["):
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:  # the value may hold a secret: never echo it
            raise ConfigurationError(
                f"storage option {key!r} starts like JSON but is not JSON: {exc.msg} at character {exc.pos}"
            ) from None
    return value
