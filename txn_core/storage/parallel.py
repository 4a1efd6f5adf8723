"""Overlapping independent storage requests: one shared, bounded thread pool per process.

On an object store every request is a network round trip (~20-30 ms). Requests that do not depend on
each other (entries read ahead, markers into several partitions, the per-partition work of planning) are
issued together so that they cost one round trip instead of one each. Storage clients release the GIL
while they wait, so threads are enough.

Invariants:

* :func:`parallel_map` returns results in the order of its inputs and raises only after every call has
  finished (no request is left running behind the caller's back, so a caller that handles the error can
  reason about what landed); the exception raised is the first one in input order.
* Work submitted from inside a pool thread runs inline in that thread, so nested use never deadlocks on
  a full pool.
* **Leaf requests** (``leaf=True``: single storage requests that submit nothing themselves, such as the
  probes of a tail search or the reads ahead of a reader) run on a second pool, also from inside a
  thread of the first: a partition opened on the shared pool still overlaps its own requests. A leaf
  never waits on other pool work, so neither pool can deadlock; a leaf submitted from a leaf thread runs
  inline.
* Within :func:`inline_leaves`, leaf requests run inline on the caller's thread, as on a leaf thread: for
  a caller that already has a core of its own and reads from a store whose reads are memory copies
  (``Storage.overlap_reads`` false), where a hand-off to a pool thread costs more than it overlaps.
* The pool is created lazily and re-created in a forked child (a fork copies no threads).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

#: Upper bound on requests in flight from one process through the shared pool: a transaction's markers over
#: 64 partitions go out in one round.
MAX_WORKERS = 64
#: Upper bound on leaf requests in flight from one process: a fresh consumer of a few partitions reads every
#: entry their listings show at once (PROTOCOL.md "Reading"), and a reader's depth reaches 64 per partition.
#: Threads start only as requests need them (an idle pool holds none past its peak), and each one waiting
#: on a store holds no GIL.
MAX_LEAF_WORKERS = 128

_pools: dict[str, ThreadPoolExecutor] = {}
_pool_lock = threading.Lock()
_local = threading.local()


def _reset_after_fork() -> None:
    global _pool_lock
    _pools.clear()
    _pool_lock = threading.Lock()


os.register_at_fork(after_in_child=_reset_after_fork)


def _mark_worker() -> None:
    _local.in_pool = True


def _mark_leaf_worker() -> None:
    _local.in_leaf = True


_KINDS = {"io": (MAX_WORKERS, _mark_worker), "leaf": (MAX_LEAF_WORKERS, _mark_leaf_worker)}


def _get_pool(kind: str) -> ThreadPoolExecutor:
    pool = _pools.get(kind)
    if pool is None:
        with _pool_lock:
            pool = _pools.get(kind)
            if pool is None:
                workers, mark = _KINDS[kind]
                pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"txnlog-{kind}", initializer=mark)
                _pools[kind] = pool
    return pool


def _leaf() -> ThreadPoolExecutor:
    return _get_pool("leaf")


def shared_pool() -> ThreadPoolExecutor:
    """The process-wide pool (created on first use)."""
    return _get_pool("io")


def in_pool_thread() -> bool:
    """Whether the caller runs on a thread of the shared pool."""
    return bool(getattr(_local, "in_pool", False))


@contextlib.contextmanager
def inline_leaves(inline: bool = True) -> Iterator[None]:
    """Run leaf requests submitted on this thread inline while the block runs (when ``inline``)."""
    before = getattr(_local, "in_leaf", False)
    _local.in_leaf = before or inline
    try:
        yield
    finally:
        _local.in_leaf = before


def submit(fn: Callable[..., R], *args: object, leaf: bool = False) -> Future[R]:
    """Run ``fn(*args)`` on the shared pool (inline, as a completed future, when already on it); with
    ``leaf``, on the leaf pool (inline only from a leaf thread). See the module invariants."""
    if leaf and not getattr(_local, "in_leaf", False):
        return _leaf().submit(fn, *args)
    if leaf or in_pool_thread():
        done: Future[R] = Future()
        try:
            done.set_result(fn(*args))
        except BaseException as exc:
            done.set_exception(exc)
        return done
    return shared_pool().submit(fn, *args)


def parallel_map(fn: Callable[[T], R], items: Iterable[T], *, leaf: bool = False) -> list[R]:
    """``[fn(x) for x in items]`` with the calls overlapped on the shared pool, or on the leaf pool with
    ``leaf`` (see module invariants).

    A single item runs inline: no thread hop for the common one-partition case.
    """
    seq: Sequence[T] = items if isinstance(items, Sequence) else list(items)
    if leaf:
        if len(seq) <= 1 or getattr(_local, "in_leaf", False):
            return [fn(x) for x in seq]
        futures = [_leaf().submit(fn, x) for x in seq]
    elif len(seq) <= 1 or in_pool_thread():
        return [fn(x) for x in seq]
    else:
        futures = [shared_pool().submit(fn, x) for x in seq]
    results: list[R] = []
    first: BaseException | None = None
    for fut in futures:
        try:
            results.append(fut.result())
        except BaseException as exc:  # collected; every future is awaited before raising
            if first is None:
                first = exc
    if first is not None:
        raise first
    return results
