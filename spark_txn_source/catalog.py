"""Catalog tables (``CREATE TABLE ... USING txnlog``, ``saveAsTable``) over PySpark's Python data source API.

What PySpark 4.3 hands a Python data source for a table in the session catalog:

* at ``CREATE TABLE``, ``schema()`` gets the table's options plus catalog properties: ``location`` and
  ``path`` (the ``LOCATION`` or ``OPTIONS (path ...)``, as a ``file:/...`` URL for local paths),
  ``provider``, ``owner``, and every user option twice (``topic`` and ``option.topic``);
* when the table is later read (``SELECT``, ``spark.table``, ``readStream.table``) or written (``INSERT
  INTO``), the reader and writer get **no options at all**, only the schema the catalog stored.

So a catalog table keeps what it needs in that schema: :func:`embed` puts the table's read options in the
metadata of the schema's first field when the table is created, and :func:`recover` takes them back when
the source is opened without options. Storage options (``storage.*``, which may hold credentials) are
never embedded; a catalog table on an object store takes its credentials from the environment (or use a
temporary view, whose options Spark keeps in memory: ``CREATE TEMPORARY VIEW v USING txnlog OPTIONS
(...)``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

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
