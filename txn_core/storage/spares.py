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
* Failing to open a spare (a read-only mount, no inodes left, a directory removed) costs nothing: the create
  opens its own file and meets the error there.
"""

from __future__ import annotations

import collections
import contextlib
import os
import queue
import threading

#: Spares kept in the process at most (one open descriptor each).
MAX_SPARES = 32
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
        self._wanted: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._queued: collections.Counter[str] = collections.Counter()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()

    def take(self, directory: str) -> int | None:
        """A spare of ``directory`` (its descriptor, now the caller's to close), or None; either way the
        directory's spares are replenished in the background: the one taken, or up to
        :attr:`per_directory` after a miss (its creates came faster than its spares)."""
        with self._lock:
            if self._pid != os.getpid():  # pragma: no cover - the fork hook resets first
                self._reset_after_fork()
            fds = self._spares.get(directory)
            fd = fds.pop() if fds else None
            if fd is not None:
                self._count -= 1
            level = len(fds) + 1 if fds is not None and fd is not None else self.per_directory
        self.want(directory, level)
        return fd

    def want(self, directory: str, count: int = 1) -> None:
        """Have spares of ``directory`` opened in the background until it has ``count`` (with those there
        and on their way)."""
        if not _O_TMPFILE or self.max_spares <= 0:
            return
        with self._lock:
            if self._pid != os.getpid():  # pragma: no cover - the fork hook resets first
                self._reset_after_fork()
            missing = count - len(self._spares.get(directory, ())) - self._queued[directory]
            if missing <= 0:
                return
            self._queued[directory] += missing
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="txnlog-spares", daemon=True)
                self._thread.start()
        for _ in range(missing):
            self._wanted.put(directory)

    def close(self) -> None:
        """Close every spare (they vanish with their descriptors)."""
        with self._lock:
            spares = [fd for fds in self._spares.values() for fd in fds]
            self._spares.clear()
            self._count = 0
        for fd in spares:
            with contextlib.suppress(OSError):
                os.close(fd)

    def __len__(self) -> int:
        with self._lock:
            return self._count

    def _run(self) -> None:
        while True:
            directory = self._wanted.get()
            try:
                fd: int | None = os.open(directory, os.O_WRONLY | _O_TMPFILE, 0o644)
            except OSError:
                fd = None  # the create meets the reason itself
            evicted: list[int] = []
            with self._lock:
                self._queued[directory] -= 1
                if self._queued[directory] <= 0:
                    del self._queued[directory]
                if fd is not None:
                    self._spares.setdefault(directory, []).append(fd)
                    self._spares.move_to_end(directory)
                    self._count += 1
                    while self._count > self.max_spares:  # the least recently replenished directory goes
                        _, dropped = self._spares.popitem(last=False)
                        self._count -= len(dropped)
                        evicted.extend(dropped)
            for extra in evicted:
                with contextlib.suppress(OSError):
                    os.close(extra)

    def _reset_after_fork(self) -> None:
        """In a forked child: close the inherited copies unused, forget the parent's thread and queue."""
        for fds in self._spares.values():
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._spares.clear()
        self._count = 0
        self._queued.clear()
        self._wanted = queue.SimpleQueue()
        self._thread = None
        self._pid = os.getpid()


#: The process's pool, shared by every :class:`~txn_core.storage.local.LocalStorage`.
SPARES = SparePool()


def _after_fork_in_child() -> None:
    # The lock may have been held by a thread that does not exist in the child.
    SPARES._lock = threading.Lock()
    SPARES._reset_after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
