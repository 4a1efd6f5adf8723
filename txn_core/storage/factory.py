"""Opening a :class:`Storage` from a log URL, with the start-up self-test (PROTOCOL.md "Storage")."""

from __future__ import annotations

import difflib
import inspect
import os
import uuid
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from txn_core.errors import (
    ConfigurationError,
    ObjectExistsError,
    StorageContractError,
    StorageError,
    StoragePermissionError,
)
from txn_core.logs import get_logger
from txn_core.storage import requests_log
from txn_core.storage.base import Storage, create_resolving
from txn_core.storage.guarded import WriteCheckedStorage
from txn_core.storage.local import LocalStorage
from txn_core.storage.memory import MemoryStorage
from txn_core.storage.objectstore import ObjectStoreStorage
from txn_core.storage.obstore_azure import ObstoreAzureStorage, azure_obstore_config
from txn_core.storage.obstore_s3 import ObstoreS3Storage, obstore_available, obstore_config
from txn_core.storage.obstore_store import ObstoreStorage
from txn_core.storage.urls import redact_url

SELFTEST_PREFIX = "_txnlog/selftest/"
_OBJECT_STORES = {"s3", "s3a", "gs", "gcs", "abfs", "abfss", "az", "adl"}


def open_storage(url: str, storage_options: dict[str, Any] | None = None, *, self_test: bool = True) -> Storage:
    """Open the storage for a log URL: ``file://`` or a path, ``memory://``, ``s3://``, ``gs://``, ``abfs://``.

    The self-test (:func:`self_test_storage`) runs before the process's first write to the URL, once per URL
    per process; opening and reading write nothing (:mod:`txn_core.storage.guarded`).
    """
    if not isinstance(url, str) or not url.strip():
        raise ConfigurationError("log URL is empty: pass a path, file://DIR, memory://NAME or s3://BUCKET/PREFIX")
    url = url.strip()
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if storage_options is not None and not isinstance(storage_options, Mapping):
        raise ConfigurationError(
            f"storage options must be a dict of option names to values, got {type(storage_options).__name__} "
            f"{storage_options!r}"
        )
    if storage_options and scheme in ("", "file", "local", "memory"):
        _ignored_for_local(url, scheme, storage_options)
    storage: Storage
    if scheme in ("", "file", "local"):
        path = parts.path if scheme else url
        if scheme and parts.netloc:
            path = parts.netloc + parts.path
        if not path:
            raise ConfigurationError(f"log URL {url!r} has no path")
        root = os.path.abspath(path)
        if os.path.exists(root) and not os.path.isdir(root):
            raise ConfigurationError(
                f"log URL {url!r}: {root} is a file, not a directory; a log is a directory (give a new path to "
                "create one)"
            )
        storage = LocalStorage(root, url=f"file://{root}")
    elif scheme == "memory":
        name = (parts.netloc + parts.path).strip("/")
        if not name:
            raise ConfigurationError(f"log URL {url!r}: memory:// needs a name, e.g. memory://test")
        storage = MemoryStorage(name)
    elif scheme in _OBJECT_STORES:
        root = (parts.netloc + parts.path).strip("/")
        if not parts.netloc:
            raise ConfigurationError(f"log URL {redact_url(url)!r} has no bucket: use {scheme}://BUCKET/PREFIX")
        protocol = {"s3a": "s3", "gcs": "gs", "abfss": "abfs", "az": "abfs"}.get(scheme, scheme)
        storage = _object_store(redact_url(url), protocol, root, dict(storage_options or {}))
    else:
        raise ConfigurationError(
            f"log URL {redact_url(url)!r} has an unsupported scheme {scheme!r}: use a local path, file://, "
            "memory://, s3://, gs:// or abfs:// (any fsspec filesystem with conditional create)"
        )
    if requests_log.wanted():
        storage = requests_log.RequestLoggingStorage(storage)
    if self_test:  # before this process's first write, never on open: reading never writes
        storage = WriteCheckedStorage(storage, self_test_storage)
    return storage


logger = get_logger("txnlog.storage")

#: Option names warned of as ignored for a local or in-memory log, once per process each.
_WARNED_LOCAL: set[tuple[str, ...]] = set()


