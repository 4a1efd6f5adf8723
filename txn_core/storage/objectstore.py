"""Object-store storage over fsspec (S3 via s3fs, GCS via gcsfs, Azure via adlfs; PROTOCOL.md "Storage").

Create-if-absent is a conditional put: ``pipe_file(path, data, mode="create")``, which s3fs sends with
``If-None-Match: *`` (gcsfs: ``ifGenerationMatch=0``; adlfs: ``overwrite=False``, sent as
``If-None-Match: *``). A PUT is atomic on these stores, so objects are complete-or-absent. Errors are normalised:

* FileExistsError, or any cause carrying HTTP 412 / ``PreconditionFailed`` -> :class:`ObjectExistsError`
* HTTP 409 (``ConditionalRequestConflict``), 429, 503 ``SlowDown`` -> :class:`RetryableStorageError`
* ``NoSuchBucket``, Azure's ``ContainerNotFound``, or "not found" on the upload (gcsfs: the bucket is missing)
  -> :class:`StorageError`: nothing was written
* anything else -> :class:`UnknownOutcomeError` (resolved by reading back; see ``create_resolving``)

GCS goes through gcsfs's ``GCSFileSystem`` of ``gcsfs.core``, built directly: what ``fsspec.filesystem("gs")``
returns since gcsfs 2026 (``ExtendedGcsFileSystem``, unless ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false``) asks each
bucket's type over gRPC before its first request and, where that fails (an emulator, a proxy), waits out a 60 s
timeout, again at every request, before falling back to the same JSON API. txnlog needs none of its
zonal-bucket features.

A write refused for permission is a :class:`StoragePermissionError`; a read s3fs answers with PermissionError
stays a plain :class:`StorageError` (s3fs raises it for other 403s too). Messages put a hint first where the
error shows a setup mistake (:mod:`txn_core.storage.hints`: a missing bucket, rejected credentials, no
answer at the endpoint).

Listing caches are disabled: ``exists`` and ``list`` always ask the store. Credentials live only in the
fsspec filesystem object; :meth:`describe` and every message use the URL without them.
"""

from __future__ import annotations

import builtins
from typing import Any

from txn_core.errors import (
    ObjectExistsError,
    ObjectNotFoundError,
    RetryableStorageError,
    StorageError,
    StoragePermissionError,
    UnknownOutcomeError,
)
from txn_core.storage.base import LIST_PAGE, Chunks, ListPage, Storage
from txn_core.storage.hints import causes, hint

_RETRY_CODES = {
    "409",
    "429",
    "500",
    "502",
    "503",
    "504",
    "SlowDown",
    "ConditionalRequestConflict",
    "RequestTimeout",
    "Throttling",
    "ThrottlingException",
    "InternalError",
}


def _status_codes(exc: BaseException) -> set[str]:
    """HTTP status codes and error codes found on ``exc`` and its causes: the response objects' fields
    (botocore's ``response``, ``status``/``status_code``/``code`` attributes), never the message text, which
    holds object keys that end in zero-padded slot numbers (``...00412``). s3fs keeps botocore's error, with
    its response, as the cause of the error it raises. No code at all means an unknown outcome."""
    codes: set[str] = set()
    for cur in causes(exc):
        response = getattr(cur, "response", None)
        if isinstance(response, dict):
            meta = response.get("ResponseMetadata", {})
            status = meta.get("HTTPStatusCode")
            if status is not None:
                codes.add(str(status))
            err = response.get("Error", {})
            if err.get("Code"):
                codes.add(str(err["Code"]))
        for attr in ("status", "status_code", "code"):
            value = getattr(cur, attr, None)
            if isinstance(value, int | str) and value:
                codes.add(str(value))
        error_code = getattr(cur, "error_code", None)  # azure-core's errors: the service's error code
        if error_code:
            codes.add(str(getattr(error_code, "value", error_code)))
    return codes


