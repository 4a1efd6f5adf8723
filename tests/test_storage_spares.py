"""Spare unnamed files (:mod:`txn_core.storage.spares`): a local create writes into the file a background
thread opened after its directory's previous create. Each spare is used once, by one process, and leaves
nothing behind when it is not used."""

from __future__ import annotations

import errno
import multiprocessing as mp
import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from txn_core.storage import local
from txn_core.storage.local import LocalStorage
from txn_core.storage.spares import SPARES, SparePool

pytestmark = pytest.mark.skipif(not local._O_TMPFILE, reason="O_TMPFILE is Linux's")


@pytest.fixture
def pool(monkeypatch: Any) -> Iterator[SparePool]:
    """A pool of this test's own, used by every local create."""
    spares = SparePool(max_spares=4)
    monkeypatch.setattr(local, "SPARES", spares)
    yield spares
    spares.close()


def _spares_of(pool: SparePool, directory: Path, count: int = 1) -> list[int]:
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
    storage.create("d/first", [b"x"])  # no spare yet: one is asked for
    spare = os.fstat(_spares_of(pool, tmp_path / "d")[-1]).st_ino
    storage.create("d/second", [b"pay", b"load"])
    assert os.stat(tmp_path / "d" / "second").st_ino == spare
    assert storage.read("d/second") == b"payload"
    assert storage.read("d/first") == b"x"
    assert len(_spares_of(pool, tmp_path / "d")) == 1  # the one taken is replaced
    assert sorted(os.listdir(tmp_path / "d")) == ["first", "second"]


def test_a_directory_whose_creates_outrun_its_spare_gets_two(tmp_path: Path, pool: SparePool) -> None:
    directory = str(tmp_path)
    assert pool.take(directory) is None  # new to the pool: one
    _spares_of(pool, tmp_path, 1)
    first = pool.take(directory)
    second = pool.take(directory)  # before the replacement opened: out of spares
    assert first is not None and second is None
    os.close(first)
    assert len(_spares_of(pool, tmp_path, 2)) == 2
    taken = [pool.take(directory), pool.take(directory)]  # a marker and the next entry, back to back
    assert None not in taken
    for fd in taken:
        os.close(fd or 0)
    assert len(_spares_of(pool, tmp_path, 2)) == 2, "each one taken is replaced"


def test_an_empty_object_is_never_written_into_a_spare(tmp_path: Path, pool: SparePool) -> None:
    """A file keeps the time it was opened at until something is written: an empty object gets a fresh one."""
    storage = LocalStorage(str(tmp_path))
    storage.create("d/first", [b"x"])
    spare = os.fstat(_spares_of(pool, tmp_path / "d")[-1]).st_ino
    storage.create("d/empty", [b""])
    assert os.stat(tmp_path / "d" / "empty").st_ino != spare
    assert storage.read("d/empty") == b""


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
    dirs = [tmp_path / f"d{i}" for i in range(3)]
    opened: list[int] = []
    for d in dirs:
        d.mkdir()
        spares.want(str(d), 2)
        opened.extend(_spares_of(spares, d, 2 if d != dirs[-1] else 1))
    _spares_of(spares, dirs[-1], 2)
    assert len(spares) == 2  # a whole directory's spares go at once: the bound is never passed
    kept = {fd for fds in spares._spares.values() for fd in fds}
    for fd in set(opened) - kept:
        with pytest.raises(OSError) as info:
            os.fstat(fd)
        assert info.value.errno == errno.EBADF
    assert set(spares._spares) == {str(dirs[2])}  # the least recently replenished went first
    spares.close()
    assert len(spares) == 0
    for fd in kept:
        with pytest.raises(OSError):
            os.fstat(fd)
    spares.want(str(dirs[0]))  # closed: no more spares, and its thread is gone
    assert spares._thread is not None
    spares._thread.join(10)
    assert not spares._thread.is_alive() and len(spares) == 0


