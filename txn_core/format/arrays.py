"""Arrow arrays from NumPy without importing pandas.

``pyarrow.array`` asks its pandas shim whether its argument is a pandas object, and the shim imports pandas
when it is installed: about 0.3 s on a process's first call (a dozen round trips of a 25 ms store), paid on
a fresh reader's path to its first rows. The columns the read path builds (metadata columns, the
aborted-transaction index) are fixed-width numbers, which :func:`from_numpy` wraps without a copy through
``Array.from_buffers``, never asking the shim.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa


def from_numpy(values: Any, type: pa.DataType | None = None) -> pa.Array:
    """An Arrow array of the fixed-width numbers ``values`` (a NumPy array, or a sequence converted to
    ``type``'s NumPy type), without nulls. ``type`` defaults to the array's own."""
    dtype = type.to_pandas_dtype() if type is not None else None
    arr = np.ascontiguousarray(values, dtype=dtype)
    if arr.ndim != 1 or arr.dtype.kind not in "iuf":
        raise TypeError(f"from_numpy takes a 1-d array of fixed-width numbers, got {arr.dtype} of {arr.ndim} dims")
    return pa.Array.from_buffers(type or pa.from_numpy_dtype(arr.dtype), len(arr), [None, pa.py_buffer(arr)])


def to_numpy(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """The fixed-width numbers of ``column`` (no nulls) as a NumPy array (read-only, a view of the Arrow
    buffer when the column is one chunk); ``Array.to_numpy`` would ask the pandas shim."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    dtype = np.dtype(arr.type.to_pandas_dtype())
    if arr.null_count or dtype.kind not in "iuf" or pa.types.is_boolean(arr.type):
        raise TypeError(f"to_numpy takes fixed-width numbers without nulls, got {arr.type} with {arr.null_count} nulls")
    data = arr.buffers()[1]
    if data is None:
        return np.empty(0, dtype=dtype)
    return np.frombuffer(data, dtype=dtype, count=len(arr), offset=arr.offset * dtype.itemsize)


def empty_table(schema: pa.Schema) -> pa.Table:
    """A table of ``schema`` with no rows (``Schema.empty_table`` would ask the pandas shim)."""
    return pa.Table.from_batches([], schema=schema)
