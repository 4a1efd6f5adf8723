"""Local disk's create: an unnamed (``O_TMPFILE``) file linked into place, or a named temporary file where the
filesystem cannot do that. Both keep the storage contract; only the first leaves nothing behind a crash. And
what local disk's refusals become: errors that name the object or the path."""

from __future__ import annotations

import errno
import multiprocessing as mp
import os
from pathlib import Path
from typing import Any

import pytest

import txn_core
from txn_core.errors import ConfigurationError, ObjectExistsError, ObjectNotFoundError, StoragePermissionError
from txn_core.storage import local
from txn_core.storage.base import GateClosedError
from txn_core.storage.local import TMP_PREFIX, LocalStorage
from txn_core.storage.spares import SparePool

pytestmark = pytest.mark.skipif(not local._O_TMPFILE, reason="O_TMPFILE is Linux's")


def named(root: Path) -> LocalStorage:
    """A storage that behaves as on a filesystem without ``O_TMPFILE``."""
    storage = LocalStorage(str(root))
    storage._unnamed = False
    return storage


@pytest.fixture
def no_spares(monkeypatch: Any) -> None:
    """Every unnamed create opens its own file (no spare opened ahead: :mod:`txn_core.storage.spares`), so
    that a test's ``os.open`` sees it."""
    monkeypatch.setattr(local, "SPARES", SparePool(max_spares=0))


