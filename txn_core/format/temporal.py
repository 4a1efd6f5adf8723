"""Exact conversion of temporal values between Arrow units: timestamps, durations and dates.

A tz-aware Arrow timestamp stores UTC instants whatever its zone label, so labels never change a value;
units do. A conversion to a finer unit (``us`` -> ``ns``, ``date32`` -> ``date64``) is exact unless the
value overflows int64; a conversion to a coarser one (``ns`` -> ``us``, ``date64`` -> ``date32``) is exact
only for values without a part below the target's unit. Arrow's safe cast checks both, vectorised, but its
error names neither the row nor the column: :func:`first_inexact` finds the first row a conversion would
change (at any depth of structs, lists and maps), for the error message. It runs only after a safe cast
failed, so the hot path is Arrow's cast alone. :func:`cast_truncating` is the opt-in lossy form: parts
below the target's unit are dropped (toward zero, as Arrow truncates), overflow still fails.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: Nanoseconds per tick of each unit (timestamps and durations), and of each date type.
_NS_PER_UNIT = {"s": 10**9, "ms": 10**6, "us": 10**3, "ns": 1}
_NS_PER_DAY = 86_400 * 10**9
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


@dataclass(frozen=True, slots=True)
class Inexact:
    """The first value a conversion would change: its top-level ``row``, where it sits inside that row's
    value (``path``: ``""`` for the value itself, ``.field``, ``[]`` for a list element, ``.key``/``.value``
    for a map's), the value as Arrow prints it, and why (``reason``). ``below_unit``: the value has a part
    below the target's unit (:func:`cast_truncating` converts it); otherwise it is out of the target's range."""

    row: int
    path: str
    value: str
    reason: str
    below_unit: bool


def ns_per_tick(t: pa.DataType) -> int | None:
    """Nanoseconds per stored integer of a timestamp, duration or date type; None for other types."""
    if pa.types.is_timestamp(t) or pa.types.is_duration(t):
        return _NS_PER_UNIT[t.unit]
    if pa.types.is_date32(t):
        return _NS_PER_DAY
    if pa.types.is_date64(t):
        return _NS_PER_UNIT["ms"]
    return None


def unit_name(t: pa.DataType) -> str:
    """How a message names the unit of ``t`` (``microseconds``, ``days``...)."""
    if pa.types.is_date32(t):
        return "days"
    names = {"s": "seconds", "ms": "milliseconds", "us": "microseconds", "ns": "nanoseconds"}
    return names["ms" if pa.types.is_date64(t) else t.unit]


def cast_truncating(array: pa.Array | pa.ChunkedArray, target: pa.DataType) -> pa.Array | pa.ChunkedArray:
    """``array`` cast to ``target``, dropping parts below the target's unit (toward zero) at any depth;
    out-of-range values still raise ``pyarrow.ArrowInvalid``."""
    return pc.cast(array, options=pc.CastOptions(target, allow_time_truncate=True))


def first_inexact(array: pa.Array | pa.ChunkedArray, target: pa.DataType) -> Inexact | None:
    """The first row of ``array`` whose conversion to ``target`` would lose or overflow a temporal value, at
    any depth (children of structs, lists and maps are matched by position); None when every value converts
    exactly. Vectorised per leaf: one modulo or range comparison over the leaf's integers."""
    if isinstance(array, pa.ChunkedArray):
        start = 0
        for chunk in array.chunks:
            found = first_inexact(chunk, target)
            if found is not None:
                return Inexact(start + found.row, found.path, found.value, found.reason, found.below_unit)
            start += len(chunk)
        return None
    return _first(array, target)


def _first(arr: pa.Array, target: pa.DataType) -> Inexact | None:
    source = arr.type
    if pa.types.is_struct(source) and pa.types.is_struct(target):
        children = arr.flatten()  # sliced, with the struct's own nulls merged in
        found = [
            _within(_first(children[i], target.field(i).type), f".{source.field(i).name}")
            for i in range(min(source.num_fields, target.num_fields))
        ]
        return _earliest(found)
    if _is_listlike(source) and _is_listlike(target):
        return _first_in_list(arr, target)
    return _first_leaf(arr, target)


def _is_listlike(t: pa.DataType) -> bool:
    return bool(
        pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t) or pa.types.is_map(t)
    )


def _first_in_list(arr: pa.Array, target: pa.DataType) -> Inexact | None:
    """Lists and maps: the values are checked in one go and mapped back to their rows."""
    n = len(arr)
    if pa.types.is_fixed_size_list(arr.type):
        values = arr.flatten()
        parents = np.repeat(np.arange(n), arr.type.list_size)
    else:
        offsets = arr.offsets.to_numpy()
        values = arr.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
        parents = np.repeat(np.arange(n), np.diff(offsets))
    if pa.types.is_map(arr.type):
        entries = values.flatten()  # keys, items
        tkey = target.key_type if pa.types.is_map(target) else None
        titem = target.item_type if pa.types.is_map(target) else target.value_type.field(1).type
        found = [
            _within(_first(entries[0], tkey or target.value_type.field(0).type), ".key"),
            _within(_first(entries[1], titem), ".value"),
        ]
        inner = _earliest(found)
    else:
        inner = _first(values, target.value_type)
        inner = _within(inner, "[]")
    if inner is None:
        return None
    return Inexact(int(parents[inner.row]), inner.path, inner.value, inner.reason, inner.below_unit)


def _within(found: Inexact | None, step: str) -> Inexact | None:
    return None if found is None else Inexact(found.row, step + found.path, found.value, found.reason, found.below_unit)


def _earliest(found: list[Inexact | None]) -> Inexact | None:
    present = [f for f in found if f is not None]
    return min(present, key=lambda f: f.row) if present else None


def _first_leaf(arr: pa.Array, target: pa.DataType) -> Inexact | None:
    have, want = ns_per_tick(arr.type), ns_per_tick(target)
    if have is None or want is None or have == want:
        return None
    ints = pc.cast(arr.view(pa.int32() if pa.types.is_date32(arr.type) else pa.int64()), pa.int64())
    if have > want:  # to a finer unit: exact unless the product overflows
        factor = have // want
        low, high = -(_INT64_MIN // -factor), _INT64_MAX // factor
        bad = pc.or_(pc.less(ints, low), pc.greater(ints, high))
        reason = f"is out of the range {target} can hold"
    else:  # to a coarser unit: exact only without a part below it
        bad = pc.not_equal(pc.modulo(ints, want // have), 0)
        reason = f"has a part below {unit_name(target)}, which {target} cannot hold"
    index = pc.index(pc.fill_null(bad, False), True).as_py()
    if index < 0:
        return None
    return Inexact(index, "", _shown(arr, ints[index].as_py(), have > want), reason, below_unit=have < want)


def _shown(arr: pa.Array, raw: int, out_of_range: bool) -> str:
    """A timestamp as Arrow prints it (exact in every unit; ``Z`` marks a UTC instant); other values, and
    timestamps Arrow cannot print, as their integer and unit (a date64 prints as a day, hiding the rest)."""
    if pa.types.is_timestamp(arr.type) and not out_of_range:
        return str(pa.array([raw], pa.int64()).view(arr.type).to_string(indent=0, window=1)).strip().strip("[]").strip()
    return (
        f"{raw} {unit_name(arr.type)} since the epoch"
        if not pa.types.is_duration(arr.type)
        else f"{raw} {unit_name(arr.type)}"
    )