def test_no_thread_for_spares_means_no_spares_not_a_failed_create(
    tmp_path: Path, pool: SparePool, monkeypatch: Any
) -> None:
    """At interpreter shutdown (or past a thread limit) a thread cannot start: the creates open their own files."""

    def refuse(self: threading.Thread) -> None:
        raise RuntimeError("can't create new thread at interpreter shutdown")

    monkeypatch.setattr(threading.Thread, "start", refuse)
    storage = LocalStorage(str(tmp_path))
    storage.create("d/a", [b"a"])
    storage.create("d/b", [b"b"])
    assert storage.read("d/a") == b"a" and storage.read("d/b") == b"b"
    assert len(pool) == 0 and pool._thread is None and not pool._queued


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
    linked: list[str] = []

    def refuse_the_spare(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        linked.append(str(src))
        if len(linked) == 1 and str(src) == f"/proc/self/fd/{spare}":  # the fresh file may get its number
            raise OSError(errno.EXDEV, "cross-device link")
        real_link(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "link", refuse_the_spare)
    storage.create("d/k", [b"payload"])
    assert storage.read("d/k") == b"payload"
    assert storage._unnamed is True
    assert len(linked) == 2 and all(src.startswith("/proc/self/fd/") for src in linked), "no named temporary file"
    assert sorted(os.listdir(tmp_path / "d")) == ["first", "k"]


def test_a_filesystem_that_refuses_the_link_is_still_found_out_with_spares(
    tmp_path: Path, pool: SparePool, monkeypatch: Any
) -> None:
    """Every link through ``/proc`` refused (EXDEV): the spare's, then the fresh file's; the storage moves to
    named files as it does without spares, and a later create writes each object once."""
    storage = LocalStorage(str(tmp_path))
    storage.create("d/first", [b"x"])
    _spares_of(pool, tmp_path / "d")
    real_link, real_fsync = os.link, os.fsync
    fsyncs: list[int] = []

    def no_proc_link(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        if str(src).startswith("/proc/self/fd/"):
            raise OSError(errno.EXDEV, "cross-device link")
        real_link(src, dst, *args, **kwargs)

    def counted(fd: int) -> None:
        fsyncs.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(os, "link", no_proc_link)
    storage.create("d/k", [b"payload"])
    assert storage._unnamed is False
    monkeypatch.setattr(os, "fsync", counted)
    storage.create("d/k2", [b"two"])
    assert len(fsyncs) == 2, "the file and its directory, once each"
    assert storage.read("d/k") == b"payload" and storage.read("d/k2") == b"two"


def test_a_spare_of_another_filesystem_is_never_written(tmp_path: Path, pool: SparePool, monkeypatch: Any) -> None:
    storage = LocalStorage(str(tmp_path))
    storage.create("d/first", [b"x"])
    spare = _spares_of(pool, tmp_path / "d")[-1]
    real_fstat, real_open = os.fstat, os.open
    opened_here: list[int] = []

    def elsewhere(fd: int) -> os.stat_result:
        st = real_fstat(fd)
        if fd == spare:
            fields = list(st)
            fields[2] = st.st_dev + 1  # st_dev
            return os.stat_result(fields)
        return st

    def spy(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        fd = real_open(path, flags, *args, **kwargs)
        if flags & local._O_TMPFILE == local._O_TMPFILE and threading.current_thread() is threading.main_thread():
            opened_here.append(fd)
        return fd

    monkeypatch.setattr(os, "fstat", elsewhere)
    monkeypatch.setattr(os, "open", spy)
    storage.create("d/k", [b"payload"])
    monkeypatch.undo()
    assert len(opened_here) == 1, "the create opened a file of its own"
    assert storage.read("d/k") == b"payload"
    assert sorted(os.listdir(tmp_path / "d")) == ["first", "k"]


def _child_creates(root: str, queue: Any, other: SparePool) -> None:
    queue.put(len(SPARES) + len(other))
    storage = LocalStorage(root)
    storage.create("d/child", [b"child's"])
    queue.put(os.stat(os.path.join(root, "d", "child")).st_ino)


def test_a_forked_child_never_uses_its_parents_spares(tmp_path: Path) -> None:
    """Two processes writing into one inode would make two names of one file: the child drops what it
    inherited."""
    storage = LocalStorage(str(tmp_path))
    storage.create("d/first", [b"x"])
    spare = os.fstat(_spares_of(SPARES, tmp_path / "d")[-1]).st_ino
    other = SparePool()  # any pool of the process, not only the one creates use
    other.want(str(tmp_path))
    _spares_of(other, tmp_path)
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child_creates, args=(str(tmp_path), queue, other))
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
    assert len(other) == 1, "the parent keeps its own"
    other.close()


def _create_and_die(root: str, ready: Any) -> None:
    storage = LocalStorage(root)
    storage.create("d/k", [b"payload"])
    _spares_of(SPARES, Path(root) / "d")
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


def test_a_directory_removed_while_a_spare_was_written_is_recreated(tmp_path: Path, pool: SparePool) -> None:
    """A concurrent cleanup removes the directory between the spare's write and its link: the create
    recreates it through a named file, as it does without spares (a fresh unnamed file cannot be opened in
    a removed directory: that is EPERM on ext4, not a permission problem). Its gate is asked once."""
    storage = LocalStorage(str(tmp_path))
    storage.create("d/first", [b"x"])
    _spares_of(pool, tmp_path / "d")
    asked: list[int] = []

    def cleanup_then_open() -> bool:
        asked.append(1)
        shutil.rmtree(tmp_path / "d")
        return True

    storage.create_gated("d/k", [b"payload"], cleanup_then_open)
    assert storage.read("d/k") == b"payload"
    assert os.listdir(tmp_path / "d") == ["k"]
    assert asked == [1]
    assert storage._unnamed is True
