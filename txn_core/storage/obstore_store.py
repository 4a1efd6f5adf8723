"""Object stores through ``obstore`` (the Rust ``object_store`` crate): one round trip per request (PROTOCOL.md
"Storage"). The operations, shared by every store; :mod:`txn_core.storage.obstore_s3` and
:mod:`txn_core.storage.obstore_azure` build the store from a user's options.

Errors are classified by exception type, never by message text:

* ``AlreadyExistsError`` / ``PreconditionError`` on a create -> :class:`ObjectExistsError`
* ``NotFoundError`` (raised as ``FileNotFoundError``) -> :class:`ObjectNotFoundError` (reads), absent (exists, delete)
* ``PermissionDeniedError`` / ``UnauthenticatedError`` -> :class:`StoragePermissionError`
* ``NotFoundError`` on a create (the bucket or container does not exist) -> :class:`StorageError`: nothing was
  written
* anything else on a create -> :class:`UnknownOutcomeError` (resolved by reading back; object_store has
  already retried 5xx, throttling and connection errors with backoff); on a read -> :class:`StorageError`

Messages put a hint first where the error shows a setup mistake (:mod:`txn_core.storage.hints`: a missing
bucket, rejected credentials, no answer at the endpoint).

The store object is built lazily in each process (never pickled, rebuilt after a fork: a forked child
inherits no runtime threads).
"""

from __future__ import annotations

import abc
import os
import threading
from typing import Any

from txn_core.errors import (
    ObjectExistsError,
    ObjectNotFoundError,
    StorageError,
    StoragePermissionError,
    UnknownOutcomeError,
)
from txn_core.storage.base import LIST_PAGE, Chunks, ListPage, Storage
from txn_core.storage.hints import hint

#: fsspec options that configure only fsspec's own caching and event loop (and txnlog's choice of client):
#: meaningless for obstore, accepted and ignored.
FSSPEC_ONLY = frozenset(
    {
        "use_listings_cache",
        "skip_instance_cache",
        "listings_expiry_time",
        "max_paths",
        "default_block_size",
        "default_fill_cache",
        "default_cache_type",
        "asynchronous",
        "loop",
        "client",
    }
)