def classify_write_error(exc: BaseException) -> type[StorageError]:
    """Map an exception from a conditional put to lost / retry / unknown (see module doc)."""
    if isinstance(exc, FileExistsError):
        return ObjectExistsError
    if isinstance(exc, FileNotFoundError):  # an upload finds nothing: the bucket is missing (gcsfs)
        return StorageError
    if isinstance(exc, EndpointUnansweredError):  # no connection was made: nothing was sent
        return StorageError
    if isinstance(exc, PermissionError):
        return StoragePermissionError
    codes = _status_codes(exc)
    if "403" in codes or "AccessDenied" in codes:
        return StoragePermissionError
    if "412" in codes or "PreconditionFailed" in codes:
        return ObjectExistsError
    if codes & _RETRY_CODES:
        return RetryableStorageError
    if "NoSuchBucket" in codes or "ContainerNotFound" in codes:
        return StorageError
    return UnknownOutcomeError


#: Protocols listed by one request per page (GCS's JSON API; the Azure SDK under adlfs), not by fsspec's ``ls``.
_PAGED = ("gs", "abfs")


def _azure_name(item: Any) -> str:
    """A List Blobs item's name: a sub-prefix keeps its ``/``; an ADLS Gen2 directory blob gets one."""
    name = str(item.name)
    metadata = getattr(item, "metadata", None) or {}
    folder = metadata.get("hdi_isfolder") or metadata.get("Hdi_isfolder") or metadata.get("is_directory")
    return name.rstrip("/") + "/" if str(folder).lower() == "true" else name


class EndpointUnansweredError(Exception):
    """No connection could be made to an endpoint that has never answered (gcsfs; not an ``OSError`` nor an
    aiohttp error, so that gcsfs's retries let it through)."""


