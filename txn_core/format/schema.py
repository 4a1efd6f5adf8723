"""Conforming producer input to a topic's Arrow schema (PROTOCOL.md "Schemas").

Accepted input: ``pyarrow.RecordBatch``, ``pyarrow.Table`` or a list of dicts. Columns are matched by
name and reordered to the topic's order. A type may differ only by a lossless widening (``string`` ->
``large_string`` and back, ``int32`` -> ``int64``, ``float32`` -> ``float64``, ...), also inside structs,
lists and maps (children matched by name and position). Anything else raises
:class:`SchemaMismatchError` listing every difference, before any byte is written.
"""

from __future__ import annotations

import numbers
from typing import Any

import pyarrow as pa

from txn_core.errors import SchemaMismatchError
from txn_core.format.temporal import first_inexact, unit_name

_STRINGS = (pa.types.is_string, pa.types.is_large_string, pa.types.is_string_view)
_BINARIES = (pa.types.is_binary, pa.types.is_large_binary, pa.types.is_binary_view)


def _family(t: pa.DataType, preds: tuple[Any, ...]) -> bool:
    return any(p(t) for p in preds)


def castable(source: pa.DataType, target: pa.DataType) -> bool:
    """Whether ``source`` converts to ``target`` without loss (a widening, or string <-> large_string)."""
    if source == target:
        return True
    if _family(source, _STRINGS) and _family(target, _STRINGS):
        return True
    if _family(source, _BINARIES) and _family(target, _BINARIES):
        return True
    if pa.types.is_integer(source) and pa.types.is_integer(target):
        if pa.types.is_signed_integer(source) == pa.types.is_signed_integer(target):
            return bool(target.bit_width >= source.bit_width)
        return pa.types.is_unsigned_integer(source) and bool(target.bit_width > source.bit_width)
    if pa.types.is_floating(source) and pa.types.is_floating(target):
        return bool(target.bit_width >= source.bit_width)
    if pa.types.is_null(source):
        return True
    if pa.types.is_dictionary(source):
        return castable(source.value_type, target)
    if pa.types.is_timestamp(source) and pa.types.is_timestamp(target):
        return source.tz == target.tz or (source.tz in (None, "UTC") and target.tz in (None, "UTC"))
    if pa.types.is_duration(source) and pa.types.is_duration(target):
        return True  # another unit: the safe cast refuses a value it would change
    if pa.types.is_date32(source) and pa.types.is_date64(target):
        return True
    return _nested_castable(source, target)


def _nested_castable(source: pa.DataType, target: pa.DataType) -> bool:
    """Struct, list and map types convert when their children do (same field names, in order).

    A child that may hold nulls does not fit a child declared non-nullable: the nulls could not be checked
    column by column as top-level ones are.
    """
    if pa.types.is_struct(source) and pa.types.is_struct(target):
        if source.num_fields != target.num_fields:
            return False
        pairs = [(source.field(i), target.field(i)) for i in range(source.num_fields)]
        return all(s.name == t.name and _child_fits(s, t) for s, t in pairs)
    if _is_list(source) and _is_list(target):
        if pa.types.is_fixed_size_list(target) and not (
            pa.types.is_fixed_size_list(source) and source.list_size == target.list_size
        ):
            return False
        return _child_fits(source.value_field, target.value_field)
    if pa.types.is_map(source) and pa.types.is_map(target):
        return castable(source.key_type, target.key_type) and _child_fits(source.item_field, target.item_field)
    return False


def _is_list(t: pa.DataType) -> bool:
    return bool(pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t))


def _child_fits(source: pa.Field, target: pa.Field) -> bool:
    return (target.nullable or not source.nullable) and castable(source.type, target.type)


def conform(data: object, schema: pa.Schema, *, topic: str, ignore: tuple[str, ...] = ()) -> pa.Table:
    """``data`` as a table with exactly ``schema`` (see module doc). Columns named in ``ignore`` are dropped."""
    if isinstance(data, list):
        table = _from_dicts(data, schema, topic)
    elif isinstance(data, pa.RecordBatch):
        table = pa.Table.from_batches([data])
    elif isinstance(data, pa.Table):
        table = data
    else:
        raise SchemaMismatchError(
            f"cannot send a {type(data).__name__} to topic {topic!r}: pass a pyarrow.RecordBatch, a "
            "pyarrow.Table or a list of dicts"
        )
    if ignore:
        table = table.drop_columns([c for c in ignore if c in table.column_names])
    return _conform_table(table, schema, topic)


