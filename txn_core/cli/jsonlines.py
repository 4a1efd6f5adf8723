"""JSON lines read as a topic types its columns: the inverse of what ``txnlog dump --json`` writes.

JSON has no bytes, dates, times, durations, decimals or maps. ``dump --json`` writes them as
:func:`txn_core.cli.output.to_jsonable` does (bytes as base64, dates and times as ISO-8601, durations as
seconds, decimals as strings, a map as a list of ``[key, value]`` pairs), and ``produce`` reads them back
the same way, so a dump produced again holds the same values: nanoseconds included (a duration JSON's
numbers cannot hold exactly is written as a decimal string). A map may also be given as a JSON object.

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
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import pyarrow as pa

from txn_core.errors import ConfigurationError
from txn_core.format.ids import is_int


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
    # Nested types: pyarrow's reader infers what they hold (a list<int32> read as list<int64>, a struct's
    # int16 field as int64), which the topic then refuses.
    return bool(
        pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t) or pa.types.is_struct(t)
    )


#: Units per second of Arrow's time units.
_PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}
#: The spellings dump writes for floats JSON cannot hold.
_SPECIAL_FLOATS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def value(v: Any, t: pa.DataType, where: str) -> Any:
    """The Python value pyarrow builds a ``t`` from, for the JSON value ``v`` (``where`` names it in errors).
    Strict: a value that would be changed to fit (a fraction in an integer or finer than the column's unit,
    an unknown field of a struct, an offset on a time) is refused, as pyarrow's reader refuses it."""
    if v is None:
        return None
    try:
        return _value(v, t)
    except (ValueError, TypeError, OverflowError, binascii.Error, decimal.InvalidOperation) as exc:
        raise ConfigurationError(f"{where}: {json.dumps(v)[:80]} is not a {t} value ({exc})") from exc