def _ignored_for_local(url: str, scheme: str, options: Mapping[str, Any]) -> None:
    """Warn, once per process for each set of names, that storage options given for a log on local disk or in
    memory are ignored: a job written for an object store keeps its options when it is pointed at a local
    path (tests, a laptop), but a misspelled option must not go unsaid."""
    names = tuple(sorted(str(k) for k in options))
    if names in _WARNED_LOCAL:
        return
    _WARNED_LOCAL.add(names)
    where = "in memory" if scheme == "memory" else "on local disk"
    logger.warning(
        "storage option(s) %s do not apply to a log %s (%s) and are ignored: they configure object stores "
        "(s3://, gs://, abfs://)",
        ", ".join(repr(n) for n in names),
        where,
        redact_url(url),
    )


#: Values of the ``client`` storage option: which library talks to an object store.
CLIENTS = ("auto", "obstore", "fsspec")


def _object_store(url: str, protocol: str, root: str, options: dict[str, Any]) -> Storage:
    """S3 and Azure through obstore when their options allow (one round trip per request, bounded retries), else
    fsspec (s3fs, adlfs; GCS always gcsfs); see :mod:`txn_core.storage.obstore_s3` and
    :mod:`txn_core.storage.obstore_azure`. ``client`` (``auto``/``obstore``/``fsspec``) forces a choice."""
    client = str(options.pop("client", "auto")).lower()
    if client not in CLIENTS:
        raise ConfigurationError(
            f"storage option client={client!r} is not one of {list(CLIENTS)}: 'obstore' (S3 and Azure, one round "
            "trip per request), 'fsspec' (s3fs, gcsfs, adlfs) or 'auto' (obstore where it applies)"
        )
    if protocol == "s3":
        _check_client_kwargs(options)
        _type_config_kwargs(options)
    elif protocol in _FSSPEC_CLASSES:
        _check_fsspec_options(protocol, options)
    bucket, _, prefix = root.partition("/")
    through = _OBSTORE.get(protocol)
    if through is not None and client != "fsspec":
        config, storage_class, takes = through
        kwargs = config(options)
        if kwargs is not None and obstore_available():
            return storage_class(url, bucket, prefix, kwargs)
        if client == "obstore":
            raise ConfigurationError(
                f"storage option client='obstore' cannot be used with the options {sorted(options)}{takes}"
            )
    elif client == "obstore":
        raise ConfigurationError(
            f"storage option client='obstore' applies to s3:// and abfs:// URLs only; {url} is served by fsspec"
        )
    if protocol == "s3":
        _check_s3fs_options(options)
    return ObjectStoreStorage(url, protocol, root, options)


#: The stores obstore serves: how options translate (None: they cannot), the storage class, and what the
#: message of ``client='obstore'`` with options it cannot take says obstore takes.
_OBSTORE: dict[str, tuple[Callable[[dict[str, Any]], dict[str, Any] | None], type[ObstoreStorage], str]] = {
    "s3": (
        obstore_config,
        ObstoreS3Storage,
        " or with credentials from an AWS profile (AWS_PROFILE, ~/.aws/credentials): obstore takes key, secret, "
        "token, anon, endpoint_url and client_kwargs.endpoint_url/region_name (profiles and other s3fs settings "
        "need client='fsspec')",
    ),
    "abfs": (
        azure_obstore_config,
        ObstoreAzureStorage,
        ": obstore takes connection_string, account_name with account_key or sas_token, "
        "client_id/client_secret/tenant_id, anon=true and account_host (credentials from the environment and "
        "other adlfs settings need client='fsspec')",
    ),
}

#: The fsspec filesystem class of each store whose options are checked against its signature, and how the
#: store is named in the message.
_FSSPEC_CLASSES = {"gs": ("gcsfs.core", "GCSFileSystem", "GCS"), "abfs": ("adlfs", "AzureBlobFileSystem", "Azure")}
#: Options every fsspec filesystem takes beside its own parameters (its instance and listings caches).
_FSSPEC_PASSED_ON = frozenset(
    {"use_listings_cache", "listings_expiry_time", "max_paths", "skip_instance_cache", "asynchronous", "loop"}
)


