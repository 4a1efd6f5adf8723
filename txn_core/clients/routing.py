"""Routing rows to partitions (PROTOCOL.md "Routing").

By key: ``crc32(key bytes) % partitions`` where key bytes are the UTF-8 of a string, the raw bytes of a
binary, ``0x01``/``0x02`` for true/false, the 8-byte little-endian two's complement of an integer, ``repr``
of other scalars, and ``b"\\x00"`` for null. Stable across processes, machines and versions, so a second
writer (the Spark sink, another language) routes the same key to the same partition. Hashing runs once per
distinct key value (after dictionary encoding), not once per row.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

import numpy as np
import pyarrow as pa

from txn_core.errors import SchemaMismatchError


def key_bytes(value: object) -> bytes:
    if value is None:
        return b"\x00"
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    if isinstance(value, bool):
        return b"\x01" if value else b"\x02"
    if isinstance(value, int):
        return (value & 0xFFFFFFFFFFFFFFFF).to_bytes(8, "little")
    return repr(value).encode()


def partition_for(value: object, partitions: int) -> int:
    return zlib.crc32(key_bytes(value)) % partitions


def per_key(column: pa.ChunkedArray | pa.Array, of_key: Callable[[object], int]) -> np.ndarray:
    """``of_key(value)`` for every row's key value, as an int32 numpy array, computed once per distinct value
    (after dictionary encoding; null is a value too)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if pa.types.is_dictionary(column.type):
        column = column.cast(column.type.value_type)
    encoded = column.dictionary_encode(null_encoding="encode")
    uniques = encoded.dictionary.to_pylist()
    table = np.fromiter((of_key(v) for v in uniques), dtype=np.int32, count=len(uniques))
    indices = encoded.indices.to_numpy(zero_copy_only=False)
    out: np.ndarray = table[indices] if len(table) else np.zeros(len(column), dtype=np.int32)
    return out


def partitions_for_column(column: pa.ChunkedArray | pa.Array, partitions: int) -> np.ndarray:
    """The partition of every row, as an int32 numpy array."""
    return per_key(column, lambda value: partition_for(value, partitions))


def split_by_key(table: pa.Table, key_column: str, partitions: int) -> dict[int, pa.Table]:
    """Rows of ``table`` grouped by the partition of ``key_column``; order within a partition kept."""
    if key_column not in table.column_names:
        raise SchemaMismatchError(
            f"key column {key_column!r} is not a column of the data; columns are {table.column_names}"
        )
    parts = partitions_for_column(table.column(key_column), partitions)
    if len(parts) == 0:
        return {}
    order = np.argsort(parts, kind="stable")
    sorted_parts = parts[order]
    bounds = np.flatnonzero(np.diff(sorted_parts)) + 1
    starts = np.concatenate(([0], bounds))
    ends = np.concatenate((bounds, [len(parts)]))
    if len(starts) == 1:
        return {int(sorted_parts[0]): table}
    taken = table.take(pa.array(order))
    return {int(sorted_parts[s]): taken.slice(int(s), int(e - s)) for s, e in zip(starts, ends, strict=True)}