class ObjectStoreStorage(Storage):
    """A log rooted at ``bucket/prefix`` of an fsspec filesystem that supports ``mode="create"``."""

    def __init__(self, url: str, protocol: str, root: str, storage_options: dict[str, Any] | None) -> None:
        self.url = url
        self.protocol = protocol
        self.root = root.rstrip("/")
        self._options = dict(storage_options or {})
        self._fs: Any = None

    def __getstate__(self) -> dict[str, object]:
        return {"url": self.url, "protocol": self.protocol, "root": self.root, "options": self._options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["url"], state["protocol"], state["root"], state["options"])  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"ObjectStoreStorage({self.url})"

    @property
    def fs(self) -> Any:
        if self._fs is None:
            import fsspec

            options = dict(self._options)
            options.setdefault("use_listings_cache", False)
            options.setdefault("skip_instance_cache", True)
            if self.protocol == "gs":
                from gcsfs.core import GCSFileSystem  # not fsspec's "gs": no gRPC probe (module doc)

                session = dict(options.pop("session_kwargs", None) or {})
                session["trace_configs"] = [*(session.get("trace_configs") or ()), self._unanswered_trace()]
                self._fs = GCSFileSystem(**options, session_kwargs=session)
            else:
                self._fs = fsspec.filesystem(self.protocol, **options)
        return self._fs

    def _unanswered_trace(self) -> Any:
        """An aiohttp trace for gcsfs's session: until the endpoint has answered once, a connection that
        cannot be made raises :class:`EndpointUnansweredError`, which gcsfs does not retry. gcsfs retries a
        failed connection 6 times with backoff (about 35 s) and has no setting to bound it; at the first
        request that is a wrong endpoint or a store that is down, reported at once. Once a connection was
        made (a request may have reached the store) or anything answered, a failed connection is a blip, and
        gcsfs's retries stand: a write that may have landed is never reported as one that did not."""
        import aiohttp

        answered = False

        async def on_end(*_: Any) -> None:  # a response, or a connection made: the endpoint is there
            nonlocal answered
            answered = True

        async def on_exception(_session: Any, _context: Any, params: Any) -> None:
            if not answered and isinstance(params.exception, aiohttp.ClientConnectorError):
                raise EndpointUnansweredError(str(params.exception)) from params.exception

        trace = aiohttp.TraceConfig()
        trace.on_request_end.append(on_end)
        trace.on_connection_create_end.append(on_end)
        trace.on_request_exception.append(on_exception)
        return trace

    def _path(self, key: str) -> str:
        return f"{self.root}/{key}"

    def _hint(self, exc: BaseException, *, no_bucket: bool = False) -> str:
        endpoint = self._options.get("endpoint_url") or (self._options.get("client_kwargs") or {}).get("endpoint_url")
        if endpoint is None and self.protocol == "abfs":
            endpoint = self._options.get("account_host")
        return hint(exc, self.root.partition("/")[0], endpoint, self.protocol, no_bucket=no_bucket)

    def _refused(self, what: str, exc: BaseException) -> StoragePermissionError:
        """The error of a write refused for want of permission (or for bad credentials, as the hint says)."""
        why = self._hint(exc).removesuffix(": ") or "no permission (read-only credentials?)"
        return StoragePermissionError(f"the store refused to {what}: {why}")

    def _read_refused(self, what: str, exc: PermissionError) -> StorageError:
        """A read, list or lookup s3fs answered with PermissionError: a plain :class:`StorageError`, not a
        permission error, because s3fs raises it for other refusals too (an archived object, a skewed clock, an
        expired token); its words name the likely causes, and the client's error is kept. A refused HEAD has
        no body, so a wrong secret and a missing permission look alike there."""
        why = self._hint(exc) or "refused (HTTP 403): check the credentials, and that they may read this path: "
        return StorageError(f"{what} failed: {why}{exc!r}")

    def create(self, key: str, chunks: Chunks) -> None:
        data = chunks[0] if len(chunks) == 1 else b"".join(bytes(c) for c in chunks)
        data = bytes(data) if not isinstance(data, bytes) else data
        try:
            self.fs.pipe_file(self._path(key), data, mode="create")
        except Exception as exc:
            kind = classify_write_error(exc)
            if kind is ObjectExistsError:
                raise ObjectExistsError(f"{key} already exists") from exc
            if kind is RetryableStorageError:
                raise RetryableStorageError(f"store asked to retry the create of {key}: {exc}") from exc
            if kind is StoragePermissionError:
                raise self._refused(f"create {key}", exc) from exc
            if kind is StorageError:
                missing = isinstance(exc, FileNotFoundError)
                raise StorageError(f"create of {key} failed: {self._hint(exc, no_bucket=missing)}{exc!r}") from exc
            raise UnknownOutcomeError(
                f"create of {key} failed with an unknown outcome: {self._hint(exc)}{exc!r}"
            ) from exc

    def read(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        try:
            if start is None and end is None:
                return bytes(self.fs.cat_file(self._path(key)))
            return bytes(self.fs.cat_file(self._path(key), start=start, end=end))
        except FileNotFoundError as exc:
            raise ObjectNotFoundError(f"{key} does not exist") from exc
        except PermissionError as exc:
            raise self._read_refused(f"read of {key}", exc) from exc
        except Exception as exc:
            codes = _status_codes(exc)
            if "404" in codes or "NoSuchKey" in codes:
                raise ObjectNotFoundError(f"{key} does not exist") from exc
            if "416" in codes or "InvalidRange" in codes:
                return b""
            raise StorageError(f"read of {key} failed: {self._hint(exc)}{exc!r}") from exc

    def exists(self, key: str) -> bool:
        if self.protocol in ("s3", "gs", "abfs"):
            return self._head(key)
        try:
            self.fs.info(self._path(key), refresh=True)
            return True
        except FileNotFoundError:
            return False
        except TypeError:
            return bool(self.fs.exists(self._path(key)))
        except PermissionError as exc:
            raise self._read_refused(f"existence check of {key}", exc) from exc
        except Exception as exc:
            raise StorageError(f"existence check of {key} failed: {self._hint(exc)}{exc!r}") from exc

    def _head(self, key: str) -> bool:
        """One metadata request: s3fs's, gcsfs's and adlfs's ``info`` add a listing on a miss, looking for a
        directory (behind the latency proxy an absent object cost gcsfs 2.2 RTT and adlfs 3 against 1)."""
        bucket, _, path = self._path(key).partition("/")
        try:
            if self.protocol == "s3":
                self.fs.call_s3("head_object", Bucket=bucket, Key=path)
            elif self.protocol == "gs":
                self.fs.call("GET", "b/{}/o/{}", bucket, path, json_out=True)  # GCS's JSON API
            else:
                from fsspec.asyn import sync

                container, blob_name, _ = self.fs.split_path(self._path(key))  # also container@account roots

                async def head() -> None:  # Get Blob Properties, through the Azure SDK under adlfs
                    async with self.fs.service_client.get_blob_client(container, blob_name) as blob:
                        await blob.get_blob_properties()

                sync(self.fs.loop, head)
            return True
        except FileNotFoundError:
            return False
        except PermissionError as exc:
            raise self._read_refused(f"existence check of {key}", exc) from exc
        except Exception as exc:
            codes = _status_codes(exc)
            if "ContainerNotFound" in codes:  # Azure names it even on a HEAD (x-ms-error-code)
                raise StorageError(f"existence check of {key} failed: {self._hint(exc)}{exc!r}") from exc
            if "404" in codes or "NoSuchKey" in codes or "NotFound" in codes:
                return False
            raise StorageError(f"existence check of {key} failed: {self._hint(exc)}{exc!r}") from exc

    def size(self, key: str) -> int:
        try:
            return int(self.fs.info(self._path(key))["size"])
        except FileNotFoundError as exc:
            raise ObjectNotFoundError(f"{key} does not exist") from exc

    def mtime_ms(self, key: str) -> int | None:
        try:
            info = self.fs.info(self._path(key))
        except FileNotFoundError as exc:
            raise ObjectNotFoundError(f"{key} does not exist") from exc
        value = info.get("LastModified") or info.get("mtime") or info.get("updated")
        if value is None:
            return None
        if hasattr(value, "timestamp"):
            return int(value.timestamp() * 1000)
        try:
            return int(float(value) * 1000)
        except (TypeError, ValueError):
            return None

    def list(self, prefix: str) -> list[str]:
        base = self._path(prefix).rstrip("/")
        if self.protocol in _PAGED:
            return self._paged_list(prefix, base)
        try:
            self.fs.invalidate_cache(base)
            entries = self.fs.ls(base, detail=True)
        except FileNotFoundError as exc:
            codes = _status_codes(exc)
            if "NoSuchBucket" in codes or "ContainerNotFound" in codes:  # "not found" for a missing bucket too
                raise self._list_failed(prefix, exc) from exc
            return []
        except Exception as exc:
            raise self._list_failed(prefix, exc) from exc
        out = []
        for e in entries:
            full = str(e["name"]).rstrip("/")
            if full == base:
                continue  # some stores (SeaweedFS) list an emptied "directory" as itself
            name = full.rsplit("/", 1)[-1]
            if not name:
                continue
            out.append(name + "/" if e.get("type") == "directory" else name)
        return sorted(set(out))

    def _list_failed(self, prefix: str, exc: BaseException, *, no_bucket: bool = False) -> StorageError:
        """The error of a listing of ``prefix`` that failed with ``exc``: refused for want of permission
        (:meth:`_read_refused`), else a :class:`StorageError` with the hint."""
        what = f"list of {prefix or 'the log'}"
        if isinstance(exc, PermissionError):
            return self._read_refused(what, exc)
        return StorageError(f"{what} failed: {self._hint(exc, no_bucket=no_bucket)}{exc!r}")

    def _paged_list(self, prefix: str, base: str) -> builtins.list[str]:
        """Every page of :meth:`_page`, one request each (gcsfs's ``ls`` says "not found" alike for an empty
        prefix and a missing bucket, and adlfs's walks every sub-prefix)."""
        out: set[str] = set()
        token: str | None = None
        while True:
            names, token = self._page(prefix, base, token, LIST_PAGE)
            out.update(names)
            if not token:
                return sorted(out)

    def _page(self, prefix: str, base: str, token: str | None, limit: int) -> tuple[builtins.list[str], str | None]:
        """One listing request: the first ``limit`` direct children of ``base`` after ``token`` (names and
        sub-prefixes, as the store counts them), sorted, and the next page's token (None: these were the last)."""
        if self.protocol == "gs":
            return self._gcs_page(prefix, base, token, limit)
        return self._azure_page(prefix, base, token, limit)

    def _azure_page(
        self, prefix: str, base: str, token: str | None, limit: int
    ) -> tuple[builtins.list[str], str | None]:
        """:meth:`_page` through the Azure SDK's container client under adlfs (List Blobs with a delimiter and
        ``maxresults``); a missing container is an error naming it, an empty prefix lists as empty. On ADLS
        Gen2 (a hierarchical namespace) a directory is listed both as a prefix and as an empty blob marked
        ``hdi_isfolder``: both are the one sub-prefix ``name/``."""
        from fsspec.asyn import sync

        container, key, _ = self.fs.split_path(base)  # adlfs's own: also container@account.dfs... roots
        path = f"{key}/" if key else ""

        async def one_page() -> tuple[builtins.list[str], str | None]:
            async with self.fs.service_client.get_container_client(container) as cc:
                listing = cc.walk_blobs(
                    name_starts_with=path, delimiter="/", include=["metadata"], results_per_page=limit
                )
                pages = listing.by_page(token)
                names: builtins.list[str] = []
                async for page in pages:
                    names = [_azure_name(item)[len(path) :] async for item in page]
                    break
                return names, pages.continuation_token or None

        try:
            names, next_token = sync(self.fs.loop, one_page)
        except Exception as exc:
            raise self._list_failed(prefix, exc) from exc
        return sorted({n for n in names if n not in ("", "/")}), next_token

    def _gcs_page(self, prefix: str, base: str, token: str | None, limit: int) -> tuple[builtins.list[str], str | None]:
        """One listing request through GCS's JSON API: the first ``limit`` names after ``token`` (items and
        sub-prefixes together, as ``maxResults`` counts them), sorted, and the next page's token (None: these
        were the last)."""
        bucket, _, path = (base + "/").partition("/")
        params: dict[str, Any] = {"prefix": path, "delimiter": "/", "maxResults": limit}
        if token:
            params["pageToken"] = token
        try:
            page = self.fs.call("GET", "b/{}/o", bucket, json_out=True, **params)
        except FileNotFoundError as exc:  # the API answers 404 to a listing only for a missing bucket
            raise self._list_failed(prefix, exc, no_bucket=True) from exc
        except Exception as exc:
            raise self._list_failed(prefix, exc) from exc
        names = {p[len(path) :] for p in page.get("prefixes", ())}
        names.update(str(item["name"])[len(path) :] for item in page.get("items", ()))
        names.discard("")
        names.discard("/")
        return sorted(names), page.get("nextPageToken") or None

    def list_page(self, prefix: str, limit: int = LIST_PAGE) -> ListPage | None:
        if self.protocol in _PAGED:  # one request, which stops after a page
            names, token = self._page(prefix, self._path(prefix).rstrip("/"), None, limit)
            # GCS counts items and sub-prefixes together; an emulator may count items alone
            return names[:limit], token is None and len(names) <= limit
        return None  # s3fs's listings read every page before they answer

    def delete(self, key: str) -> None:
        try:
            self.fs.rm_file(self._path(key))
        except FileNotFoundError:
            return
        except Exception as exc:
            codes = _status_codes(exc)
            if "404" in codes or "NoSuchKey" in codes:
                return
            if isinstance(exc, PermissionError) or "403" in codes or "AccessDenied" in codes:
                raise self._refused(f"delete {key}", exc) from exc
            raise StorageError(f"delete of {key} failed: {self._hint(exc)}{exc!r}") from exc
