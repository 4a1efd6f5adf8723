"""Spark schema of a txnlog read, and making record batches match it exactly.

The schema is the topics' Arrow schema (unified over several topics) converted to Spark types, plus the
metadata columns ``_topic``, ``_partition``, ``_offset``, ``_timestamp`` unless ``includeMetadata=false``.
Spark accepts a ``pyarrow.RecordBatch`` from ``read()`` only if its schema equals ``to_arrow_schema(schema,
timezone="UTC")`` exactly (names, order, ``string`` not ``large_string``, nullability). The metadata
columns are built in the target's own types (:func:`metadata_fields`: nullable, ``_timestamp`` in
microseconds), so a batch of a topic whose columns Spark represents as they are already equals the target
and is handed over as it is. Any other batch is rebuilt against the target: columns are taken by name
(zero-copy when the type already matches), cast when the type differs, and null-filled when a topic lacks a
column another topic has. A topic column's cast only changes its representation, never its values (Arrow's
``large_string`` to ``string``, milliseconds to Spark's microseconds, a time zone to UTC): a requested schema
that gives a topic column another Spark type is refused while Spark plans the read (:func:`check_requested`).
Only the metadata columns may be retyped by a requested schema, and are then cast. A stored value the cast
would change (nanoseconds, a ``date64`` that is not a whole day, a value out of Spark's range) fails the task
with :class:`SourceValueError` naming topic, partition, offset and column, unless ``timestampPrecision`` is
``truncate``, which drops the part below Spark's unit (:func:`conform`).
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.pandas.types import from_arrow_type, to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    CharType,
    DataType,
    MapType,
    StringType,
    StructField,
    StructType,
    VarcharType,
)

from txn_core.clients.topics import METADATA_COLUMNS
from txn_core.errors import ConfigurationError, TxnLogError
from txn_core.format.temporal import Inexact, cast_truncating, first_inexact
from txn_core.partition.records import METADATA_FIELDS, buildable_metadata_field


def topic_arrow_schema(schemas: dict[str, pa.Schema]) -> pa.Schema:
    """The schemas of the topics read, unified (one schema for all topics, or a clear error)."""
    try:
        return pa.unify_schemas(list(schemas.values()))
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        listing = "; ".join(f"{t}: {s.to_string(show_schema_metadata=False)}" for t, s in schemas.items())
        raise ConfigurationError(
            f"topics {sorted(schemas)} have incompatible schemas ({exc}); read them in separate queries. "
            f"Schemas: {listing}"
        ) from exc


def spark_schema(arrow_schema: pa.Schema, include_metadata: bool) -> StructType:
    """The Spark schema of a read: topic columns (nullable) then, optionally, the metadata columns."""
    fields = list(arrow_schema) + (METADATA_FIELDS if include_metadata else [])
    out = []
    for f in fields:
        try:
            dtype = from_arrow_type(_days(f.type), prefer_timestamp_ntz=True)
        except Exception as exc:
            raise ConfigurationError(
                f"column {f.name!r} has Arrow type {f.type}, which Spark cannot represent ({exc}); "
                "store it as a Spark-compatible type (e.g. int64 instead of uint64)"
            ) from exc
        out.append(StructField(f.name, dtype, nullable=True))
    return StructType(out)


def _days(t: pa.DataType) -> pa.DataType:
    """``t`` with every ``date64`` (milliseconds, as pyarrow may write dates) read as ``date32``, Spark's
    ``date``, at any depth; :func:`conform` converts the values exactly (whole days) or names the one that
    is not."""
    if pa.types.is_date64(t):
        return pa.date32()
    if pa.types.is_struct(t):
        return pa.struct([t.field(i).with_type(_days(t.field(i).type)) for i in range(t.num_fields)])
    if pa.types.is_map(t):
        return pa.map_(_days(t.key_type), t.item_field.with_type(_days(t.item_type)))
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return pa.list_(t.value_field.with_type(_days(t.value_type)))
    return t


#: What to do when a catalog table's stored schema does not match its topics.
TABLE_SCHEMA_FIX = (
    "This is a txnlog catalog table, whose stored schema no longer matches its topics: it may have been changed "
    "(ALTER TABLE ... ADD COLUMNS, ALTER COLUMN and the like are not honoured by txnlog tables), or the topics "
    "were recreated. DROP TABLE it and CREATE TABLE it again with the same OPTIONS (dropping a txnlog table "
    "leaves the log and its topics intact)"
)


def check_requested(requested: StructType, available: StructType, *, table: bool = False) -> None:
    """A requested schema (a user's ``.schema(...)``, or a catalog table's stored schema when ``table``) may
    only name columns the read provides, each of a topic column's own type: txnlog never converts a topic's
    values (:func:`conform` casts only the metadata columns, which a requested schema may retype, as txnlog
    builds them). Differences that leave values unchanged are accepted: nullability at any depth, field
    metadata, string collations and CHAR/VARCHAR for strings. Raises :class:`ConfigurationError` naming
    every offending column and the fix, while Spark plans the read (before any task)."""
    names = set(available.fieldNames())
    missing = [f.name for f in requested.fields if f.name not in names]
    if missing:
        raise ConfigurationError(
            f"the schema given to the txnlog source names column(s) {missing} that the topics do not have; "
            f"available columns: {', '.join(available.fieldNames())}. "
            + (
                TABLE_SCHEMA_FIX
                if table
                else "Drop .schema(...) to read the topics' columns, or name only available ones"
                " (a txnlog catalog table's stored schema may have been changed with ALTER TABLE, which txnlog"
                " tables do not honour: DROP TABLE and CREATE TABLE it again; dropping a txnlog table leaves"
                " the log intact)"
            )
        )
    own = {f.name: f.dataType for f in available.fields}
    retyped = [
        (f.name, f.dataType, own[f.name])
        for f in requested.fields
        if f.name not in METADATA_COLUMNS and _plain(f.dataType) != _plain(own[f.name])
    ]
    if retyped:
        listing = "; ".join(
            f"column {n!r} is requested as {want.simpleString()}, the topics store {have.simpleString()}"
            for n, want, have in retyped
        )
        name, want, _ = retyped[0]
        fix = (
            TABLE_SCHEMA_FIX
            if table
            else "Drop .schema(...) to read the topics' own types, or cast after loading: "
            f".load(URL).withColumn({name!r}, F.col({name!r}).cast({want.simpleString()!r}))"
        )
        raise ConfigurationError(
            f"the schema given to the txnlog source does not match the topics' types: {listing}. txnlog does not "
            f"convert a topic's values on read (a cast would change them, or fail inside a task). {fix}"
        )


def _plain(dt: DataType) -> DataType:
    """``dt`` without what does not change its values: nullability at any depth, field metadata, a string's
    collation, CHAR/VARCHAR (strings in a frame)."""
    if isinstance(dt, StructType):
        return StructType([StructField(f.name, _plain(f.dataType), True) for f in dt.fields])
    if isinstance(dt, ArrayType):
        return ArrayType(_plain(dt.elementType), True)
    if isinstance(dt, MapType):
        return MapType(_plain(dt.keyType), _plain(dt.valueType), True)
    if isinstance(dt, StringType | CharType | VarcharType):
        return StringType()
    return dt


def arrow_target(schema: StructType) -> pa.Schema:
    """The Arrow schema Spark requires of every record batch ``read()`` yields for ``schema``."""
    return to_arrow_schema(schema, timezone="UTC")


def metadata_fields(target: pa.Schema) -> list[pa.Field]:
    """The metadata fields to build batches with: the target's where txn_core can build them directly,
    txnlog's own otherwise (a user-given schema may omit or retype them; :func:`conform` then adapts)."""
    names = target.names
    out = []
    for own in METADATA_FIELDS:
        wanted = target.field(own.name) if names.count(own.name) == 1 else own
        out.append(wanted if buildable_metadata_field(wanted) else own)
    return out


