"""S3 through ``obstore`` (the Rust ``object_store`` crate): one round trip per request (PROTOCOL.md "Storage").

Why this client for S3: measured through a proxy that adds 25 ms per round trip in front of SeaweedFS, a
create-if-absent of 200 bytes costs 1 round trip with obstore and 2 with boto3/s3fs (botocore waits for
``100 Continue`` before sending a body), a whole-object read 1 against 2 (s3fs's ``cat_file``), and every
txnlog operation is a chain of such requests. s3fs stays the client for options obstore cannot express
(:func:`obstore_config` returns None), and for ``gs://`` and ``abfs://``.

The user-facing interface does not change: ``s3://bucket/prefix`` URLs and s3fs-style ``storage.*``
options (``key``, ``secret``, ``token``, ``anon``, ``endpoint_url``, ``client_kwargs.endpoint_url``,
``client_kwargs.region_name``, and ``config_kwargs.connect_timeout``/``read_timeout``/``retries``, the
botocore settings that bound a stalled store); ``client`` picks the library (``auto``, ``obstore``,
``fsspec``). Credentials from an AWS config profile (``AWS_PROFILE``, ``~/.aws/credentials``), which
object_store does not read, keep s3fs unless keys are given. Options win over the environment, as with
s3fs: an endpoint given as an option is used whatever ``AWS_ENDPOINT_URL_S3`` says, and keys given as
options are used alone (no session token or other credential from the environment is mixed in).

Errors are classified by exception type, never by message text:

* ``AlreadyExistsError`` / ``PreconditionError`` on a create -> :class:`ObjectExistsError`
* ``NotFoundError`` (raised as ``FileNotFoundError``) -> :class:`ObjectNotFoundError` (reads), absent (exists, delete)
* ``PermissionDeniedError`` / ``UnauthenticatedError`` -> :class:`StoragePermissionError`
* ``NotFoundError`` on a create (the bucket does not exist) -> :class:`StorageError`: nothing was written
* anything else on a create -> :class:`UnknownOutcomeError` (resolved by reading back; object_store has
  already retried 5xx, throttling and connection errors with backoff); on a read -> :class:`StorageError`

Messages put a hint first where the error shows a setup mistake (:mod:`txn_core.storage.hints`: a missing
bucket, rejected credentials, no answer at the endpoint).

The store object is built lazily in each process (never pickled, rebuilt after a fork: a forked child
inherits no runtime threads).
"""

from __future__ import annotations

import os
import threading
from datetime import timedelta
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

