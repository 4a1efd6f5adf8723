"""The shared request pool: order kept, errors raised only after every call ended, nesting safe."""

from __future__ import annotations

import threading
import time

import pytest

from txn_core.storage.parallel import in_pool_thread, inline_leaves, parallel_map, submit


def test_results_keep_input_order_and_calls_overlap() -> None:
    def slow(i: int) -> int:
        time.sleep(0.05 * (3 - i % 3))
        return i * i

    t0 = time.perf_counter()
    assert parallel_map(slow, range(9)) == [i * i for i in range(9)]
    assert time.perf_counter() - t0 < 0.05 * 3 * 9 / 2  # overlapped, not one after another


def test_error_is_raised_after_every_call_finished() -> None:
    finished: list[int] = []
    lock = threading.Lock()

    def work(i: int) -> int:
        if i == 1:
            raise ValueError("boom 1")
        time.sleep(0.05)
        with lock:
            finished.append(i)
        return i

    with pytest.raises(ValueError, match="boom 1"):
        parallel_map(work, range(6))
    assert sorted(finished) == [0, 2, 3, 4, 5]


def test_nested_use_runs_inline_instead_of_deadlocking() -> None:
    def inner(i: int) -> tuple[int, bool]:
        return i, in_pool_thread()

    def outer(i: int) -> list[tuple[int, bool]]:
        return parallel_map(inner, range(40))

    out = parallel_map(outer, range(40))  # 40 x 40 > pool size: would deadlock if nested calls queued
    assert all(flag for row in out for _, flag in row)
    assert submit(lambda: 7).result() == 7


def test_leaf_requests_run_on_the_callers_thread_within_inline_leaves() -> None:
    me = threading.get_ident()
    assert submit(threading.get_ident, leaf=True).result() != me  # a leaf thread by default
    with inline_leaves():
        assert submit(threading.get_ident, leaf=True).result() == me
        with inline_leaves(False):  # nesting never turns inline reads back into hand-offs
            assert submit(threading.get_ident, leaf=True).result() == me
    with inline_leaves(False):
        assert submit(threading.get_ident, leaf=True).result() != me
    assert submit(threading.get_ident, leaf=True).result() != me  # restored after the block
