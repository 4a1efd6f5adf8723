"""The storage contract: the only way txnlog touches a filesystem (PROTOCOL.md section "Storage").

The contract is the :class:`Storage` class: its docstring states every guarantee a backend gives, and its
attributes declare the capabilities a backend may have. Wrappers (:class:`DelegatingStorage`) implement the
whole class by forwarding; nothing is discovered with ``getattr``. Unknown outcomes are resolved by
:func:`create_resolving`, which reads the object back and compares the writer identity that every txnlog
object carries in its first bytes.
"""

from __future__ import annotations

import abc
import logging
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

from txn_core.errors import (
    ObjectExistsError,
    ObjectNotFoundError,
    RetryableStorageError,
    StorageError,
    UnknownOutcomeError,
)

Chunks = Sequence[bytes | bytearray | memoryview]
#: Names in one page of an object store's listing (S3's and GCS's most; Azure's is 5,000).
LIST_PAGE = 1000
#: :meth:`Storage.list_page`'s answer: the names of one page, and whether they are all of them.
ListPage = tuple[list[str], bool]
_log = logging.getLogger("txnlog.storage")


class Storage(abc.ABC):
    """One log URL's flat key space. Implementations are thread-safe; instances are cheap to pickle.

    **Guarantees** (every backend, proven by ``tests/test_storage_contract.py`` on each):

    ``create(key, chunks)``
        Create-if-absent. Atomic and complete-or-absent: a reader either sees the whole object or no object;
        of two concurrent creates of one key exactly one succeeds, the other gets :class:`ObjectExistsError`
        (and the server's own check-and-store must be atomic too: PROTOCOL.md "Storage"). "Please retry" is
        :class:`RetryableStorageError` (the write certainly did not land); anything else that leaves the
        outcome open is :class:`UnknownOutcomeError`. A refusal for permission is
        :class:`StoragePermissionError`.
    ``read(key, start, end)``
        The bytes of a complete object (or a byte range of it); :class:`ObjectNotFoundError` if absent.
    ``exists(key)``
        Whether the object exists now (a HEAD); never served from a cache.
    ``list(prefix)``
        The direct children of a "directory" prefix (ending in ``/``), sorted; sub-prefixes end in ``/``.
    ``delete(key)``
        Remove an object; deleting an absent object is not an error.

    Those five are the protocol's. The rest are derived, with defaults built on them: :meth:`create_gated`,
    :meth:`read_buffer`, :meth:`size`, :meth:`mtime_ms`, :meth:`sweep_temp`, :meth:`describe`,
    :meth:`close`. Nothing else: no rename, no overwrite, no exists-then-write.

    **Capabilities**, declared here and overridden by the backends that have them: :attr:`overlap_reads`,
    :attr:`stages_creates`; and one thing learned while running, :attr:`read_only`.
    """

    #: The URL this storage was opened from (without credentials).
    url: str
    #: Whether a read waits on something besides this process's CPU (a network round trip), so that reading
    #: ahead on threads pays (txn_core.storage.parallel). False where a read is a memory copy (local disk through
    #: the page cache, memory): there a task that already has its core reads inline (txn_core.partition.ranges).
    overlap_reads: bool = True
    #: Whether :meth:`create_gated` writes the bytes before waiting for its gate (local disk: into a
    #: temporary file that only the final link makes visible). Where False, it waits, then creates.
    stages_creates: bool = False
    #: Set once a write this process only made to help others (a snapshot) was refused for permission: the
    #: store is read-only to this process, and such writes are no longer tried
    #: (:func:`txn_core.storage.guarded.opportunistic`).
    read_only: bool = False

    @abc.abstractmethod
    def create(self, key: str, chunks: Chunks) -> None:
        """Create ``key`` with the concatenation of ``chunks``, only if absent (see module doc)."""

    @abc.abstractmethod
    def read(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        """Read ``key`` (or bytes ``[start, end)``). A short object yields fewer bytes, never padding."""

    @abc.abstractmethod
    def exists(self, key: str) -> bool:
        """Whether ``key`` exists now."""

    @abc.abstractmethod
    def list(self, prefix: str) -> list[str]:
        """Direct children of ``prefix`` (which ends in ``/``), as names relative to it, sorted.

        Sub-prefixes are returned with a trailing ``/``. A missing prefix lists as empty.
        """

    def list_page(self, prefix: str, limit: int = LIST_PAGE) -> ListPage | None:
        """The first ``limit`` direct children of ``prefix`` as :meth:`list` names them, and whether they are
        all of them; one request on an object store that pages its listings (a LIST page holds 1,000 names).
        None when the store cannot stop after one page (then only :meth:`list`, every page, is available).
        The default lists everything: a local directory or memory pays no round trip per page."""
        names = self.list(prefix)
        return names[:limit], len(names) <= limit

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Delete ``key`` if present."""

    def create_gated(self, key: str, chunks: Chunks, gate: Callable[[], bool]) -> None:
        """:meth:`create`, made visible only once ``gate()`` returns True; if it returns False (or raises),
        nothing is created and :class:`GateClosedError` (or its error) is raised. A backend that can write the
        bytes invisibly first (:attr:`stages_creates`) overlaps that with whatever the gate waits for."""
        if not gate():
            raise GateClosedError(f"create of {key} called off")
        self.create(key, chunks)

    def read_buffer(self, key: str) -> Any:
        """The whole object as a ``pyarrow.Buffer`` (default: wraps :meth:`read`; local disk reads into
        Arrow-allocated memory, which the reader hands to Arrow without copying)."""
        import pyarrow as pa

        return pa.py_buffer(self.read(key))

    def size(self, key: str) -> int:
        """Size in bytes of ``key`` (default: read it)."""
        return len(self.read(key))

    def mtime_ms(self, key: str) -> int | None:
        """The store's modification time of ``key`` in ms, when the backend knows it."""
        return None

    def sweep_temp(self) -> int:
        """Remove temporary objects crashed creates left (local disk's named fallback); returns how many.
        Backends whose creates leave none remove nothing."""
        return 0

    def describe(self) -> str:
        """A human-readable name of the backend and URL, never containing credentials."""
        return f"{type(self).__name__}({self.url})"

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources (optional)."""


class GateClosedError(Exception):
    """A gated create was called off by its gate: nothing was created (not a storage failure)."""


class DelegatingStorage(Storage):
    """Forwards the whole contract to ``inner``, capabilities included: the base of wrappers that change one
    or two operations (the write check before a first write, request logging, fault injection in tests)."""

    def __init__(self, inner: Storage) -> None:
        self.inner = inner
        self.url = inner.url

    @property
    def overlap_reads(self) -> bool:  # type: ignore[override]
        return self.inner.overlap_reads

    @property
    def stages_creates(self) -> bool:  # type: ignore[override]
        return self.inner.stages_creates

    @property
    def read_only(self) -> bool:
        return self.inner.read_only

    @read_only.setter
    def read_only(self, value: bool) -> None:
        self.inner.read_only = value

    def create(self, key: str, chunks: Chunks) -> None:
        self.inner.create(key, chunks)

    def create_gated(self, key: str, chunks: Chunks, gate: Callable[[], bool]) -> None:
        self.inner.create_gated(key, chunks, gate)

    def read(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        return self.inner.read(key, start, end)

    def read_buffer(self, key: str) -> Any:
        return self.inner.read_buffer(key)

    def exists(self, key: str) -> bool:
        return self.inner.exists(key)

    def list(self, prefix: str) -> list[str]:
        return self.inner.list(prefix)

    def list_page(self, prefix: str, limit: int = LIST_PAGE) -> ListPage | None:
        if type(self).list is not DelegatingStorage.list:
            return super().list_page(prefix, limit)  # a wrapper that sees listings sees this one too
        return self.inner.list_page(prefix, limit)

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def size(self, key: str) -> int:
        return self.inner.size(key)

    def mtime_ms(self, key: str) -> int | None:
        return self.inner.mtime_ms(key)

    def sweep_temp(self) -> int:
        return self.inner.sweep_temp()

    def describe(self) -> str:
        return self.inner.describe()

    def close(self) -> None:
        self.inner.close()


def _backoff(attempt: int) -> None:
    time.sleep(min(0.5, 0.005 * (2**attempt)) * (0.5 + random.random()))


def create_resolving(
    storage: Storage,
    key: str,
    chunks: Chunks,
    identity: bytes,
    *,
    attempts: int = 8,
    gate: Callable[[], bool] | None = None,
) -> None:
    """Create ``key`` if absent, resolving ambiguous outcomes (PROTOCOL.md "Writes").

    ``identity`` is a prefix of the object's bytes that is unique to this writer and this write (every
    txnlog header carries a 16-byte writer id). On "exists" or an unknown outcome, the object is read
    back: if its prefix equals ``identity`` the earlier attempt landed and this call succeeds;
    if another writer's object is there, :class:`ObjectExistsError` is raised; if nothing is there,
    the create is retried. Retryable errors are retried with backoff. Never deletes anything.

    With ``gate``, attempts are :meth:`Storage.create_gated` until the gate has opened (a closed gate raises
    :class:`GateClosedError`, nothing created); only later attempts are plain creates. An attempt that failed
    before asking the gate (a store's "retry" before anything was sent) asks it again: an entry gated on
    another's landing is never published unasked.

    After ``attempts`` (a bound: this never loops forever) it raises what is known:
    :class:`RetryableStorageError` if every attempt was refused by the store (the object certainly did
    not land), else :class:`UnknownOutcomeError` (some attempt may have landed, and reading back failed).
    """
    last: BaseException | None = None
    unknown = False  # whether some attempt may have landed without our learning it
    asked = OpenedGate(gate) if gate is not None else None
    for attempt in range(attempts):
        try:
            if asked is not None and not asked.opened:
                storage.create_gated(key, chunks, asked)
            else:
                storage.create(key, chunks)
            return
        except ObjectExistsError as exc:
            try:
                mine = _is_mine(storage, key, identity)
            except ObjectNotFoundError:
                continue  # deleted between our create and the read-back: create again
            except StorageError as read_exc:
                last, unknown = read_exc, True  # cannot read it back now: the outcome stays unknown
                _backoff(attempt)
                continue
            if mine:
                return
            raise ObjectExistsError(f"{key} was created by another writer") from exc
        except RetryableStorageError as exc:
            last = exc
            _log.info("create of %s: the store asked to retry (attempt %d of %d)", key, attempt + 1, attempts)
            _backoff(attempt)
            continue
        except UnknownOutcomeError as exc:
            last, unknown = exc, True
            _log.info("create of %s: outcome unknown, reading it back (attempt %d of %d)", key, attempt + 1, attempts)
            _backoff(attempt)
            try:
                if _is_mine(storage, key, identity):
                    return
            except ObjectNotFoundError:
                continue  # not there now; a delayed request may still land it: the outcome stays unknown
            except StorageError as read_exc:
                last = read_exc
                continue
            raise ObjectExistsError(f"{key} was created by another writer") from exc
    if not unknown:
        raise RetryableStorageError(
            f"the store refused the write of {key} {attempts} times; it did not land. Retry once the store "
            f"is healthy ({last})."
        ) from last
    raise UnknownOutcomeError(
        f"could not learn whether the write of {key} landed after {attempts} attempts; "
        "the storage is unreachable or failing. Retry the operation once storage is healthy "
        "(it is safe: the retry resolves the earlier attempt)."
    ) from last


class OpenedGate:
    """A gate asked until it opens, and open from then on without asking again; ``opened`` says whether it
    did (:func:`create_resolving` asks it until it did; a local create's second attempt passes it open)."""

    __slots__ = ("gate", "opened")

    def __init__(self, gate: Callable[[], bool]) -> None:
        self.gate = gate
        self.opened = False

    def __call__(self) -> bool:
        if not self.opened:
            self.opened = self.gate()
        return self.opened


def _is_mine(storage: Storage, key: str, identity: bytes) -> bool:
    head = storage.read(key, 0, len(identity))
    return head == identity