#: s3fs options that configure only fsspec's own caching: meaningless for obstore, accepted and ignored.
_IGNORED = frozenset(
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


def obstore_config(options: dict[str, Any]) -> dict[str, Any] | None:
    """The ``S3Store`` keyword arguments equivalent to s3fs ``options``, or None when some option has no
    obstore equivalent (then s3fs serves the URL, and every option keeps its s3fs meaning)."""
    config: dict[str, Any] = {}
    client: dict[str, Any] = {}
    retry: dict[str, Any] = {}
    for name, value in options.items():
        if name in _IGNORED:
            continue
        if name == "key":
            config["access_key_id"] = value
        elif name == "secret":
            config["secret_access_key"] = value
        elif name == "token":
            config["session_token"] = value
        elif name == "anon":
            if value:
                config["skip_signature"] = True
        elif name == "endpoint_url":
            config["endpoint"] = value
        elif name == "client_kwargs" and isinstance(value, dict):
            for k, v in value.items():
                if k == "endpoint_url":
                    config["endpoint"] = v
                elif k == "region_name":
                    config["region"] = v
                else:
                    return None
        elif name == "config_kwargs" and isinstance(value, dict):
            if not _botocore_timeouts(value, client, retry):
                return None
        else:
            return None
    if "access_key_id" not in config and not config.get("skip_signature") and _profile_credentials():
        return None  # credentials from an AWS profile: botocore reads those, object_store does not
    endpoint = str(config.get("endpoint", ""))
    if endpoint.startswith("http://"):
        client["allow_http"] = True
    if endpoint and "region" not in config:
        config["region"] = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    kwargs: dict[str, Any] = {"config": config, "client_options": client}
    if retry:
        kwargs["retry_config"] = retry
    return kwargs


def _botocore_timeouts(config_kwargs: dict[str, Any], client: dict[str, Any], retry: dict[str, Any]) -> bool:
    """Put s3fs's ``config_kwargs`` (botocore's ``Config``) timeouts and retries into obstore's client and retry
    options; False if any key has no equivalent. ``connect_timeout`` and ``read_timeout`` (seconds; a read
    timeout bounds each read of a response, as in botocore) keep a stalled store from holding a request for
    long; ``retries.max_attempts`` (retries after the first attempt) or ``retries.total_max_attempts`` bound
    how often a timed-out request is tried again (obstore's default: 10 times within 3 minutes)."""
    for key, value in config_kwargs.items():
        if key in ("connect_timeout", "read_timeout"):
            seconds = _seconds(value)
            if seconds is None:
                return False
            client[key] = timedelta(seconds=seconds)
        elif key == "retries" and isinstance(value, dict):
            if set(value) - {"max_attempts", "total_max_attempts", "mode"}:  # mode: obstore has one, with backoff
                return False
            total, retries = _count(value.get("total_max_attempts")), _count(value.get("max_attempts"))
            if total is not None and total >= 1:  # botocore: it wins over max_attempts
                retry["max_retries"] = total - 1
            elif retries is not None:
                retry["max_retries"] = retries
            elif "total_max_attempts" in value or "max_attempts" in value:
                return False
        else:
            return False
    return True


def _seconds(value: object) -> float | None:
    """A positive, finite number of seconds (Spark and the CLI pass option values as text), else None."""
    try:
        seconds = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return seconds if 0 < seconds < 1e9 and not isinstance(value, bool) else None


def _count(value: object) -> int | None:
    """A whole number >= 0 (or its text), else None (None too)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        n = int(str(value))
    except ValueError:
        return None
    return n if n >= 0 else None


def _static_credentials(config: dict[str, Any]) -> dict[str, Any] | None:
    """Keys given as options, taken out of ``config`` as a static credential (or None without keys).

    Passed as a credential provider, they are used alone, as s3fs uses explicit keys: a session token or
    other credentials in the environment (``AWS_SESSION_TOKEN``, a web identity) are not mixed in, which
    object_store's own configuration would do."""
    if "access_key_id" not in config:
        return None
    return {
        "access_key_id": config.pop("access_key_id"),
        "secret_access_key": config.pop("secret_access_key", ""),
        "token": config.pop("session_token", None),
        "expires_at": None,
    }


def _profile_credentials() -> bool:
    """Whether this process would take S3 credentials from an AWS config profile (``AWS_PROFILE``, or
    ``~/.aws/credentials`` / ``~/.aws/config`` with no ``AWS_ACCESS_KEY_ID`` in the environment)."""
    if os.environ.get("AWS_PROFILE") or os.environ.get("AWS_DEFAULT_PROFILE"):
        return True
    if os.environ.get("AWS_ACCESS_KEY_ID"):
        return False
    files = [
        os.environ.get("AWS_SHARED_CREDENTIALS_FILE") or os.path.expanduser("~/.aws/credentials"),
        os.environ.get("AWS_CONFIG_FILE") or os.path.expanduser("~/.aws/config"),
    ]
    return any(os.path.exists(f) for f in files)


def obstore_available() -> bool:
    try:
        import obstore  # noqa: F401
    except ImportError:  # pragma: no cover - a dependency; absent only in a broken install
        return False
    return True


class ObstoreS3Storage(Storage):
    """A log rooted at ``bucket/prefix`` on S3 (or an S3-compatible server), through obstore."""

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
        return f"ObstoreS3Storage({self.url})"

    def describe(self) -> str:
        return f"S3 via obstore ({self.url})"

    @property
    def store(self) -> Any:
        if self._store is None or self._pid != os.getpid():
            with self._lock:
                if self._store is None or self._pid != os.getpid():
                    from obstore.store import S3Store

                    kwargs = {**self._kwargs, "config": dict(self._kwargs["config"])}
                    if "endpoint" in kwargs["config"]:
                        # object_store lets AWS_ENDPOINT_URL_S3 from the environment override a configured
                        # endpoint (obstore 0.12): set it under that name too, so the option wins
                        kwargs["config"]["aws_endpoint_url_s3"] = kwargs["config"]["endpoint"]
                    credential = _static_credentials(kwargs["config"])
                    if credential is not None:
                        kwargs["credential_provider"] = lambda: credential
                    self._store = S3Store(self.bucket, **kwargs)
                    self._pid = os.getpid()
        return self._store

    def _path(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _hint(self, exc: BaseException) -> str:
        return hint(exc, self.bucket, self._kwargs["config"].get("endpoint"))

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
            raise StorageError(f"create of {key} failed: {self._hint(exc)}{exc!r}") from exc
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