def _value(v: Any, t: pa.DataType) -> Any:
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        raw = base64.b64decode(_text(v, "base64"), validate=True)
        if pa.types.is_fixed_size_binary(t) and len(raw) != t.byte_width:
            raise ValueError(f"{len(raw)} bytes, the column holds {t.byte_width}")
        return raw
    if pa.types.is_boolean(t):
        if not isinstance(v, bool):
            raise ValueError("expected true or false")
        return v
    if pa.types.is_integer(t):
        if not is_int(v):
            raise ValueError("expected an integer")
        return v
    if pa.types.is_floating(t):
        if isinstance(v, str) and v in _SPECIAL_FLOATS:
            return _SPECIAL_FLOATS[v]
        return float(_number(v, "a number"))
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return _text(v, "text")
    if pa.types.is_date(t):
        return dt.date.fromisoformat(_text(v, "an ISO-8601 date"))
    if pa.types.is_timestamp(t):
        whole, nanos = _split_fraction(_text(v, "an ISO-8601 time"))
        stamp = dt.datetime.fromisoformat(whole)
        if t.tz is None:
            if stamp.tzinfo is not None:
                raise ValueError("it has an offset; the column has no time zone")
            since = stamp - _EPOCH
        else:
            since = (stamp if stamp.tzinfo else stamp.replace(tzinfo=dt.UTC)) - _EPOCH.replace(tzinfo=dt.UTC)
        return _count(since // dt.timedelta(seconds=1), nanos, t.unit)  # pyarrow takes the unit's count
    if pa.types.is_time(t):
        whole, nanos = _split_fraction(_text(v, "an ISO-8601 time"))
        clock = dt.time.fromisoformat(whole)
        if clock.tzinfo is not None:
            raise ValueError("a time of day in the column has no offset")
        return _count(clock.hour * 3600 + clock.minute * 60 + clock.second, nanos, t.unit)
    if pa.types.is_duration(t):
        seconds = decimal.Decimal(v) if isinstance(v, str) else decimal.Decimal(repr(_number(v, "seconds")))
        count = seconds * _PER_SECOND[t.unit]
        if count != count.to_integral_value():
            raise ValueError(f"finer than the column's unit ({t.unit})")
        return int(count)  # in the column's unit: pyarrow takes integers as they are
    if pa.types.is_decimal(t):
        return decimal.Decimal(_text(v, "a decimal string") if isinstance(v, str) else repr(_number(v, "a number")))
    if pa.types.is_map(t):
        if isinstance(v, dict):
            pairs = list(v.items())
        elif isinstance(v, list) and all(isinstance(pair, list) and len(pair) == 2 for pair in v):
            pairs = v
        else:
            raise ValueError("expected an object or a list of [key, value] pairs")
        return [(_value(k, t.key_type), None if x is None else _value(x, t.item_type)) for k, x in pairs]
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        if not isinstance(v, list):
            raise ValueError("expected a list")
        return [None if x is None else _value(x, t.value_type) for x in v]
    if pa.types.is_struct(t):
        if not isinstance(v, dict):
            raise ValueError("expected an object")
        names = {f.name for f in t}
        unknown = sorted(set(v) - names)
        if unknown:
            raise ValueError(f"field(s) {', '.join(unknown)} are not in the column's type")
        return {f.name: None if v.get(f.name) is None else _value(v[f.name], f.type) for f in t}
    return v


#: Where timestamps count from.
_EPOCH = dt.datetime(1970, 1, 1)
#: An ISO-8601 time's fraction of a second, and what follows it (an offset, or nothing).
_FRACTION = re.compile(r"(\d{2}:\d{2}:\d{2})\.(\d+)(.*)$")


def _split_fraction(text: str) -> tuple[str, int]:
    """``text`` without its fraction of a second, and that fraction in nanoseconds (exactly: Python's own
    parser keeps microseconds and drops the digits after them). More than nine digits are refused."""
    m = _FRACTION.search(text)
    if m is None:
        return text, 0
    digits = m.group(2)
    if len(digits) > 9 and int(digits[9:]):
        raise ValueError("finer than nanoseconds")
    return text[: m.start()] + m.group(1) + m.group(3), int(digits[:9].ljust(9, "0"))


def _count(seconds: int, nanos: int, unit: str) -> int:
    """``seconds`` and ``nanos`` as a count of ``unit``, or ValueError when the fraction is finer than it."""
    per = _PER_SECOND[unit]
    step = 1_000_000_000 // per
    if nanos % step:
        raise ValueError(f"finer than the column's unit ({unit})")
    return seconds * per + nanos // step


def _text(v: Any, what: str) -> str:
    if not isinstance(v, str):
        raise ValueError(f"expected a string ({what})")
    return v


def _number(v: Any, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ValueError(f"expected a number ({what})")
    return v


def read(
    file: Path, schema: pa.Schema, flat: Callable[[IO[bytes], list[str]], pa.Table], *, every: bool = False
) -> pa.Table:
    """The rows of a JSON-lines ``file``: the topic's columns that :func:`needs_conversion` converted here by
    their types (see module doc), or with ``every`` all of them (pyarrow's reader refused the file: a value
    it cannot parse, such as a float spelt ``"NaN"`` or a time finer than its unit, is then read here, or
    named with its line), every other column by ``flat`` (pyarrow's reader, as without them: given the
    lines re-encoded without those columns, and the topic columns the first line has). Only columns some
    line has are returned, in the order they first appear."""
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
    convert = {f.name: f.type for f in schema if (every or needs_conversion(f.type)) and f.name in names}
    rest = [{k: v for k, v in row.items() if k not in convert} for _, row in rows]
    others = None
    if any(rest):
        others = flat(io.BytesIO(b"\n".join(json.dumps(r).encode() for r in rest)), list(rest[0]))
    columns = {}
    for name in names:
        t = convert.get(name)
        if t is None:
            assert others is not None
            columns[name] = others.column(name)
        else:
            converted = [value(row.get(name), t, f"{file}: line {n}, column {name!r}") for n, row in rows]
            try:
                columns[name] = pa.array(converted, type=t)
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
                raise ConfigurationError(f"{file}: column {name!r}: a value does not fit {t}: {exc}") from exc
    return pa.table(columns)
