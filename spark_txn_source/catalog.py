"""Catalog tables (``CREATE TABLE ... USING txnlog``) over PySpark's Python data source API: read-only.

What PySpark 4.3 hands a Python data source for a table in the session catalog:

* at ``CREATE TABLE`` (without a column list), ``schema()`` gets the table's options plus catalog
  properties: ``location`` and ``path`` (the ``LOCATION`` or ``OPTIONS (path ...)``, as a ``file:/...`` URL
  for local paths), ``provider``, ``owner``, and every user option twice (``topic`` and ``option.topic``);
* when the table is later read (``SELECT``, ``spark.table``, ``readStream.table``) or written (``INSERT
  INTO``, ``insertInto``, ``writeTo().append()``, ``writeStream.toTable``), the reader and writer get **no
  options at all**, only a schema.

A reader's schema is the table's stored schema, so a table keeps what it needs there: :func:`embed` puts the
table's read options in the metadata of the schema's first field when the table is created, and
:func:`recover` takes them back when the source is opened without options. Storage options (``storage.*``,
which may hold credentials) are never embedded; a catalog table on an object store takes its credentials
from the environment (or use a temporary view, whose options Spark keeps in memory: ``CREATE TEMPORARY VIEW
v USING txnlog OPTIONS (...)``).

A writer's schema is not the table's: it is the schema of the rows written, and Spark passes a query's
columns through unchanged when their names and types match the table's. Rows read from another txnlog table
then carry *that* table's options (``INSERT INTO b SELECT * FROM a`` would append to ``a``), rows from
anywhere else carry none. A writer cannot tell which table it writes to, so writers never take options from
a schema (:func:`for_writing`): catalog tables are read-only, and SQL writes go through a temporary view.

A table the catalog creates from a query (``df.write.saveAsTable(name)`` when ``name`` does not exist yet,
``df.writeTo(name).create()``, ``CREATE TABLE ... AS SELECT``) is stored without txnlog's options (Spark
calls no ``schema()`` for it) and could never be read; those writes are refused before anything is staged
(:func:`creates_table`), and Spark drops the half-made table.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from txn_core.errors import ConfigurationError

#: Field-metadata key of the first field of a catalog table's schema.
METADATA_KEY = "txnlog.table"
#: Properties Spark adds to a catalog table's options; not options of txnlog's.
CATALOG_PROPERTIES = ("provider", "owner", "location")
_OPTION_COPY = "option."


def is_catalog_create(options: Mapping[str, str]) -> bool:
    """Whether ``options`` come from ``CREATE TABLE`` / ``saveAsTable`` (they carry catalog properties)."""
    keys = {k.lower() for k in options}
    return "provider" in keys and ("location" in keys or "owner" in keys)


def normalise(options: Mapping[str, str]) -> dict[str, str]:
    """``options`` without the catalog's own properties and duplicated ``option.<name>`` keys; a table's
    ``LOCATION`` becomes its ``path``."""
    out: dict[str, str] = {}
    for key, value in options.items():
        low = key.lower()
        if low in CATALOG_PROPERTIES or low.startswith(_OPTION_COPY):
            continue
        out[key] = value
    if not any(k.lower() == "path" for k in out):
        location = next((v for k, v in options.items() if k.lower() == "location"), None)
        if location:
            out["path"] = location
    return out


def creates_table(local_property: Callable[[str], str | None]) -> bool:
    """Whether a batch write task (``local_property`` is its ``TaskContext.getLocalProperty``) writes the
    rows of a table the catalog is creating from the query (``saveAsTable``, ``writeTo().create()``,
    ``CREATE TABLE ... AS SELECT``).

    Spark runs such a write as a SQL execution nested in the command's own (its execution id differs from
    the root execution id), while ``save()``, ``INSERT INTO``, ``insertInto`` and ``writeTo().append()``
    write in the root execution. The one other nested batch write is ``df.write`` inside
    ``foreachBatch``, whose tasks carry the streaming query's id.
    """
    execution = local_property("spark.sql.execution.id")
    root = local_property("spark.sql.execution.root.id")
    streaming = local_property("sql.streaming.queryId")
    return execution is not None and root is not None and execution != root and streaming is None


#: Why a write creating a catalog table from a query is refused.
TABLE_CREATION_REFUSED = (
    "a txnlog table cannot be created from a query (df.write.saveAsTable on a new table, "
    "df.writeTo(name).create(), CREATE TABLE ... AS SELECT): PySpark's Python data source API (4.3) stores "
    "such a table without txnlog's options, so it could be neither read nor written afterwards. Nothing was "
    "written. Write with df.write.format('txnlog').option('topic', 'T').mode('append').save('URL') (with SQL: "
    "CREATE TEMPORARY VIEW v USING txnlog OPTIONS (path 'URL', topic 'T'), then INSERT INTO v), and make a "
    "table to read it with CREATE TABLE name USING txnlog OPTIONS (path 'URL', topic 'T')"
)
#: Why a write that names no log and carries a catalog table's options in its schema is refused.
TABLE_WRITE_REFUSED = (
    "this txnlog write names no log (a write into a catalog table, or a CREATE TABLE ... AS SELECT of rows "
    "read from one), and txnlog tables are read-only to Spark: PySpark's Python data source "
    "API (4.3) tells a sink writing to a catalog table nothing about the table (no options; the rows' schema "
    "may carry the options of the table they were read from, and INSERT INTO b SELECT * FROM a would append to "
    "a). Nothing was written. Write through a temporary view, which hands the sink its options: CREATE "
    "TEMPORARY VIEW v USING txnlog OPTIONS (path 'URL', topic 'T'), then INSERT INTO v ...; or "
    "df.write.format('txnlog').option('topic', 'T').mode('append').save('URL') (streams: "
    "writeStream.format('txnlog').option('topic', 'T').start('URL'))"
)


def for_writing(options: Mapping[str, str], schema: Any) -> tuple[dict[str, str], Any]:
    """A writer's options and schema: ``options`` as given (never the options a schema carries, see the
    module doc) and ``schema`` without them. Raises :class:`~txn_core.errors.ConfigurationError` when the
    options name no log but the schema carries a table's options: a write to a catalog table, or of rows
    read from one."""
    given = normalise(options)
    if not any(k.lower() == "path" for k in given) and stored_options(schema) is not None:
        raise ConfigurationError(TABLE_WRITE_REFUSED)
    return given, strip(schema)


def embed(schema: Any, options: Mapping[str, str]) -> Any:
    """``schema`` (a Spark StructType) with the table's options (but ``storage.*``) in its first field's
    metadata."""
    from pyspark.sql.types import StructField, StructType

    kept = {k.lower(): v for k, v in normalise(options).items() if not k.lower().startswith("storage.")}
    fields = list(schema.fields)
    first = fields[0]
    meta = dict(first.metadata or {})
    meta[METADATA_KEY] = json.dumps(kept, sort_keys=True)
    fields[0] = StructField(first.name, first.dataType, first.nullable, meta)
    return StructType(fields)


def recover(options: Mapping[str, str], schema: Any) -> dict[str, str]:
    """The options to use: ``options`` as given, or, when they name no log (a catalog table read or
    written), the options :func:`embed` stored in ``schema``, overridden by any given ones."""
    given = normalise(options)
    if any(k.lower() == "path" for k in given):
        return given
    stored = stored_options(schema)
    if stored is None:
        return given
    merged = dict(stored)
    merged.update({k.lower(): v for k, v in given.items()})
    return merged


def reads_table(options: Mapping[str, str], schema: Any) -> bool:
    """Whether a reader opened with ``options`` and ``schema`` reads a catalog table: the options name no log
    and the schema carries a table's options (:func:`recover` takes them from it). ``schema`` is then the
    table's stored schema, which ``ALTER TABLE`` may have changed."""
    given = normalise(options)
    return not any(k.lower() == "path" for k in given) and stored_options(schema) is not None


def stored_options(schema: Any) -> dict[str, str] | None:
    """The options a catalog table's schema carries, or None."""
    fields = getattr(schema, "fields", None) or []
    if not fields:
        return None
    raw = (fields[0].metadata or {}).get(METADATA_KEY)
    if not raw:
        return None
    value = json.loads(raw)
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else None


def strip(schema: Any) -> Any:
    """``schema`` without the embedded options (what the frame's columns really are)."""
    from pyspark.sql.types import StructField, StructType

    fields = list(getattr(schema, "fields", None) or [])
    if not fields or METADATA_KEY not in (fields[0].metadata or {}):
        return schema
    first = fields[0]
    meta = {k: v for k, v in first.metadata.items() if k != METADATA_KEY}
    fields[0] = StructField(first.name, first.dataType, first.nullable, meta)
    return StructType(fields)