def _check_fsspec_options(protocol: str, options: dict[str, Any]) -> None:
    """Refuse an option gcsfs or adlfs does not take, naming the closest one: both accept any keyword and drop
    what they do not know, so a misspelled ``endpoint`` (for ``endpoint_url``) went silently to the cloud's own
    endpoint (and, for GCS, to its credentials lookup)."""
    import importlib

    module, name, store = _FSSPEC_CLASSES[protocol]
    try:
        cls = getattr(importlib.import_module(module), name)
    except ImportError as exc:
        extra = "gcs" if protocol == "gs" else "azure"
        raise ConfigurationError(
            f"{protocol}:// needs {module.partition('.')[0]}: pip install 'txnlog[{extra}]'"
        ) from exc
    known = {n for n in inspect.signature(cls.__init__).parameters if n not in ("self", "kwargs")}
    _refuse_unknown(options, known | _FSSPEC_PASSED_ON, "", store + " takes {known}", store=store)


#: Options s3fs hands on to fsspec's instance cache and to its aiobotocore session, beside its own parameters.
_S3FS_PASSED_ON = frozenset(
    {
        "use_listings_cache",
        "listings_expiry_time",
        "max_paths",
        "skip_instance_cache",
        "batch_size",
        "profile",
        "session_vars",
        "event_hooks",
        "include_builtin_handlers",
    }
)


def _check_s3fs_options(options: dict[str, Any]) -> None:
    """Refuse an option s3fs does not know, naming the closest known one: a misspelled option (``endpoint``
    for ``endpoint_url``) made the default client give way to s3fs, which then failed at the first request
    with a TypeError from deep inside aiobotocore."""
    try:
        import s3fs
    except ImportError:  # pragma: no cover - s3fs is a dependency; fsspec names what is missing
        return
    known = {n for n in inspect.signature(s3fs.S3FileSystem.__init__).parameters if n not in ("self", "kwargs")}
    _refuse_unknown(
        options,
        known | _S3FS_PASSED_ON,
        "",
        "S3 takes {known} (endpoint_url for a custom endpoint, key and secret for credentials)",
    )


def _check_client_kwargs(options: dict[str, Any]) -> None:
    """Refuse a ``client_kwargs`` key botocore's client does not take (``client_kwargs.endpoint`` for
    ``client_kwargs.endpoint_url``), naming the closest one: unchecked, it made the default client give way
    to s3fs, which failed at the first request with a TypeError from inside aiobotocore."""
    client_kwargs = options.get("client_kwargs")
    if client_kwargs is None:
        return
    if not isinstance(client_kwargs, dict):
        raise ConfigurationError(
            f"storage option client_kwargs must be a mapping (e.g. client_kwargs.endpoint_url=...), got "
            f"{type(client_kwargs).__name__}"
        )
    try:
        from botocore.session import Session
    except ImportError:  # pragma: no cover - s3fs brings botocore; without it s3fs names what is missing
        return
    # s3fs passes botocore's Config itself, built from config_kwargs: a client_kwargs.config would clash
    known = {
        n for n in inspect.signature(Session.create_client).parameters if n not in ("self", "service_name", "config")
    }
    _refuse_unknown(
        client_kwargs, known, "client_kwargs.", "client_kwargs takes {known} (botocore settings go in config_kwargs)"
    )


#: botocore Config settings txnlog reads as numbers when given as text (Spark and the CLI pass text).
_CONFIG_SECONDS = ("connect_timeout", "read_timeout")
_CONFIG_COUNTS = ("max_attempts", "total_max_attempts")


def _type_config_kwargs(options: dict[str, Any]) -> None:
    """Turn ``config_kwargs`` timeouts (seconds) and retry counts given as text into numbers, in place, for
    both clients (botocore compares them with numbers and fails with a TypeError on text); refuse a value
    that is no positive finite number of seconds, or no whole count, naming the option."""
    config_kwargs = options.get("config_kwargs")
    if not isinstance(config_kwargs, dict):
        return
    typed = dict(config_kwargs)
    for key in _CONFIG_SECONDS:
        if key in typed:
            typed[key] = _number(typed[key], f"config_kwargs.{key}", float)
            if not 0 < typed[key] < 1e9:
                raise ConfigurationError(f"storage option config_kwargs.{key} must be a positive number of seconds")
    retries = typed.get("retries")
    if isinstance(retries, dict):
        retries = dict(retries)
        for key in _CONFIG_COUNTS:
            if key in retries:
                retries[key] = _number(retries[key], f"config_kwargs.retries.{key}", int)
                if retries[key] < (1 if key == "total_max_attempts" else 0):
                    raise ConfigurationError(f"storage option config_kwargs.retries.{key} is too small")
        typed["retries"] = retries
    options["config_kwargs"] = typed


