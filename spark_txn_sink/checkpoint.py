"""Reading a streaming query's Spark checkpoint: its query id and the source offsets of a batch.

The sink reads two files Spark writes, through fsspec (so the checkpoint may be on local disk or any
fsspec filesystem):

``<checkpoint>/metadata``
    JSON ``{"id": "<query id>"}``, written when the query first starts and never changed: the query id
    is stable across restarts on one checkpoint, and new for a new checkpoint.
``<checkpoint>/offsets/<batchId>``
    Written by Spark *before* batch ``batchId`` runs and never rewritten: line 1 ``v1``, line 2 the batch
    metadata JSON, then one line per source of the query, in plan order: that source's end offset JSON
    for this batch, or ``-`` when the source has none yet. A replay of the batch after a restart reads
    the same file, so it sees the same end offsets.

Storage options: the log's ``storage.*`` options are used when the checkpoint is on the same kind of
filesystem as the log (same URL scheme); otherwise fsspec's defaults (environment credentials).
Nothing is cached: a checkpoint directory can be deleted and recreated between queries of one session.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from txn_core import ConfigurationError

_ALIASES = {"s3a": "s3", "gcs": "gs", "abfss": "abfs", "": "file", "local": "file"}


class CheckpointError(ConfigurationError):
    """The checkpoint could not be read or is not in a format this sink understands."""


@dataclass(frozen=True, slots=True)
class BatchOffsets:
    """The end offsets of every source of one batch, as Spark recorded them (None: no offset)."""

    batch_id: int
    sources: tuple[Any, ...]


def _scheme(url: str) -> str:
    scheme = urlsplit(url).scheme.lower()
    if len(scheme) == 1:  # a Windows drive letter
        scheme = ""
    return _ALIASES.get(scheme, scheme)


def _open(location: str, log_url: str, storage_options: dict[str, Any] | None) -> tuple[Any, str]:
    import fsspec

    options = storage_options if storage_options and _scheme(location) == _scheme(log_url) else {}
    try:
        fs, root = fsspec.core.url_to_fs(location, **options)
    except (ValueError, ImportError) as exc:
        raise CheckpointError(
            f"cannot open checkpoint location {location!r} with fsspec ({exc}). The txnlog sink reads the "
            "query id and the batch offsets from the checkpoint: put it on a filesystem fsspec supports (a "
            "local directory, s3://, gs://, abfs://) and install its fsspec package"
        ) from exc
    return fs, root.rstrip("/")


def _read_text(location: str, name: str, log_url: str, storage_options: dict[str, Any] | None) -> str:
    fs, root = _open(location, log_url, storage_options)
    path = f"{root}/{name}"
    try:
        with fs.open(path, "rb") as f:
            data: bytes = f.read()
    except FileNotFoundError as exc:
        raise CheckpointError(
            f"checkpoint file {location.rstrip('/')}/{name} does not exist; the txnlog sink needs Spark's "
            "checkpoint on a filesystem this process can read (an absolute path or URL), with asynchronous "
            "progress tracking off"
        ) from exc
    except OSError as exc:
        raise CheckpointError(f"cannot read checkpoint file {location.rstrip('/')}/{name}: {exc}") from exc
    return data.decode("utf-8")


def read_query_id(location: str, log_url: str, storage_options: dict[str, Any] | None) -> str:
    """The streaming query id stored in ``<location>/metadata``."""
    text = _read_text(location, "metadata", log_url, storage_options)
    try:
        value = json.loads(text.splitlines()[0])
        query_id = value["id"]
    except (IndexError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{location}/metadata is not Spark query metadata: {text[:200]!r}") from exc
    if not isinstance(query_id, str) or not query_id:
        raise CheckpointError(f"{location}/metadata has no query id: {text[:200]!r}")
    return query_id


def read_batch_offsets(
    location: str, batch_id: int, log_url: str, storage_options: dict[str, Any] | None
) -> BatchOffsets:
    """The end offsets of every source for ``batch_id`` from ``<location>/offsets/<batch_id>``."""
    text = _read_text(location, f"offsets/{batch_id}", log_url, storage_options)
    lines = text.split("\n")
    if not lines or lines[0].strip() != "v1":
        raise CheckpointError(
            f"{location}/offsets/{batch_id} starts with {lines[0][:20]!r}, not 'v1': an offset log format "
            "this sink does not know (a newer Spark?). Remove the consumerGroup option or upgrade txnlog."
        )
    sources: list[Any] = []
    for raw in lines[2:]:
        line = raw.strip()
        if not line:
            continue
        if line == "-":
            sources.append(None)
            continue
        try:
            sources.append(json.loads(line))
        except ValueError:
            sources.append(line)  # not JSON: some other source's offset format, never ours
    return BatchOffsets(batch_id, tuple(sources))