class SourceValueError(TxnLogError, ValueError):
    """A stored value Spark cannot represent as it is (a timestamp with nanoseconds, one out of Spark's
    range). The message names the topic, partition, offset and column, and the fix."""


@dataclass(frozen=True, slots=True)
class BatchOrigin:
    """Where a task's batches come from, for errors: the topic and partition, and whether values below
    Spark's microseconds are truncated (``timestampPrecision=truncate``) rather than refused."""

    topic: str
    partition: int
    truncate: bool = False


def conform(batch: pa.RecordBatch, target: pa.Schema, origin: BatchOrigin | None = None) -> pa.RecordBatch:
    """``batch`` with exactly ``target``'s columns, order and types (zero-copy where types match).

    A temporal column is converted exactly (Arrow's safe cast) or not at all: a value the cast would change
    raises :class:`SourceValueError` naming its offset (the batch's ``_offset`` column), unless ``origin``
    truncates. Columns of ``batch`` that ``target`` lacks (the metadata, read only to name offsets) are dropped.
    """
    if batch.schema.equals(target):
        return batch
    n = batch.num_rows
    names = batch.schema.names
    arrays = []
    for f in target:
        if f.name in names:
            col = batch.column(names.index(f.name))
            arrays.append(col if col.type == f.type else _converted(batch, f, col, origin))
        else:
            arrays.append(pa.nulls(n, f.type))
    return pa.RecordBatch.from_arrays(arrays, schema=target)


def _converted(batch: pa.RecordBatch, field: pa.Field, col: pa.Array, origin: BatchOrigin | None) -> pa.Array:
    """``col`` as ``field``'s type, exactly; truncated below microseconds when ``origin`` says so."""
    try:
        return col.cast(field.type)
    except pa.ArrowInvalid as exc:
        found = first_inexact(col, field.type)
        if origin is None or found is None:
            raise
        if found.below_unit and origin.truncate:
            return cast_truncating(col, field.type)
        raise SourceValueError(_value_message(batch, field.name, found, origin)) from exc


def _value_message(batch: pa.RecordBatch, column: str, found: Inexact, origin: BatchOrigin) -> str:
    offsets = batch.column("_offset") if "_offset" in batch.schema.names else None
    at = f"offset {offsets[found.row].as_py()}" if offsets is not None else f"row {found.row} of a batch"
    where = f"topic {origin.topic!r} partition {origin.partition} {at}, column {column + found.path!r}"
    if found.below_unit:
        fix = (
            "Read with .option('timestampPrecision', 'truncate') to drop the part Spark cannot hold (toward "
            "zero), or have the producer write Spark's unit (microseconds; whole days for dates)"
        )
    else:
        fix = (
            "Spark cannot hold this value; have the producer write values within Spark's range, or skip past "
            "the offset with startingOffsets"
        )
    return f"{where}: the value {found.value} {found.reason} (Spark's type). {fix}."
