"""Spare unnamed files (:mod:`txn_core.storage.spares`): a local create writes into the file a background
thread opened after its directory's previous create. Each spare is used once, by one process, and leaves
nothing behind when it is not used."""

from __future__ import annotations

import errno
import multiprocessing as mp
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from txn_core.storage import local
from txn_core.storage.local import LocalStorage
from txn_core.storage.spares import SparePool

pytestmark = pytest.mark.skipif(not local._O_TMPFILE, reason="O_TMPFILE is Linux's")


@pytest.fixture
def pool(monkeypatch: Any) -> Iterator[SparePool]:
    """A pool of this test's own, used by every local create."""
    spares = SparePool(max_spares=4)
    monkeypatch.setattr(local, "SPARES", spares)
    yield spares
    spares.close()


def _spares_of(pool: SparePool, directory: Path, count: int = 2) -> list[int]:
    """The descriptors of ``directory``'s spares, once the background thread has opened ``count``; the next
    create there takes the last."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with pool._lock:
            fds = list(pool._spares.get(str(directory), ()))
        if len(fds) >= count:
            return fds
        time.sleep(0.005)
    raise AssertionError(f"{count} spares of {directory} not opened within 10 s")


def test_a_create_writes_into_the_spare_opened_after_the_previous_one(tmp_path: Path, pool: SparePool) -> None:
    storage = LocalStorage(str(tmp_path))
    storage.create("d/first", [b"x"])  # no spare yet: two are asked for
    spare = os.fstat(_spares_of(pool, tmp_path / "d", 2)[-1]).st_ino
    storage.create("d/second", [b"pay", b"load"])
    assert os.stat(tmp_path / "d" / "second").st_ino == spare
    assert storage.read("d/second") == b"payload"
    assert storage.read("d/first") == b"x"
    assert len(_spares_of(pool, tmp_path / "d", 2)) == 2  # the one taken is replaced
    assert sorted(os.listdir(tmp_path / "d")) == ["first", "second"]


def test_a_spare_is_used_once(tmp_path: Path, pool: SparePool) -> None:
    """Creates racing in one directory never share a spare: every object keeps its own bytes."""
    storage = LocalStorage(str(tmp_path))
    for i in range(40):
        storage.create(f"d/{i:03d}", [f"object {i}".encode()])
    inodes = {os.stat(tmp_path / "d" / f"{i:03d}").st_ino for i in range(40)}
    assert len(inodes) == 40
    assert [storage.read(f"d/{i:03d}") for i in range(40)] == [f"object {i}".encode() for i in range(40)]


def test_the_pool_keeps_at_most_its_bound_and_closes_what_it_drops(tmp_path: Path) -> None:
    spares = SparePool(max_spares=3)
    dirs = [tmp_path / f"d{i}" for i in range(4)]
    opened: list[int] = []
    for d in dirs:
        d.mkdir()
        assert spares.take(str(d)) is None  # a miss asks for two
        opened.extend(_spares_of(spares, d, 2) if d != dirs[-1] else _spares_of(spares, d, 1))
    _spares_of(spares, dirs[-1], 2)
    assert len(spares) == 2  # a whole directory's spares go at once: the bound is never passed
    kept = {fd for fds in spares._spares.values() for fd in fds}
    for fd in set(opened) - kept:
        with pytest.raises(OSError) as info:
            os.fstat(fd)
        assert info.value.errno == errno.EBADF
    assert set(spares._spares) == {str(dirs[3])}  # the least recently replenished went first
    spares.close()
    assert len(spares) == 0
    for fd in kept:
        with pytest.raises(OSError):
            os.fstat(fd)


def test_a_directory_it_cannot_open_a_spare_in_costs_nothing(tmp_path: Path, pool: SparePool) -> None:
    pool.want(str(tmp_path / "missing"))
    (tmp_path / "other").mkdir()
    pool.want(str(tmp_path / "other"))
    _spares_of(pool, tmp_path / "other", 1)  # the thread went past the missing directory
    assert pool.take(str(tmp_path / "missing")) is None


def test_a_spare_whose_link_fails_is_dropped_and_the_create_written_afresh(
    tmp_path: Path, pool: SparePool, monkeypatch: Any
) -> None:
    """A spare opened for an earlier directory at the same path, on another filesystem: its link fails
    (EXDEV). The create goes through a fresh file instead, and the storage keeps creating unnamed files."""
    storage = LocalStorage(str(tmp_path))
    storage.create("d/first", [b"x"])
    spare = _spares_of(pool, tmp_path / "d")[-1]
    real_link = os.link

    def refuse_the_spare(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        if str(src) == f"/proc/self/fd/{spare}":
            raise OSError(errno.EXDEV, "cross-device link")
        real_link(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "link", refuse_the_spare)
    storage.create("d/k", [b"payload"])
    assert storage.read("d/k") == b"payload"
    assert storage._unnamed is True
    assert sorted(os.listdir(tmp_path / "d")) == ["first", "k"]


def _child_creates(root: str, queue: Any) -> None:
    spares = local.SPARES
    queue.put(len(spares))
    storage = LocalStorage(root)
    storage.create("d/child", [b"child's"])
    queue.put(os.stat(os.path.join(root, "d", "child")).st_ino)


def test_a_forked_child_never_uses_its_parents_spares(tmp_path: Path) -> None:
    """Two processes writing into one inode would make two names of one file: the child drops what it
    inherited."""
    storage = LocalStorage(str(tmp_path))
    storage.create("d/first", [b"x"])
    spare = os.fstat(_spares_of(local.SPARES, tmp_path / "d")[-1]).st_ino
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child_creates, args=(str(tmp_path), queue))
    proc.start()
    inherited = queue.get(timeout=60)
    child = queue.get(timeout=60)
    proc.join(60)
    assert proc.exitcode == 0
    assert inherited == 0
    assert child != spare
    storage.create("d/parent", [b"parent's"])
    assert os.stat(tmp_path / "d" / "parent").st_ino == spare
    assert storage.read("d/child") == b"child's"
    assert storage.read("d/parent") == b"parent's"


def _create_and_die(root: str, ready: Any) -> None:
    storage = LocalStorage(root)
    storage.create("d/k", [b"payload"])
    _spares_of(local.SPARES, Path(root) / "d")
    ready.set()
    time.sleep(60)


def test_a_killed_process_leaves_no_trace_of_its_spares(tmp_path: Path) -> None:
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    proc = ctx.Process(target=_create_and_die, args=(str(tmp_path), ready))
    proc.start()
    assert ready.wait(60)
    proc.kill()
    proc.join(60)
    assert os.listdir(tmp_path / "d") == ["k"]
    assert LocalStorage(str(tmp_path)).read("d/k") == b"payload"