def _number(value: object, name: str, kind: type[float] | type[int]) -> Any:
    """``value`` (a number or its text) as ``kind``; a whole count is never taken from a fraction."""
    if isinstance(value, bool) or value is None:
        raise ConfigurationError(f"storage option {name} must be a number, got {value!r}")
    try:
        return kind(str(value))
    except ValueError as exc:
        raise ConfigurationError(f"storage option {name} must be a number, got {value!r}") from exc


def _refuse_unknown(given: dict[str, Any], known: set[str], prefix: str, takes: str, store: str = "S3") -> None:
    """:class:`ConfigurationError` naming each of ``given``'s keys not in ``known`` with the closest known one."""
    unknown = sorted(str(n) for n in given if n not in known)
    if unknown:
        hints = [
            f"{prefix}{n!r} (did you mean {close[0]!r}?)"
            if (close := difflib.get_close_matches(n, known, 1))
            else f"{prefix}{n!r}"
            for n in unknown
        ]
        takes = takes.format(known=", ".join(sorted(known)))
        raise ConfigurationError(f"unknown {store} storage option(s) {', '.join(hints)}; {takes}")


#: Per URL scheme: the conditional write a create-if-absent is, and what makes the client send it.
_CONDITIONAL = {
    "s3": (
        "If-None-Match: *",
        "for S3 make sure s3fs >= 2025.7.0 and botocore > 1.35.20 are installed (or use obstore, the default).",
    ),
    "gs": (
        "ifGenerationMatch=0",
        "for GCS make sure gcsfs >= 2025.7.0 is installed (it sends ifGenerationMatch=0 on pipe_file(..., "
        "mode='create')); an emulator must honour it (fake-gcs-server >= 1.54 does on uploads under 50 MB).",
    ),
    "abfs": (
        "If-None-Match: *",
        "for Azure use obstore (the default with credentials among the options) or adlfs >= 2025.7.0 (which sends "
        "If-None-Match: * for pipe_file(..., mode='create'), upload_blob(overwrite=False)).",
    ),
}


def _scheme(url: str) -> str:
    scheme = urlsplit(url).scheme.lower()
    return {"s3a": "s3", "gcs": "gs", "abfss": "abfs", "az": "abfs"}.get(scheme, scheme)


def _conditional_write(url: str) -> str:
    return _CONDITIONAL.get(_scheme(url), ("a create-if-absent", ""))[0]


def _conditional_client(url: str) -> str:
    return _CONDITIONAL.get(_scheme(url), ("", "make sure the store and its client support a create-if-absent."))[1]


def self_test_storage(storage: Storage) -> None:
    """Refuse a backend that silently overwrites: a second create of one key must fail.

    Creates ``_txnlog/selftest/<uuid>`` twice, requires :class:`ObjectExistsError` the second time, and
    that the first content survived; deletes the object afterwards.
    """
    key = f"{SELFTEST_PREFIX}{uuid.uuid4().hex}"
    first, second = b"txnlog-selftest-first-" + uuid.uuid4().bytes, b"txnlog-selftest-second"
    try:
        create_resolving(storage, key, [first], first)  # retries "please retry" answers
    except StoragePermissionError as exc:
        raise StoragePermissionError(
            f"cannot write to {storage.describe()}: the store refuses writes for want of permission ({exc}). "
            "Reading needs no write access; writing needs write permission on the path or bucket."
        ) from exc
    except StorageError as exc:
        raise StorageError(
            f"cannot write to {storage.describe()}: {exc}. Check the URL, the bucket and the credentials "
            "passed as storage options."
        ) from exc
    try:
        try:
            storage.create(key, [second])
        except ObjectExistsError:
            pass
        else:
            raise StorageContractError(
                f"{storage.describe()} silently overwrote an existing object on a create-if-absent: this "
                f"backend does not honour conditional writes ({_conditional_write(storage.url)}), so txnlog cannot "
                "coordinate on it. Use a store that does (AWS S3, GCS, Azure Blob, MinIO, SeaweedFS, local disk); "
                f"{_conditional_client(storage.url)}"
            )
        if storage.read(key) != first:
            raise StorageContractError(
                f"{storage.describe()} replaced an object's content on a failed create-if-absent; refusing it."
            )
    finally:
        storage.delete(key)
