"""JSON lines read as a topic types its columns: the inverse of what ``txnlog dump --json`` writes.

JSON has no bytes, dates, times, durations, decimals or maps. ``dump --json`` writes them as
:func:`txn_core.cli.output.to_jsonable` does (bytes as base64, dates and times as ISO-8601, durations as
seconds, decimals as strings, a map as a list of ``[key, value]`` pairs), and ``produce`` reads them back
the same way, so a dump produced again holds the same values. A map may also be given as a JSON object.

pyarrow's JSON reader parses most flat types itself (fast); :func:`needs_conversion` says when a topic has a
column it cannot fill from those spellings, and :func:`read` then converts every value by its column's
type in Python (a command-line load, not a hot path). Columns the topic does not have are inferred and
left for the schema check to report.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import decimal
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import pyarrow as pa

from txn_core.errors import ConfigurationError


def needs_conversion(t: pa.DataType) -> bool:
    """Whether values of type ``t`` are spelt in JSON in a way pyarrow's reader does not parse into it."""
    if (
        pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_fixed_size_binary(t)
        or pa.types.is_date(t)
        or pa.types.is_time(t)
        or pa.types.is_duration(t)
        or pa.types.is_decimal(t)
        or pa.types.is_map(t)
    ):
        return True
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return True  # element types are inferred otherwise (a list<int32> read as list<int64>)
    if pa.types.is_struct(t):
        return any(needs_conversion(t.field(i).type) for i in range(t.num_fields))
    return False


def value(v: Any, t: pa.DataType, where: str) -> Any:
    """The Python value pyarrow builds a ``t`` from, for the JSON value ``v`` (``where`` names it in errors)."""
    if v is None:
        return None
    try:
        if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
            return base64.b64decode(_text(v, "base64"), validate=True)
        if pa.types.is_date(t):
            return dt.date.fromisoformat(_text(v, "an ISO-8601 date"))
        if pa.types.is_time(t):
            return dt.time.fromisoformat(_text(v, "an ISO-8601 time"))
        if pa.types.is_duration(t):
            return dt.timedelta(seconds=_number(v, "seconds"))
        if pa.types.is_decimal(t):
            return decimal.Decimal(_text(v, "a decimal string") if isinstance(v, str) else str(_number(v, "a number")))
        if pa.types.is_map(t):
            pairs = v.items() if isinstance(v, dict) else v
            return [(value(k, t.key_type, where), value(x, t.item_type, where)) for k, x in pairs]
        if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
            if not isinstance(v, list):
                raise ValueError("expected a list")
            return [value(x, t.value_type, where) for x in v]
        if pa.types.is_struct(t):
            if not isinstance(v, dict):
                raise ValueError("expected an object")
            return {f.name: value(v.get(f.name), f.type, where) for f in t}
    except (ValueError, TypeError, binascii.Error, decimal.InvalidOperation) as exc:
        raise ConfigurationError(f"{where}: {json.dumps(v)[:80]} is not a {t} value ({exc})") from exc
    return v


def _text(v: Any, what: str) -> str:
    if not isinstance(v, str):
        raise ValueError(f"expected a string ({what})")
    return v


def _number(v: Any, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ValueError(f"expected a number ({what})")
    return v


def read(file: Path, schema: pa.Schema, flat: Callable[[IO[bytes], list[str]], pa.Table]) -> pa.Table:
    """The rows of a JSON-lines ``file``: the topic's columns that :func:`needs_conversion` converted here by
    their types (see module doc), every other column by ``flat`` (pyarrow's reader, as without them: given
    the lines re-encoded without those columns, and the topic columns the first line has). Only columns
    some line has are returned, in the order they first appear."""
    rows: list[tuple[int, dict[str, Any]]] = []
    with file.open("rb") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise ConfigurationError(f"{file}: line {n} is not JSON: {exc}") from exc
            if not isinstance(row, dict):
                raise ConfigurationError(f"{file}: line {n} is not a JSON object")
            rows.append((n, row))
    names = list(dict.fromkeys(name for _, row in rows for name in row))
    convert = {f.name: f.type for f in schema if needs_conversion(f.type) and f.name in names}
    rest = [{k: v for k, v in row.items() if k not in convert} for _, row in rows]
    others = None
    if any(rest):
        first = [k for k in rest[0]] if rest else []
        others = flat(io.BytesIO(b"\n".join(json.dumps(r).encode() for r in rest)), first)
    columns = {}
    for name in names:
        t = convert.get(name)
        if t is None:
            assert others is not None
            columns[name] = others.column(name)
        else:
            converted = [value(row.get(name), t, f"{file}: line {n}, column {name!r}") for n, row in rows]
            columns[name] = pa.array(converted, type=t)
    return pa.table(columns)