class ObstoreStorage(Storage):
    """A log rooted at ``bucket/prefix`` of an object store reached through obstore; subclasses build the
    store (:meth:`_build_store`) from ``kwargs``, the keyword arguments of its obstore class."""

    #: the URL scheme whose words the hints use (``s3``, ``abfs``)
    scheme = "s3"

    def __init__(self, url: str, bucket: str, prefix: str, kwargs: dict[str, Any]) -> None:
        self.url = url
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self._kwargs = kwargs
        self._store: Any = None
        self._pid = -1
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, object]:
        return {"url": self.url, "bucket": self.bucket, "prefix": self.prefix, "kwargs": self._kwargs}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["url"], state["bucket"], state["prefix"], state["kwargs"])  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url})"

    @property
    def store(self) -> Any:
        if self._store is None or self._pid != os.getpid():
            with self._lock:
                if self._store is None or self._pid != os.getpid():
                    self._store = self._build_store()
                    self._pid = os.getpid()
        return self._store

    @abc.abstractmethod
    def _build_store(self) -> Any:
        """The obstore store object (built once per process, never pickled)."""

    def _endpoint(self) -> str | None:
        """The configured endpoint, for messages (None: the provider's)."""
        return None

    def _path(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _hint(self, exc: BaseException, *, no_bucket: bool = False) -> str:
        return hint(exc, self.bucket, self._endpoint(), self.scheme, no_bucket=no_bucket)

    def _refused(self, what: str, exc: BaseException, writing: bool = False) -> StoragePermissionError:
        """The error of a request refused for want of permission (or for bad credentials, as the hint says)."""
        why = self._hint(exc).removesuffix(": ") or (
            "no permission (read-only credentials?)"
            if writing
            else "no permission (check the credentials: key, secret and token; and that they may read this path)"
        )
        return StoragePermissionError(f"the store refused to {what}: {why}")

    def create(self, key: str, chunks: Chunks) -> None:
        import obstore
        from obstore import exceptions as ox

        data = chunks[0] if len(chunks) == 1 else b"".join(bytes(c) for c in chunks)
        try:
            obstore.put(
                self.store, self._path(key), bytes(data) if isinstance(data, memoryview) else data, mode="create"
            )
        except (ox.AlreadyExistsError, ox.PreconditionError, FileExistsError) as exc:
            raise ObjectExistsError(f"{key} already exists") from exc
        except (ox.PermissionDeniedError, ox.UnauthenticatedError, PermissionError) as exc:
            raise self._refused(f"create {key}", exc, writing=True) from exc
        except (ox.NotFoundError, FileNotFoundError) as exc:  # a PUT finds no object: the bucket is missing
            raise StorageError(f"create of {key} failed: {self._hint(exc, no_bucket=True)}{exc!r}") from exc
        except Exception as exc:
            raise UnknownOutcomeError(
                f"create of {key} failed with an unknown outcome: {self._hint(exc)}{exc!r}"
            ) from exc

    def read(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        return bytes(self._get(key, start, end))

    def read_buffer(self, key: str) -> Any:
        import pyarrow as pa

        return pa.py_buffer(self._get(key, None, None))

    def _get(self, key: str, start: int | None, end: int | None) -> Any:
        import obstore
        from obstore import exceptions as ox

        try:
            if start is None and end is None:
                return obstore.get(self.store, self._path(key)).bytes()
            lo = start or 0
            if end is None:
                return obstore.get(self.store, self._path(key), options={"range": {"offset": lo}}).bytes()
            if end <= lo:
                return b""
            return obstore.get(self.store, self._path(key), options={"range": (lo, end)}).bytes()
        except (ox.NotFoundError, FileNotFoundError) as exc:
            raise ObjectNotFoundError(f"{key} does not exist") from exc
        except (ox.PermissionDeniedError, ox.UnauthenticatedError, PermissionError) as exc:
            raise self._refused(f"read {key}", exc) from exc
        except Exception as exc:
            if start is not None and start > 0:
                # object_store reports "416 Range Not Satisfiable" only in its message: ask the object's size
                # instead (one HEAD, on this error path only). A range past the end reads no bytes.
                meta = self._head(key)
                if meta is None:
                    raise ObjectNotFoundError(f"{key} does not exist") from exc
                if start >= int(meta["size"]):
                    return b""
            raise StorageError(f"read of {key} failed: {self._hint(exc)}{exc!r}") from exc

    def exists(self, key: str) -> bool:
        return self._head(key) is not None

    def _head(self, key: str) -> dict[str, Any] | None:
        import obstore
        from obstore import exceptions as ox

        try:
            return dict(obstore.head(self.store, self._path(key)))
        except (ox.NotFoundError, FileNotFoundError):
            return None
        except (ox.PermissionDeniedError, ox.UnauthenticatedError, PermissionError) as exc:
            raise self._refused(f"look up {key}", exc) from exc
        except Exception as exc:
            raise StorageError(f"existence check of {key} failed: {self._hint(exc)}{exc!r}") from exc

    def size(self, key: str) -> int:
        meta = self._head(key)
        if meta is None:
            raise ObjectNotFoundError(f"{key} does not exist")
        return int(meta["size"])

    def mtime_ms(self, key: str) -> int | None:
        meta = self._head(key)
        if meta is None:
            raise ObjectNotFoundError(f"{key} does not exist")
        value = meta.get("last_modified")
        return int(value.timestamp() * 1000) if value is not None else None

    def list(self, prefix: str) -> list[str]:
        import obstore
        from obstore import exceptions as ox

        base = self._path(prefix).rstrip("/")
        try:
            result = obstore.list_with_delimiter(self.store, base + "/" if base else None)
        except (ox.NotFoundError, FileNotFoundError):
            return []
        except (ox.PermissionDeniedError, ox.UnauthenticatedError, PermissionError) as exc:
            raise self._refused(f"list {prefix or 'the log'}", exc) from exc
        except Exception as exc:
            raise StorageError(f"list of {prefix or 'the log'} failed: {self._hint(exc)}{exc!r}") from exc
        # Some stores (SeaweedFS) list an emptied "directory" as an entry named like the prefix itself.
        out = {p.rstrip("/").rsplit("/", 1)[-1] + "/" for p in result["common_prefixes"] if p.rstrip("/") != base}
        out.update(str(o["path"]).rsplit("/", 1)[-1] for o in result["objects"] if str(o["path"]).rstrip("/") != base)
        out.discard("")
        out.discard("/")
        return sorted(out)

    def list_page(self, prefix: str, limit: int = LIST_PAGE) -> ListPage | None:
        """One LIST request: the first page of keys under ``prefix`` (a listing without a delimiter, so a
        sub-prefix's objects take room in the page: its names then cover fewer than ``limit`` children)."""
        import obstore
        from obstore import exceptions as ox

        base = self._path(prefix).rstrip("/")
        try:
            page = next(iter(obstore.list(self.store, base + "/" if base else None, chunk_size=limit)), [])
        except (ox.NotFoundError, FileNotFoundError):
            return [], True
        except (ox.PermissionDeniedError, ox.UnauthenticatedError, PermissionError) as exc:
            raise self._refused(f"list {prefix or 'the log'}", exc) from exc
        except Exception as exc:
            raise StorageError(f"list of {prefix or 'the log'} failed: {self._hint(exc)}{exc!r}") from exc
        skip = len(base) + 1 if base else 0
        out: set[str] = set()
        for o in page:
            head, sep, _ = str(o["path"])[skip:].partition("/")
            if head:
                out.add(head + sep)
        return sorted(out), len(page) < limit

    def delete(self, key: str) -> None:
        import obstore
        from obstore import exceptions as ox

        try:
            obstore.delete(self.store, self._path(key))
        except (ox.NotFoundError, FileNotFoundError):
            return
        except (ox.PermissionDeniedError, ox.UnauthenticatedError, PermissionError) as exc:
            raise self._refused(f"delete {key}", exc, writing=True) from exc
        except Exception as exc:
            raise StorageError(f"delete of {key} failed: {self._hint(exc)}{exc!r}") from exc
