"""txn_core.format.arrays: NumPy <-> Arrow for fixed-width numbers, without the pandas shim."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from txn_core.format.arrays import from_numpy, to_numpy


def test_numbers_go_both_ways_whatever_the_chunks_and_offsets() -> None:
    values = np.arange(10, dtype=np.int64) * 7
    arr = from_numpy(values)
    assert arr.type == pa.int64() and arr.to_pylist() == values.tolist()
    assert to_numpy(arr.slice(3, 4)).tolist() == values[3:7].tolist()
    chunked = pa.chunked_array(
        [from_numpy(np.arange(3, dtype=np.uint64)), from_numpy(np.arange(3, 5, dtype=np.uint64))]
    )
    assert to_numpy(chunked).tolist() == [0, 1, 2, 3, 4] and to_numpy(chunked).dtype == np.uint64
    assert from_numpy([1, 2], pa.uint64()).type == pa.uint64()
    assert to_numpy(from_numpy(np.empty(0, dtype=np.int32))).tolist() == []
    stamps = from_numpy(np.array([5], dtype=np.int64)).view(pa.timestamp("ms", "UTC"))
    assert stamps[0].value == 5


def test_what_the_helpers_do_not_build_is_refused() -> None:
    with pytest.raises(TypeError, match="fixed-width numbers"):
        from_numpy(np.array([True, False]))
    with pytest.raises(TypeError, match="fixed-width numbers"):
        from_numpy(np.array(["a"]))
    with pytest.raises(TypeError, match="without nulls"):
        to_numpy(pa.array([1, None], pa.int64()))
    with pytest.raises(TypeError, match="without nulls"):
        to_numpy(pa.array([True]))
