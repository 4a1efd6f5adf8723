"""Compact schema specs for the command line: ``"id:int64,name:string,ts:timestamp[ms]"``.

Grammar (spaces around tokens are ignored)::

    spec   := field ("," field)*
    field  := NAME ":" type [" not null"]
    type   := SIMPLE                                  int8..int64, uint8..uint64, float16/32/64, float,
                                                      double, bool, string, large_string, binary,
                                                      large_binary, date32, date64
            | UNIT_TYPE "[" unit "]"                  timestamp, time32, time64, duration
            | "timestamp[" unit "," [tz=]ZONE "]"     e.g. timestamp[ms, UTC]
            | ("decimal" | "decimal128") "(" P "," S ")"
            | ("list" | "large_list") "<" type ">"
            | "map<" type "," type ">"
            | "struct<" field ("," field)* ">"

:func:`format_schema` writes a schema back in this form, so ``topics describe`` output can be pasted into
``topics create``.
"""

from __future__ import annotations

import re

import pyarrow as pa

_SIMPLE: dict[str, pa.DataType] = {
    "int8": pa.int8(),
    "int16": pa.int16(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "uint8": pa.uint8(),
    "uint16": pa.uint16(),
    "uint32": pa.uint32(),
    "uint64": pa.uint64(),
    "float16": pa.float16(),
    "halffloat": pa.float16(),
    "float32": pa.float32(),
    "float": pa.float32(),
    "float64": pa.float64(),
    "double": pa.float64(),
    "bool": pa.bool_(),
    "boolean": pa.bool_(),
    "string": pa.string(),
    "str": pa.string(),
    "utf8": pa.string(),
    "large_string": pa.large_string(),
    "large_utf8": pa.large_string(),
    "binary": pa.binary(),
    "large_binary": pa.large_binary(),
    "date32": pa.date32(),
    "date32[day]": pa.date32(),
    "date64": pa.date64(),
    "date64[ms]": pa.date64(),
}
_UNITS = ("s", "ms", "us", "ns")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")
TYPES_HELP = (
    "int8..int64, uint8..uint64, float32, float64, bool, string, large_string, binary, date32, "
    "timestamp[s|ms|us|ns] or timestamp[ms, UTC], time64[us], duration[ms], decimal(P, S), "
    "list<TYPE>, map<KEY, VALUE>, struct<NAME:TYPE, ...>"
)
EXAMPLE = "id:int64,name:string,ts:timestamp[ms]"


class SchemaSpecError(ValueError):
    """A schema spec that does not parse; the message says where and how to write it."""


def split_top_level(text: str, sep: str = ",") -> list[str]:
    """Split on ``sep`` outside brackets (``[]``, ``()``, ``<>``)."""
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for ch in text:
        if ch in "[(<":
            depth += 1
        elif ch in "])>":
            depth -= 1
            if depth < 0:
                raise SchemaSpecError(f"unbalanced {ch!r} in {text!r}")
        if ch == sep and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    if depth != 0:
        raise SchemaSpecError(f"unclosed bracket in {text!r}")
    parts.append("".join(current))
    return parts


def parse_type(text: str) -> pa.DataType:
    """One type expression (see module doc)."""
    t = text.strip()
    low = t.lower()
    if low in _SIMPLE:
        return _SIMPLE[low]
    m = re.fullmatch(
        r"(timestamp|time32|time64|duration)\s*\[\s*([a-z]+)\s*(?:,\s*(?:tz\s*=\s*)?([^\]]+?)\s*)?\]",
        t,
        flags=re.IGNORECASE,
    )
    if m:
        kind, unit, tz = m.group(1).lower(), m.group(2).lower(), m.group(3)
        if unit not in _UNITS:
            raise SchemaSpecError(f"unknown time unit {unit!r} in {t!r}: use one of {', '.join(_UNITS)}")
        if tz is not None and kind != "timestamp":
            raise SchemaSpecError(f"{kind} takes no time zone: {t!r}")
        try:
            if kind == "timestamp":
                return pa.timestamp(unit, tz=tz)
            if kind == "time32":
                return pa.time32(unit)
            if kind == "time64":
                return pa.time64(unit)
            return pa.duration(unit)
        except (ValueError, pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise SchemaSpecError(f"bad type {t!r}: {exc}") from exc
    if low in ("timestamp", "time32", "time64", "duration"):
        raise SchemaSpecError(f"{t!r} needs a unit, e.g. {low}[ms]")
    m = re.fullmatch(r"(decimal|decimal128|decimal256)\s*\(\s*(\d+)\s*,\s*(-?\d+)\s*\)", t, flags=re.IGNORECASE)
    if m:
        precision, scale = int(m.group(2)), int(m.group(3))
        try:
            return (pa.decimal256 if m.group(1).lower() == "decimal256" else pa.decimal128)(precision, scale)
        except (ValueError, pa.ArrowInvalid) as exc:
            raise SchemaSpecError(f"bad type {t!r}: {exc}") from exc
    m = re.fullmatch(r"(list|large_list|map|struct)\s*<(.*)>", t, flags=re.IGNORECASE | re.DOTALL)
    if m:
        kind, inner = m.group(1).lower(), m.group(2)
        if kind == "struct":
            return pa.struct([parse_field(f) for f in split_top_level(inner)])
        if kind == "map":
            kv = split_top_level(inner)
            if len(kv) != 2:
                raise SchemaSpecError(f"map takes a key and a value type, e.g. map<string, int64>: {t!r}")
            return pa.map_(parse_type(kv[0]), parse_type(kv[1]))
        item = inner.split(":", 1)[1] if re.match(r"^\s*item\s*:", inner) else inner  # list<item: int64>
        return (pa.list_ if kind == "list" else pa.large_list)(parse_type(item))
    raise SchemaSpecError(f"unknown type {t!r}; known types: {TYPES_HELP}")


def parse_field(text: str) -> pa.Field:
    """``NAME:TYPE`` with an optional ``not null`` suffix."""
    body = text.strip()
    if not body:
        raise SchemaSpecError("empty column (two commas in a row, or a trailing comma?)")
    name, sep, rest = body.partition(":")
    if not sep:
        raise SchemaSpecError(f"column {body!r} has no type: write NAME:TYPE, e.g. {body}:int64")
    name = name.strip()
    if not _NAME.match(name):
        raise SchemaSpecError(f"bad column name {name!r}: use letters, digits, '_', '.' or '-'")
    rest = rest.strip()
    nullable = True
    m = re.fullmatch(r"(.*?)\s+not\s+null", rest, flags=re.IGNORECASE | re.DOTALL)
    if m:
        rest, nullable = m.group(1), False
    try:
        return pa.field(name, parse_type(rest), nullable=nullable)
    except SchemaSpecError as exc:
        raise SchemaSpecError(f"column {name!r}: {exc}") from exc


def parse_schema(spec: str) -> pa.Schema:
    """A schema from a spec such as ``"id:int64,name:string,ts:timestamp[ms]"``.

    Raises :class:`SchemaSpecError` with the offending part, the accepted types and an example.
    """
    if not spec or not spec.strip():
        raise SchemaSpecError(f"the schema is empty; write NAME:TYPE pairs separated by commas, e.g. {EXAMPLE!r}")
    try:
        fields = [parse_field(f) for f in split_top_level(spec)]
    except SchemaSpecError as exc:
        raise SchemaSpecError(f"bad schema {spec!r}: {exc} (example: {EXAMPLE!r})") from exc
    names = [f.name for f in fields]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise SchemaSpecError(f"bad schema {spec!r}: duplicate column(s) {', '.join(dupes)}")
    return pa.schema(fields)


def format_type(t: pa.DataType) -> str:
    """A type in spec form (inverse of :func:`parse_type`)."""
    if pa.types.is_timestamp(t):
        return f"timestamp[{t.unit}, {t.tz}]" if t.tz else f"timestamp[{t.unit}]"
    if pa.types.is_decimal(t):
        return (
            f"decimal({t.precision}, {t.scale})"
            if pa.types.is_decimal128(t)
            else f"decimal256({t.precision}, {t.scale})"
        )
    if pa.types.is_large_list(t):
        return f"large_list<{format_type(t.value_type)}>"
    if pa.types.is_list(t):
        return f"list<{format_type(t.value_type)}>"
    if pa.types.is_map(t):
        return f"map<{format_type(t.key_type)}, {format_type(t.item_type)}>"
    if pa.types.is_struct(t):
        return "struct<" + ",".join(format_field(t.field(i)) for i in range(t.num_fields)) + ">"
    if pa.types.is_date32(t):
        return "date32"
    if pa.types.is_date64(t):
        return "date64"
    if pa.types.is_float32(t):
        return "float32"
    if pa.types.is_float64(t):
        return "float64"
    return str(t)


def format_field(f: pa.Field) -> str:
    return f"{f.name}:{format_type(f.type)}" + ("" if f.nullable else " not null")


def format_schema(schema: pa.Schema) -> str:
    """A schema in spec form, e.g. ``id:int64,name:string``."""
    return ",".join(format_field(f) for f in schema)
