"""Spark schema of a txnlog read, and making record batches match it exactly.

The schema is the topics' Arrow schema (unified over several topics) converted to Spark types, plus the
metadata columns ``_topic``, ``_partition``, ``_offset``, ``_timestamp`` unless ``includeMetadata=false``.
Spark accepts a ``pyarrow.RecordBatch`` from ``read()`` only if its schema equals ``to_arrow_schema(schema,
timezone="UTC")`` exactly (names, order, ``string`` not ``large_string``, nullability). The metadata
columns are built in the target's own types (:func:`metadata_fields`: nullable, ``_timestamp`` in
microseconds), so a batch of a topic whose columns Spark represents as they are already equals the target
and is handed over as it is. Any other batch is rebuilt against the target: columns are taken by name
(zero-copy when the type already matches), cast when the topic's type differs, and null-filled when a
topic lacks a column another topic has.
"""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql.pandas.types import from_arrow_type, to_arrow_schema
from pyspark.sql.types import StructField, StructType

from txn_core.errors import ConfigurationError
from txn_core.records import METADATA_FIELDS, buildable_metadata_field


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
            dtype = from_arrow_type(f.type, prefer_timestamp_ntz=True)
        except Exception as exc:
            raise ConfigurationError(
                f"column {f.name!r} has Arrow type {f.type}, which Spark cannot represent ({exc}); "
                "store it as a Spark-compatible type (e.g. int64 instead of uint64)"
            ) from exc
        out.append(StructField(f.name, dtype, nullable=True))
    return StructType(out)


def check_requested(requested: StructType, available: StructType) -> None:
    """A user-given schema may only name columns the read provides."""
    names = set(available.fieldNames())
    missing = [f.name for f in requested.fields if f.name not in names]
    if missing:
        raise ConfigurationError(
            f"the schema given to the txnlog source names column(s) {missing} that the topics do not have; "
            f"available columns: {', '.join(available.fieldNames())}"
        )


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


def conform(batch: pa.RecordBatch, target: pa.Schema) -> pa.RecordBatch:
    """``batch`` with exactly ``target``'s columns, order and types (zero-copy where types match)."""
    if batch.schema.equals(target):
        return batch
    n = batch.num_rows
    names = batch.schema.names
    arrays = []
    for f in target:
        if f.name in names:
            col = batch.column(names.index(f.name))
            arrays.append(col if col.type == f.type else col.cast(f.type))
        else:
            arrays.append(pa.nulls(n, f.type))
    return pa.RecordBatch.from_arrays(arrays, schema=target)
