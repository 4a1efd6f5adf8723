"""Local-disk storage: anonymous file + fsync + link + directory fsync (PROTOCOL.md "Storage/local").

``create`` writes an unnamed file in the key's directory (``O_TMPFILE``), fsyncs it, then links it to the
final name (``linkat`` through ``/proc/self/fd``). ``link`` fails with EEXIST when the name exists, which
makes the create exclusive, and the final name only ever points at a complete, fsynced file, which makes it
complete-or-absent; the directory is fsynced so the new name survives a power cut. A crash before the link
leaves nothing: the kernel frees an unnamed file with its last descriptor.

Where ``O_TMPFILE`` or ``/proc`` is unavailable (another OS, a filesystem without it), the same steps run
through a named temporary file ``<dir>/.tmp-<uuid>``, unlinked after the link; a crash there leaves at most
that file, which readers never list and :meth:`LocalStorage.sweep_temp` removes. The unnamed file saves two
directory updates per create (the temporary name's creation and removal): a 200-byte create is 1.27x as
fast on this project's ext4 test disk (``tests/bench_core.py``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from txn_core.errors import ObjectExistsError, ObjectNotFoundError, StorageError, StoragePermissionError
from txn_core.storage.base import Chunks, GateClosedError, OpenedGate, Storage
from txn_core.storage.spares import SPARES

TMP_PREFIX = ".tmp-"
#: ``os.O_TMPFILE`` where the platform has it (Linux), else 0: named temporary files only.
_O_TMPFILE: int = getattr(os, "O_TMPFILE", 0)
#: errno values with which ``O_TMPFILE`` or its ``linkat`` says "not here": fall back to a named temporary file
_NO_TMPFILE = (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL, errno.EXDEV)
#: Whether creates start unnamed: the platform has ``O_TMPFILE`` and ``/proc/self/fd`` to link it through.
_UNNAMED = bool(_O_TMPFILE) and os.path.isdir("/proc/self/fd")


def _open_gate() -> bool:
    return True


class _SpareRefusedError(Exception):
    """The link of a spare file failed (not for an existing name): the create is written again into a fresh
    file."""


#: errno values that mean "you may not write here" (a read-only mount, a directory without write permission)
_PERMISSION = (errno.EACCES, errno.EPERM, errno.EROFS)


class LocalStorage(Storage):
    """Objects are files under ``root``; keys use ``/`` separators."""

    overlap_reads = False  # a read is a copy out of the page cache

    def __init__(self, root: str, url: str | None = None) -> None:
        self.root = os.path.abspath(root)
        self.url = url or f"file://{self.root}"
        self._known_dirs: set[str] = set()
        self._unnamed = _UNNAMED

    def __getstate__(self) -> dict[str, object]:
        return {"root": self.root, "url": self.url}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.root = str(state["root"])
        self.url = str(state["url"])
        self._known_dirs = set()
        self._unnamed = _UNNAMED

    def _path(self, key: str) -> str:
        return os.path.join(self.root, key)

    def _ensure_dir(self, directory: str) -> None:
        if directory in self._known_dirs:
            return
        missing: list[str] = []
        d = directory
        while not os.path.isdir(d):
            missing.append(d)
            parent = os.path.dirname(d)
            if parent == d:
                break
            d = parent
        for m in reversed(missing):
            with contextlib.suppress(FileExistsError):
                os.mkdir(m)
            _fsync_dir(os.path.dirname(m))
        self._known_dirs.add(directory)

    #: the bytes of a gated create go to a temporary file before the gate: only the link makes them visible
    stages_creates = True

    def create(self, key: str, chunks: Chunks) -> None:
        self.create_gated(key, chunks, _open_gate)

    def create_gated(self, key: str, chunks: Chunks, gate: Callable[[], bool]) -> None:
        """Write and fsync the temporary file, then wait for ``gate``: only if it opens is the file linked
        to ``key`` (and the directory fsynced). A closed gate, or a crash before the link, leaves at most
        the temporary file, which nobody lists (:meth:`sweep_temp` removes it)."""
        try:
            self._create(key, chunks, gate)
        except OSError as exc:
            if exc.errno in _PERMISSION and not isinstance(exc, StorageError):
                raise StoragePermissionError(f"cannot write {key} under {self.root}: {exc.strerror}") from exc
            if (
                isinstance(exc, StorageError)
                and isinstance(exc.__cause__, OSError)
                and exc.__cause__.errno in _PERMISSION
            ):
                raise StoragePermissionError(
                    f"cannot write {key} under {self.root}: {exc.__cause__.strerror}"
                ) from exc.__cause__
            raise

    def _create(self, key: str, chunks: Chunks, gate: Callable[[], bool]) -> None:
        path = self._path(key)
        directory = os.path.dirname(path)
        self._ensure_dir(directory)
        gate = OpenedGate(gate)  # a second attempt (a refused spare, the named fallback) passes an open gate
        if self._unnamed:
            done = self._create_unnamed(key, directory, os.path.basename(path), chunks, gate)
            if done:
                return
            if done is False:
                self._unnamed = False  # this filesystem has no O_TMPFILE: named temporary files from now on
        self._create_named(key, path, directory, chunks, gate)

    def _create_unnamed(
        self, key: str, directory: str, name: str, chunks: Chunks, gate: Callable[[], bool]
    ) -> bool | None:
        """The ``O_TMPFILE`` create: True when done; False when the filesystem cannot do it, None when the
        directory was removed meanwhile (either way nothing was written anywhere, and the caller creates
        through a named temporary file, which recreates the directory)."""
        try:
            dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as exc:
            return self._not_here(key, exc)
        try:
            return self._create_unnamed_in(key, dfd, directory, name, chunks, gate)
        finally:
            os.close(dfd)

    def _create_unnamed_in(
        self, key: str, dfd: int, directory: str, name: str, chunks: Chunks, gate: Callable[[], bool]
    ) -> bool | None:
        """:meth:`_create_unnamed` in the open directory ``dfd``: into the directory's spare file when one is
        ready (:mod:`txn_core.storage.spares`; taking it asks for the next), else into a file opened here. A
        spare's link that fails for any reason but an existing name is retried once into a file opened here
        (it was opened for an earlier directory at this path, behind a bind mount, say), whose errors are the
        create's; if the directory was removed meanwhile, the named create recreates it, as it would
        without a spare (a file cannot be opened in a removed directory: EPERM on ext4)."""
        fd = self._spare(directory, dfd, chunks)
        if fd is not None:
            try:
                return self._write_and_link(key, dfd, name, fd, chunks, gate, spare=True)
            except _SpareRefusedError as exc:
                if isinstance(exc.__cause__, FileNotFoundError) or os.fstat(dfd).st_nlink == 0:
                    return None
        try:
            fd = os.open(".", os.O_WRONLY | _O_TMPFILE, 0o644, dir_fd=dfd)
        except OSError as exc:
            return self._not_here(key, exc)
        return self._write_and_link(key, dfd, name, fd, chunks, gate, spare=False)

    @staticmethod
    def _spare(directory: str, dfd: int, chunks: Chunks) -> int | None:
        """A spare file for a create of ``chunks`` into ``dfd``, or None: never for an empty object (a file
        keeps the time it was opened at until written), never one of another filesystem than ``dfd``'s, and
        never an error from the pool (it only saves time)."""
        if not any(len(chunk) for chunk in chunks):
            return None
        try:
            fd = SPARES.take(directory)
        except Exception:  # a spare is an optimisation: the create opens its own file
            return None
        if fd is None:
            return None
        try:
            if os.fstat(fd).st_dev == os.fstat(dfd).st_dev:
                return fd
        except OSError:
            pass
        os.close(fd)
        return None

    def _write_and_link(
        self, key: str, dfd: int, name: str, fd: int, chunks: Chunks, gate: Callable[[], bool], *, spare: bool
    ) -> bool | None:
        """Write ``chunks`` into the unnamed file ``fd`` (closed here), fsync it, pass ``gate``, link it as
        ``name`` and fsync the directory. True when done; else as :meth:`_not_here`, or, for a ``spare``
        whose link failed, :class:`_SpareRefusedError`."""
        try:
            try:
                _write_all(fd, chunks)
                os.fsync(fd)
            except OSError as exc:
                raise StorageError(f"could not create {key} under {self.root}: {exc}") from exc
            if not gate():
                raise GateClosedError(f"create of {key} called off")
            try:
                os.link(f"/proc/self/fd/{fd}", name, dst_dir_fd=dfd, follow_symlinks=True)
            except FileExistsError as exc:
                raise ObjectExistsError(f"{key} already exists") from exc
            except OSError as exc:
                if spare:
                    raise _SpareRefusedError from exc
                return self._not_here(key, exc)
        finally:
            os.close(fd)
        _fsync_fd(dfd)
        return True

    def _not_here(self, key: str, exc: OSError) -> bool | None:
        """What an error of ``O_TMPFILE`` or its link means: None, the directory went away; False, this
        filesystem cannot do it; anything else is raised as the create's error."""
        if isinstance(exc, FileNotFoundError):
            return None
        if exc.errno in _NO_TMPFILE:
            return False
        raise StorageError(f"could not create {key} under {self.root}: {exc}") from exc

    def _create_named(self, key: str, path: str, directory: str, chunks: Chunks, gate: Callable[[], bool]) -> None:
        tmp = os.path.join(directory, f"{TMP_PREFIX}{uuid.uuid4().hex}")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileNotFoundError:
            # The directory vanished under us (a concurrent cleanup); recreate it once.
            self._known_dirs.discard(directory)
            self._ensure_dir(directory)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            try:
                _write_all(fd, chunks)
                os.fsync(fd)
            finally:
                os.close(fd)
            if not gate():
                raise GateClosedError(f"create of {key} called off")
            try:
                os.link(tmp, path)
            except FileExistsError as exc:
                raise ObjectExistsError(f"{key} already exists") from exc
        except OSError as exc:
            if isinstance(exc, StorageError):
                raise
            raise StorageError(f"could not create {key} under {self.root}: {exc}") from exc
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        _fsync_dir(directory)

    def _open_for_read(self, key: str) -> int:
        """A file descriptor of ``key``'s object. Missing: :class:`ObjectNotFoundError` (a directory, or a
        file where a directory of the key should be, is not an object either); not readable for want of
        permission: :class:`StoragePermissionError` naming the object, as an object store's 403 does."""
        try:
            return os.open(self._path(key), os.O_RDONLY)
        except FileNotFoundError as exc:
            raise ObjectNotFoundError(f"{key} does not exist") from exc
        except IsADirectoryError as exc:
            raise ObjectNotFoundError(f"{key} is a directory, not an object") from exc
        except NotADirectoryError as exc:
            raise ObjectNotFoundError(f"{key} does not exist: a file stands where a directory of it should") from exc
        except PermissionError as exc:
            raise StoragePermissionError(
                f"cannot read {key} under {self.root}: {exc.strerror}; reading a log needs read permission "
                "on every object and directory in it"
            ) from exc

    def read(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        fd = self._open_for_read(key)
        try:
            begin = start or 0
            stop = os.fstat(fd).st_size if end is None else end
            want = max(0, stop - begin)
            data = os.pread(fd, want, begin)
            if len(data) < want:  # short read: collect the rest (objects never shrink)
                parts = [data]
                got = len(data)
                while got < want:
                    more = os.pread(fd, want - got, begin + got)
                    if not more:
                        break
                    parts.append(more)
                    got += len(more)
                data = b"".join(parts)
            return data
        finally:
            os.close(fd)

    def read_buffer(self, key: str) -> Any:
        """Read into memory from Arrow's allocator (reused across reads; no Python bytes object).

        Not memory-mapped, though a mapping would save a copy: a read error of the disk, or a file truncated
        under a live mapping, would kill the process with SIGBUS instead of raising an error that names the
        object."""
        import pyarrow as pa

        fd = self._open_for_read(key)
        try:
            size = os.fstat(fd).st_size
            buf = pa.allocate_buffer(size)
            got = 0
            view = memoryview(buf)
            while got < size:
                n = os.preadv(fd, [view[got:]], got)
                if n <= 0:
                    break
                got += n
            return buf if got == size else buf.slice(0, got)
        finally:
            os.close(fd)

    def exists(self, key: str) -> bool:
        return os.path.isfile(self._path(key))

    def size(self, key: str) -> int:
        try:
            return os.stat(self._path(key)).st_size
        except FileNotFoundError as exc:
            raise ObjectNotFoundError(f"{key} does not exist") from exc

    def mtime_ms(self, key: str) -> int | None:
        try:
            return int(os.stat(self._path(key)).st_mtime * 1000)
        except FileNotFoundError as exc:
            raise ObjectNotFoundError(f"{key} does not exist") from exc

    def list(self, prefix: str) -> list[str]:
        path = self._path(prefix)
        try:
            with os.scandir(path) as it:
                out = []
                for e in it:
                    if e.name.startswith(TMP_PREFIX):
                        continue
                    out.append(e.name + "/" if e.is_dir() else e.name)
        except (FileNotFoundError, NotADirectoryError):
            return []
        out.sort()
        return out

    def delete(self, key: str) -> None:
        try:
            os.unlink(self._path(key))
        except FileNotFoundError:
            return
        except IsADirectoryError:
            return
        except OSError as exc:
            if exc.errno in _PERMISSION:
                raise StoragePermissionError(f"cannot delete {key} under {self.root}: {exc.strerror}") from exc
            raise

    def sweep_temp(self, prefix: str = "") -> int:
        """Remove temp files left by crashed creates under ``prefix``; returns how many."""
        removed = 0
        for dirpath, _dirs, files in os.walk(self._path(prefix)):
            for name in files:
                if name.startswith(TMP_PREFIX):
                    try:
                        os.unlink(os.path.join(dirpath, name))
                        removed += 1
                    except FileNotFoundError:
                        pass
        return removed


def _write_all(fd: int, chunks: Chunks) -> None:
    for chunk in chunks:
        view = memoryview(chunk)
        while view:
            written = os.write(fd, view)
            view = view[written:]


def _fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        _fsync_fd(fd)
    finally:
        os.close(fd)


def _fsync_fd(fd: int) -> None:
    try:
        os.fsync(fd)
    except OSError as exc:  # some filesystems refuse fsync on directories
        if exc.errno not in (errno.EINVAL, errno.EBADF):
            raise


def local_root_from_url(url: str) -> str:
    """The directory of a ``file://`` URL or plain path."""
    if url.startswith("file://"):
        return str(Path(url[len("file://") :]))
    return url