@pytest.fixture(params=["unnamed", "named"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> LocalStorage:
    return LocalStorage(str(tmp_path)) if request.param == "unnamed" else named(tmp_path)


def test_create_is_exclusive_complete_and_durable_in_both_modes(storage: LocalStorage, tmp_path: Path) -> None:
    storage.create("a/b/k", [b"first ", memoryview(b"object")])
    with pytest.raises(ObjectExistsError):
        storage.create("a/b/k", [b"second"])
    assert storage.read("a/b/k") == b"first object"
    assert sorted(os.listdir(tmp_path / "a" / "b")) == ["k"], "no temporary name left"


def test_the_unnamed_create_is_used_where_the_filesystem_has_it(
    tmp_path: Path, monkeypatch: Any, no_spares: None
) -> None:
    """No named temporary file is ever created: every name opened for creation is the directory itself."""
    opened: list[tuple[str, int]] = []
    real_open = os.open

    def spy(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        opened.append((str(path), flags))
        return real_open(path, flags, *args, **kwargs)

    storage = LocalStorage(str(tmp_path))
    storage.create("d/first", [b"x"])  # the directory exists from here on
    monkeypatch.setattr(os, "open", spy)
    storage.create("d/k", [b"payload"])
    assert not any(TMP_PREFIX in p for p, _ in opened)
    assert any(f & local._O_TMPFILE == local._O_TMPFILE for _, f in opened)
    assert storage.read("d/k") == b"payload"


def test_a_closed_gate_leaves_nothing_in_either_mode(storage: LocalStorage, tmp_path: Path) -> None:
    storage.create("d/other", [b"x"])
    with pytest.raises(GateClosedError):
        storage.create_gated("d/k", [b"payload"], lambda: False)
    assert not storage.exists("d/k")
    assert os.listdir(tmp_path / "d") == ["other"]


def _crash_before_link(root: str, unnamed: bool) -> None:
    storage = LocalStorage(root)
    storage._unnamed = unnamed

    def die() -> bool:
        os._exit(3)  # the bytes are written and fsynced; the process dies before the link

    storage.create_gated("d/k", [b"payload" * 1000], die)


@pytest.mark.parametrize("unnamed", [True, False])
def test_a_crash_before_the_link_leaves_no_object(tmp_path: Path, unnamed: bool) -> None:
    storage = LocalStorage(str(tmp_path))
    storage.create("d/other", [b"x"])
    proc = mp.get_context("spawn").Process(target=_crash_before_link, args=(str(tmp_path), unnamed))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 3
    assert not storage.exists("d/k")
    assert storage.list("d/") == ["other"]
    left = [n for n in os.listdir(tmp_path / "d") if n.startswith(TMP_PREFIX)]
    if unnamed:
        assert left == [], "an unnamed file dies with its process"
    else:
        assert len(left) == 1, "a named temporary file stays behind until swept"
        assert storage.sweep_temp() == 1
    storage.create("d/k", [b"again"])  # the key is free
    assert storage.read("d/k") == b"again"


@pytest.mark.parametrize("where", ["open", "link"])
def test_a_filesystem_without_o_tmpfile_falls_back_to_a_named_file(
    tmp_path: Path, monkeypatch: Any, where: str, no_spares: None
) -> None:
    """``O_TMPFILE`` refused (EOPNOTSUPP), or ``/proc``'s link refused (EXDEV): the create still happens, once,
    through a named temporary file, and the storage uses named files from then on."""
    real_open, real_link = os.open, os.link

    def no_tmpfile_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if where == "open" and flags & local._O_TMPFILE == local._O_TMPFILE:
            raise OSError(errno.EOPNOTSUPP, "not supported")
        return real_open(path, flags, *args, **kwargs)

    def no_proc_link(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        if where == "link" and str(src).startswith("/proc/self/fd/"):
            raise OSError(errno.EXDEV, "cross-device link")
        real_link(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "open", no_tmpfile_open)
    monkeypatch.setattr(os, "link", no_proc_link)
    storage = LocalStorage(str(tmp_path))
    storage.create("d/k", [b"pay", b"load"])
    assert storage.read("d/k") == b"payload"
    assert storage._unnamed is False
    with pytest.raises(ObjectExistsError):
        storage.create("d/k", [b"again"])
    storage.create("d/k2", [b"two"])
    assert sorted(os.listdir(tmp_path / "d")) == ["k", "k2"]


def test_a_directory_removed_under_an_unnamed_create_is_recreated_once(
    tmp_path: Path, monkeypatch: Any, no_spares: None
) -> None:
    """ENOENT from ``O_TMPFILE`` means the directory went away (a concurrent cleanup), not that the filesystem
    lacks it: this create goes through a named file, which recreates the directory; later ones stay unnamed."""
    storage = LocalStorage(str(tmp_path))
    storage.create("d/first", [b"x"])
    real_open = os.open
    refused: list[int] = []

    def gone_once(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if flags & local._O_TMPFILE == local._O_TMPFILE and not refused:
            refused.append(flags)
            raise FileNotFoundError(errno.ENOENT, "directory removed")
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", gone_once)
    storage.create("d/k", [b"payload"])
    assert refused and storage.read("d/k") == b"payload"
    assert storage._unnamed is True
    storage.create("d/k2", [b"two"])
    assert sorted(os.listdir(tmp_path / "d")) == ["first", "k", "k2"]


@pytest.mark.parametrize("unnamed", [True, False])
def test_a_directory_really_removed_after_it_was_known_is_recreated(tmp_path: Path, unnamed: bool) -> None:
    """A cleanup removed the directory this storage already created (and remembers): the next create there
    recreates it, whichever way the storage creates."""
    storage = LocalStorage(str(tmp_path))
    storage._unnamed = unnamed
    storage.create("d/first", [b"x"])
    os.unlink(tmp_path / "d" / "first")
    os.rmdir(tmp_path / "d")
    storage.create("d/k", [b"payload"])
    assert storage.read("d/k") == b"payload"
    assert storage._unnamed is unnamed
    assert os.listdir(tmp_path / "d") == ["k"]


@pytest.mark.parametrize("how", ["read", "read_buffer"])
def test_an_object_the_process_may_not_read_raises_a_permission_error_naming_it(
    tmp_path: Path, monkeypatch: Any, how: str
) -> None:
    """As an object store's 403: the API and the CLI name the object and what reading a log needs (root
    reads any file, so the refusal is injected where the object is opened)."""
    storage = LocalStorage(str(tmp_path))
    storage.create("topics/t/00000/log/00000000000000000006", [b"entry"])
    real_open = os.open

    def refusing(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if str(path).endswith("00000000000000000006") and flags == os.O_RDONLY:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", refusing)
    with pytest.raises(StoragePermissionError, match="cannot read topics/t/00000/log/00000000000000000006 under"):
        getattr(storage, how)("topics/t/00000/log/00000000000000000006")


def test_a_key_under_a_file_is_not_found(tmp_path: Path) -> None:
    storage = LocalStorage(str(tmp_path))
    storage.create("a/b", [b"x"])
    with pytest.raises(ObjectNotFoundError, match="a/b/c does not exist: a file stands where a directory"):
        storage.read("a/b/c")


def test_a_log_path_that_is_a_file_is_refused_naming_it(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("not a log")
    with pytest.raises(ConfigurationError, match="is a file, not a directory"):
        txn_core.open_log(str(afile))
    assert afile.read_text() == "not a log"
