"""Planning checks on the driver: the target topic exists (or will be created) and accepts the frame.

Runs before any task starts, so a mismatch fails the query with nothing written. The frame's columns
``_topic``, ``_partition``, ``_offset`` and ``_timestamp`` (added by a txnlog source) are ignored when the
frame carries all four in the source's types; a column with one of these names in any other frame is the
user's own and is refused, never dropped (:func:`ignored_columns`).

A missing topic is **not** created while Spark plans: it is created by the commit, right before the
batch's transaction begins (:func:`create_planned_topic`), so a write that fails (a task error, a
refused value) leaves no topic and no schema behind, and a corrected retry starts afresh. A topic made
from a frame has every column nullable, at every depth: Spark does not enforce a frame's non-null
declarations on the rows it hands a Python sink.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from spark_txn_sink.options import SOURCE_METADATA_COLUMNS, SinkOptions
from txn_core import ConfigurationError, SchemaMismatchError, TopicExistsError, TopicNotFoundError
from txn_core.clients.routing import partitions_for_column
from txn_core.clients.topics import TopicMeta, normalize_schema
from txn_core.format.schema import conform
from txn_core.log import Log
from txn_core.logs import get_logger

logger = get_logger(__name__)

#: ``(log URL, topic, partitions option)`` already warned about in this process (a stream plans every batch).
_warned_partitions: set[tuple[str, str, int]] = set()


def ignored_columns(spark_schema: Any) -> tuple[str, ...]:
    """The frame's columns the sink ignores: all of :data:`~spark_txn_sink.options.SOURCE_METADATA_COLUMNS`
    when the frame carries each of them once, in whatever type (a frame read from a txnlog source, which may
    retype them, or a view of one, ``INSERT INTO`` included); ``()`` when it carries none of them.

    Invariant: the sink never drops a user's own column. A frame with any other mix of these names (some
    missing, another type, a name twice) is refused with :class:`SchemaMismatchError` naming each column and
    the fix, while Spark plans the write: no topic can store the names (the core reserves them,
    :func:`txn_core.clients.topics.normalize_schema`), so such a column could be neither written nor dropped silently.
    """
    from spark_txn_source.schema import spark_schema as source_spark_schema

    source = {f.name: f.dataType for f in source_spark_schema(pa.schema([]), include_metadata=True).fields}
    given = [f for f in spark_schema.fields if f.name in source]
    if not given:
        return ()
    names = [f.name for f in given]
    problems = [f"{n} is missing" for n in SOURCE_METADATA_COLUMNS if n not in names]
    problems += [f"{n} appears {names.count(n)} times" for n in SOURCE_METADATA_COLUMNS if names.count(n) > 1]
    # Types are not compared: a source read may retype its metadata columns (``.schema("..., _timestamp
    # bigint")``, documented), and a frame carrying all four names once is a source's frame whatever they hold.
    if not problems:
        return SOURCE_METADATA_COLUMNS
    kept = list(dict.fromkeys(names))
    first = kept[0]
    expected = ", ".join(f"{n} {t.simpleString()}" for n, t in source.items())
    raise SchemaMismatchError(
        f"the frame has column(s) {kept} with names txnlog reserves for the metadata columns its source adds "
        f"({', '.join(SOURCE_METADATA_COLUMNS)}); no topic can store them. The sink ignores them only when a "
        f"frame carries all {len(source)} once each ({expected}), as a frame read from a txnlog source does, and "
        f"this one does not ({'; '.join(problems)}). Nothing was written. To keep your column's values "
        f"rename it, e.g. df.withColumnRenamed('{first}', 'event{first}'); to leave it out, drop it: "
        f"df.drop({', '.join(repr(n) for n in kept)})."
    )


def frame_arrow_schema(spark_schema: Any) -> pa.Schema:
    """The Arrow schema of the frame's data columns (the source's metadata columns, when
    :func:`ignored_columns` ignores them, and field metadata removed).

    A column with a name the core reserves that the sink does not ignore, and types a topic cannot hold as
    themselves, are refused here, while Spark plans the write, naming every such column and what to write
    instead (:func:`ignored_columns`, :func:`unstorable_columns`).
    """
    from pyspark.sql.pandas.types import to_arrow_schema

    ignored = ignored_columns(spark_schema)
    refused = unstorable_columns(spark_schema)
    if refused:
        listing = "; ".join(f"{column} ({kind}): {fix}" for column, kind, fix in refused)
        raise SchemaMismatchError(
            f"the frame has columns a txnlog topic cannot store as they are: {listing}. Nothing was written."
        )
    try:
        arrow = to_arrow_schema(spark_schema, timezone="UTC")
    except Exception as exc:  # pyspark raises its own error types for unsupported types
        raise SchemaMismatchError(f"the frame has a column type Arrow cannot represent: {exc}") from exc
    fields = [pa.field(f.name, _nullable(f.type), True) for f in arrow if f.name not in ignored]
    if not fields:
        raise SchemaMismatchError(f"the frame has no data columns (only {[f.name for f in arrow]}); nothing to write")
    return pa.schema(fields)


def unstorable_columns(spark_schema: Any) -> list[tuple[str, str, str]]:
    """``(column, type, what to write instead)`` for each value of ``spark_schema`` (at any depth, skipping
    columns with the source's metadata column names: :func:`ignored_columns` checks those) that a topic cannot
    hold as itself.

    Spark hands a Python sink a variant, a geometry or geography value as a plain struct of binary fields,
    and a user-defined type as its underlying SQL type: written as they arrive, they would be read back as
    those structs, not as the type written. Arrow (as PySpark converts it) has no year-month interval.
    """
    from pyspark.sql import types as st

    fixes: list[tuple[type[st.DataType], str]] = [
        (st.VariantType, "write to_json(col), a string, and read it back with parse_json()"),
        (st.GeometryType, "write st_asbinary(col) (WKB) and read it back with st_geomfromwkb()"),
        (st.GeographyType, "write st_asbinary(col) (WKB) and read it back with st_geogfromwkb()"),
        (
            st.YearMonthIntervalType,
            "write the number of months, e.g. extract(YEAR FROM col) * 12 + extract(MONTH FROM col)",
        ),
        (st.CalendarIntervalType, "write its parts (make_dt_interval, or months, days and microseconds as numbers)"),
        (st.UserDefinedType, "write its SQL type (udt.sqlType()) explicitly, and rebuild the value after reading"),
    ]
    out: list[tuple[str, str, str]] = []

    def visit(dt: Any, where: str) -> None:
        for kind, fix in fixes:
            if isinstance(dt, kind):
                out.append((where, type(dt).__name__ if kind is st.UserDefinedType else dt.simpleString(), fix))
                return
        if isinstance(dt, st.StructType):
            for f in dt.fields:
                visit(f.dataType, f"{where}.{f.name}")
        elif isinstance(dt, st.ArrayType):
            visit(dt.elementType, f"{where}[]")
        elif isinstance(dt, st.MapType):
            visit(dt.keyType, f"{where}.key")
            visit(dt.valueType, f"{where}.value")

    for field in spark_schema.fields:
        if field.name not in SOURCE_METADATA_COLUMNS:
            visit(field.dataType, field.name)
    return out


def _nullable(t: pa.DataType) -> pa.DataType:
    """``t`` with every child field nullable (map keys stay non-null, as Arrow requires)."""
    if pa.types.is_struct(t):
        return pa.struct([pa.field(t.field(i).name, _nullable(t.field(i).type), True) for i in range(t.num_fields)])
    if pa.types.is_map(t):
        return pa.map_(t.key_type, pa.field(t.item_field.name, _nullable(t.item_type), True))
    if pa.types.is_large_list(t):
        return pa.large_list(pa.field(t.value_field.name, _nullable(t.value_type), True))
    if pa.types.is_list(t):
        return pa.list_(pa.field(t.value_field.name, _nullable(t.value_type), True))
    return t


@dataclass(frozen=True, slots=True)
class PlannedTopic:
    """The topic a write targets: its schema and partitions, and whether the commit must create it."""

    name: str
    schema: pa.Schema
    partitions: int
    create: bool


def plan_topic(log: Log, opts: SinkOptions, frame: pa.Schema) -> PlannedTopic:
    """The target topic as it is, or as the commit will create it from ``frame`` (``partitions`` set);
    checks the schema. Writes nothing."""
    meta: TopicMeta | None
    try:
        meta = log.topics.get(opts.topic)
    except TopicNotFoundError as exc:
        if opts.partitions is None:
            raise TopicNotFoundError(
                f"{exc} Or let the sink create it from the frame's schema: .option('partitions', N)."
            ) from exc
        meta = None
    if meta is None:
        if opts.partitions is None:  # pragma: no cover - refused above
            raise TopicNotFoundError(f"unknown topic {opts.topic!r}")
        normalize_schema(frame)  # reserved, duplicate or missing column names fail now, not at commit
        check_key_column(opts, frame, frame)
        return PlannedTopic(opts.topic, frame, opts.partitions, create=True)
    check_schema(meta, frame, opts)
    if opts.partitions is not None and opts.partitions != meta.partitions:
        warn_partitions_ignored(opts, meta)
    return PlannedTopic(meta.name, meta.schema, meta.partitions, create=False)


def warn_partitions_ignored(opts: SinkOptions, meta: TopicMeta) -> None:
    """Warn (once per process, log, topic and value) that ``partitions`` does not change an existing topic."""
    key = (opts.url, meta.name, opts.partitions or 0)
    if key in _warned_partitions:
        return
    _warned_partitions.add(key)
    logger.warning(
        "topic %r exists with %d partition(s); option 'partitions' (%d) is ignored: it only applies when the "
        "sink creates the topic. Writing to its %d partition(s); drop the option, or write to a new topic to "
        "have %d",
        meta.name,
        meta.partitions,
        opts.partitions,
        meta.partitions,
        opts.partitions,
    )


def check_key_column(opts: SinkOptions, frame: pa.Schema, topic: pa.Schema) -> None:
    """``keyColumn`` must be a column of the frame whose type (the topic's: rows are routed after they are
    conformed to it) the core's routing can hash (:func:`txn_core.clients.routing.partitions_for_column`): every
    scalar type can, structs, arrays and maps cannot. Raises :class:`ConfigurationError` naming the fix."""
    key = opts.key_column
    if key is None:
        return
    if key not in frame.names:
        raise ConfigurationError(f"keyColumn {key!r} is not a column of the frame; its columns are {frame.names}")
    kind = (topic if key in topic.names else frame).field(key).type
    try:
        partitions_for_column(pa.nulls(1, kind), 1)  # the routing the tasks run, on a value of the type
    except (pa.ArrowNotImplementedError, pa.ArrowTypeError, pa.ArrowInvalid) as exc:
        raise ConfigurationError(
            f"keyColumn {key!r} has type {kind}, which rows cannot be routed by: txnlog hashes scalar keys "
            "(strings, numbers, booleans, binary, dates, timestamps...), not structs, arrays or maps. Nothing was "
            f"written. Key on a scalar column made from it, e.g. df.withColumn('{key}_key', F.to_json('{key}')) "
            f"(or F.xxhash64('{key}')) with .option('keyColumn', '{key}_key'); it is written with the rows, so "
            "an existing topic must have that column (or key on one of its scalar columns)"
        ) from exc


def create_planned_topic(log: Log, planned: PlannedTopic) -> None:
    """Create a topic the plan found missing (the commit's first step); a no-op for an existing one.

    Another writer may have created it meanwhile: that is fine only with the same schema and partition
    count, which the batch's staged data and routing were made for; otherwise the commit fails, nothing is
    committed, and the retry plans against the topic as it now is.
    """
    if not planned.create:
        return
    try:
        log.create_topic(planned.name, planned.partitions, planned.schema)
        return
    except TopicExistsError:
        meta = log.topics.get(planned.name)
    if meta.schema != planned.schema or meta.partitions != planned.partitions:
        raise SchemaMismatchError(
            f"topic {planned.name!r} was created by another writer while this batch was written, with schema "
            f"({meta.schema.to_string(show_schema_metadata=False)}) and {meta.partitions} partition(s); this "
            f"batch was staged for ({planned.schema.to_string(show_schema_metadata=False)}) and "
            f"{planned.partitions}. Nothing of it was committed; the query's retry writes to the topic as it "
            "is now."
        )


def check_schema(meta: TopicMeta, frame: pa.Schema, opts: SinkOptions) -> None:
    """Raise :class:`SchemaMismatchError` naming every column that does not fit the topic."""
    from spark_txn_sink.stager import align_timestamps

    empty = pa.RecordBatch.from_arrays([pa.array([], type=f.type) for f in frame], schema=frame)
    try:
        conform(align_timestamps(empty, meta.schema), meta.schema, topic=meta.name)
    except SchemaMismatchError as exc:
        raise SchemaMismatchError(
            f"{exc} Columns {list(SOURCE_METADATA_COLUMNS)} of a txnlog source are ignored; select or cast "
            "the other columns to match.",
            exc.differences,
        ) from exc
    check_key_column(opts, frame, meta.schema)
