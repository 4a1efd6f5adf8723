"""Unnamed files opened ahead of the creates that will use them (local disk).

Opening an ``O_TMPFILE`` allocates an inode, which on ext4 costs 0.2-1.2 ms right after a large
``fsync`` in the same filesystem: as much as writing and syncing a 200-byte record. A create on local disk
(:mod:`txn_core.storage.local`) therefore takes its directory's **spare**, an unnamed file a background thread
opened after the directory's previous create, and asks for the next one. The open overlaps whatever the
caller does between two creates there (encoding its next entry, the other records of a commit), the way an
object-store client keeps its connection open.

Invariants:

* A spare is an unnamed, empty, writable file of its directory's filesystem, opened by this process. Nobody
  can see it: it has no name until a create links it, and the kernel frees it with its last descriptor. A
  crash (or a power cut: ext4 frees orphan inodes when it mounts) leaves nothing, so the pool adds no crash
  window to the create's.
* At most :data:`PER_DIRECTORY` spares per directory and :data:`MAX_SPARES` in the process (the least
  recently replenished directory's are closed). A spare is handed out once: :meth:`SparePool.take`
  removes it.
* After ``fork`` the child drops its copies of the parent's descriptors without using them: two processes
  linking one inode would make two names of one file.
* Failing to open a spare (a read-only mount, no inodes left, a directory removed, no thread to open it
  with) costs nothing: the pool never raises, and the create opens its own file and meets the error there.
  A create never writes into a spare of another filesystem than its directory's, and one whose link fails
  is written again into a fresh file (:mod:`txn_core.storage.local`).

What a spare does not follow: it has the owner, mode and default ACL of the moment it was opened (a process
that changes its user, or a directory replaced by one with other defaults, creates up to two files per
directory the old way), and, open for writing, it keeps its filesystem busy: an ``umount`` or a read-only
remount fails with EBUSY while the process runs. A spare being opened at the moment of a ``fork`` may stay
open, unused, in the child. A pool lives until :meth:`SparePool.close` (its thread holds it); the process's
own, :data:`SPARES`, for the life of the process.
"""

from __future__ import annotations

import collections
import contextlib
import os
import queue
import threading
import weakref

#: Spares kept in the process at most (one open descriptor each).
MAX_SPARES = 64
#: Spares kept per directory at most: a transaction's marker and its producer's next entry go to one
#: partition's directory in quick succession.
PER_DIRECTORY = 2
#: ``os.O_TMPFILE`` where the platform has it, else 0 (then the pool is never used).
_O_TMPFILE: int = getattr(os, "O_TMPFILE", 0)


class SparePool:
    """Spare unnamed files per directory, opened by one daemon thread (see the module docstring)."""

    def __init__(self, max_spares: int = MAX_SPARES, per_directory: int = PER_DIRECTORY) -> None:
        self.max_spares = max_spares
        self.per_directory = per_directory
        self._lock = threading.Lock()
        self._spares: collections.OrderedDict[str, list[int]] = collections.OrderedDict()
        self._count = 0
        self._wanted: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._queued: collections.Counter[str] = collections.Counter()
        self._thread: threading.Thread | None = None
        self._closed = False
        _POOLS.add(self)

    def take(self, directory: str) -> int | None:
        """A spare of ``directory`` (its descriptor, now the caller's to close), or None. Either way the
        directory's spares are replenished in the background: the one taken; after a miss, one for a
        directory new to the pool, and up to :attr:`per_directory` for one whose creates came faster than
        its spares. Never raises."""
        with self._lock:
            fds = self._spares.get(directory)
            fd = fds.pop() if fds else None
            if fd is not None:
                self._count -= 1
            if fds is not None and fd is not None:  # the one taken is replaced
                level = min(self.per_directory, len(fds) + self._queued[directory] + 1)
            elif fds is not None or directory in self._queued:
                level = self.per_directory  # known here, and out of spares
            else:
                level = 1
        self.want(directory, level)
        return fd

    def want(self, directory: str, count: int = 1) -> None:
        """Have spares of ``directory`` opened in the background until it has ``count`` (with those there and
        on their way). Never raises: without a thread (the interpreter shutting down, a thread limit), no
        spares."""
        if not _O_TMPFILE or self.max_spares <= 0:
            return
        with self._lock:
            missing = count - len(self._spares.get(directory, ())) - self._queued[directory]
            if self._closed or missing <= 0:
                return
            if self._thread is None:
                thread = threading.Thread(target=self._run, name="txnlog-spares", daemon=True)
                try:
                    thread.start()
                except Exception:  # RuntimeError: no thread now; the creates open their own files
                    return
                self._thread = thread
            self._queued[directory] += missing
        for _ in range(missing):
            self._wanted.put(directory)

    def close(self) -> None:
        """Close every spare (they vanish with their descriptors) and stop the thread: no spares from here on."""
        with self._lock:
            self._closed = True
            spares = self._drain()
        self._wanted.put(None)
        _close_all(spares)

    def __len__(self) -> int:
        with self._lock:
            return self._count

    def _run(self) -> None:
        while True:
            directory = self._wanted.get()
            if directory is None:
                return
            try:
                fd: int | None = os.open(directory, os.O_WRONLY | _O_TMPFILE, 0o644)
            except Exception:  # OSError: the create meets the reason itself
                fd = None
            dropped: list[int] = [] if fd is None else [fd]
            with self._lock:
                self._queued[directory] -= 1
                if self._queued[directory] <= 0:
                    del self._queued[directory]
                if fd is not None and not self._closed:
                    dropped = []
                    self._spares.setdefault(directory, []).append(fd)
                    self._spares.move_to_end(directory)
                    self._count += 1
                    while self._count > self.max_spares:  # the least recently replenished directory goes
                        _, fds = self._spares.popitem(last=False)
                        self._count -= len(fds)
                        dropped.extend(fds)
            _close_all(dropped)

    def _drain(self) -> list[int]:
        """Under the lock: forget every spare; their descriptors, for the caller to close."""
        spares = [fd for fds in self._spares.values() for fd in fds]
        self._spares.clear()
        self._count = 0
        return spares

    def _after_fork_in_child(self) -> None:
        """In a forked child (one thread): close the inherited copies unused, forget the parent's thread and
        queue. The lock is new: the parent's thread may have held the old one at the fork."""
        self._lock = threading.Lock()
        _close_all(self._drain())
        self._queued.clear()
        self._wanted = queue.SimpleQueue()
        self._thread = None


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


#: Every pool of the process, reset in a forked child.
_POOLS: weakref.WeakSet[SparePool] = weakref.WeakSet()


#: The process's pool, shared by every :class:`~txn_core.storage.local.LocalStorage`.
SPARES = SparePool()


def _after_fork_in_child() -> None:
    for pool in list(_POOLS):
        pool._after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