def _from_dicts(rows: list[Any], schema: pa.Schema, topic: str) -> pa.Table:
    names = set(schema.names)
    extra: set[str] = set()
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise SchemaMismatchError(f"row {i} sent to topic {topic!r} is a {type(row).__name__}, not a dict")
        extra.update(k for k in row if k not in names)
    if extra:
        diffs = tuple(f"column {c!r} is not in the topic schema" for c in sorted(extra))
        raise SchemaMismatchError(_message(topic, schema, diffs), diffs)
    _refuse_truncated_floats(rows, schema, topic)
    try:
        return pa.Table.from_pylist(rows, schema=schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as exc:
        diffs = (str(exc),)
        raise SchemaMismatchError(_message(topic, schema, diffs), diffs) from exc


def _refuse_truncated_floats(rows: list[dict[str, Any]], schema: pa.Schema, topic: str) -> None:
    """pyarrow converts a non-integer Python number (a float, a numpy float, a Decimal) into an integer or
    temporal value by truncating it (1.5 -> 1), at any depth of lists, structs and maps, without a word,
    where a float column sent as a table is refused: refuse it here too."""
    exact = [f for f in schema if _holds_exact(f.type)]
    for i, row in enumerate(rows):
        for f in exact:
            bad = _truncated(row.get(f.name), f.type)
            if bad is not None:
                diffs = (
                    f"column {f.name!r} ({f.type}) was given the non-integer {bad!r} in row {i}, which would be "
                    "truncated; send an int (int(value)) or change the column's type",
                )
                raise SchemaMismatchError(_message(topic, schema, diffs), diffs)


def _holds_exact(t: pa.DataType) -> bool:
    """Whether ``t`` is, or holds at any depth, an integer or temporal type."""
    if pa.types.is_integer(t) or pa.types.is_temporal(t):
        return True
    if _is_list(t):
        return _holds_exact(t.value_type)
    if pa.types.is_struct(t):
        return any(_holds_exact(t.field(i).type) for i in range(t.num_fields))
    if pa.types.is_map(t):
        return _holds_exact(t.key_type) or _holds_exact(t.item_type)
    return False


def _truncated(value: object, t: pa.DataType) -> object | None:
    """The first non-integer number in ``value`` where ``t`` wants an integer or temporal value, else None."""
    if value is None:
        return None
    if pa.types.is_integer(t) or pa.types.is_temporal(t):
        if isinstance(value, numbers.Number) and not isinstance(value, numbers.Integral):
            return value
        return None
    items: list[tuple[object, pa.DataType]] = []
    if _is_list(t) and isinstance(value, list | tuple):
        items = [(v, t.value_type) for v in value]
    elif pa.types.is_struct(t) and isinstance(value, dict):
        items = [(value.get(t.field(i).name), t.field(i).type) for i in range(t.num_fields)]
    elif pa.types.is_map(t):
        pairs = value.items() if isinstance(value, dict) else value if isinstance(value, list | tuple) else []
        for pair in pairs:
            if isinstance(pair, tuple | list) and len(pair) == 2:
                items += [(pair[0], t.key_type), (pair[1], t.item_type)]
    for v, vt in items:
        bad = _truncated(v, vt)
        if bad is not None:
            return bad
    return None


def _conform_table(table: pa.Table, schema: pa.Schema, topic: str) -> pa.Table:
    diffs: list[str] = []
    given = {f.name: f for f in table.schema}
    for f in schema:
        g = given.get(f.name)
        if g is None:
            diffs.append(f"column {f.name!r} ({f.type}) is missing")
        elif not castable(g.type, f.type):
            diffs.append(f"column {f.name!r} has type {g.type}, the topic expects {f.type}")
        elif not f.nullable and table.column(f.name).null_count:
            diffs.append(f"column {f.name!r} has {table.column(f.name).null_count} nulls but is not nullable")
    for name in given:
        if name not in schema.names:
            diffs.append(f"column {name!r} is not in the topic schema")
    if diffs:
        raise SchemaMismatchError(_message(topic, schema, tuple(diffs)), tuple(diffs))
    if table.schema.remove_metadata() == schema:
        return table.replace_schema_metadata(None) if table.schema.metadata else table
    columns = []
    for f in schema:
        col = table.column(f.name)
        if col.type != f.type:
            try:
                col = col.cast(f.type, safe=True)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                d = (_cast_failure(f.name, col, f.type, exc),)
                raise SchemaMismatchError(_message(topic, schema, d), d) from exc
        columns.append(col)
    return pa.Table.from_arrays(columns, schema=schema)


def _cast_failure(name: str, col: pa.ChunkedArray, target: pa.DataType, exc: Exception) -> str:
    """What a failed cast of column ``name`` met: for a temporal value (a unit too coarse for it, or out of
    range), the row, the value and the fix; otherwise Arrow's own words."""
    found = first_inexact(col, target)
    if found is None:
        return f"column {name!r}: cannot convert {col.type} to {target}: {exc}"
    fix = (
        f"truncate such values to {unit_name(target)} before sending"
        if found.below_unit
        else "send values within that range"
    )
    return (
        f"column {(name + found.path)!r} in row {found.row}: the value {found.value} {found.reason}; {fix} "
        f"(the topic stores {target})"
    )


def _message(topic: str, schema: pa.Schema, diffs: tuple[str, ...]) -> str:
    listing = "; ".join(diffs)
    expected = ", ".join(f"{f.name}: {f.type}" for f in schema)
    return (
        f"data does not match the schema of topic {topic!r}: {listing}. The topic expects "
        f"({expected}); nothing was written."
    )
