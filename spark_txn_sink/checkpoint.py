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

Where the checkpoint is: ``.option("checkpointLocation", DIR)`` reaches the sink as an option. Without it,
Spark checkpoints under the session's ``spark.sql.streaming.checkpointLocation`` root (Spark's
``ResolveWriteToStream.resolveCheckpointLocation``): at ``<root>/<queryName>``, or at ``<root>/<a random
UUID>`` for an unnamed query (a new checkpoint at every start). A Python sink is not told that location:
its planning and commit workers see neither the root nor the session conf; only its write tasks do
(Spark copies every ``spark.*`` conf a session sets into its tasks' local properties, beside the query
id). The tasks hand the root, the query name and the query id to the commit in their messages
(:class:`SessionCheckpoint`), and the commit finds Spark's location from them (:func:`locate`).

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


#: The task-local property that carries the session's checkpoint root (the SQL conf of the same name).
SESSION_ROOT_PROPERTY = "spark.sql.streaming.checkpointLocation"


@dataclass(frozen=True, slots=True)
class SessionCheckpoint:
    """A streaming query checkpointed under the session's root, as its write tasks see it."""

    root: str
    query_name: str | None
    query_id: str


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


def locate(session: SessionCheckpoint, log_url: str, storage_options: dict[str, Any] | None) -> str:
    """Spark's checkpoint location of ``session``'s query: ``<root>/<queryName>``, or, for an unnamed query,
    the directory under the root whose ``metadata`` holds the query id (Spark named it with a random UUID)."""
    root = session.root.rstrip("/")
    if session.query_name is not None:
        location = f"{root}/{session.query_name}"
        found = read_query_id(location, log_url, storage_options)
        if found != session.query_id:
            raise CheckpointError(
                f"{location}/metadata holds query {found}, but the query writing is {session.query_id}: "
                "two queries share the name under spark.sql.streaming.checkpointLocation; give each query "
                "its own queryName or .option('checkpointLocation', DIR)"
            )
        return location
    fs, path = _open(root, log_url, storage_options)
    try:
        names = sorted(fs.ls(path, detail=False))
    except OSError as exc:
        raise CheckpointError(f"cannot list the session checkpoint root {root}: {exc}") from exc
    for name in names:
        child = f"{root}/{name.rstrip('/').rsplit('/', 1)[-1]}"
        try:
            if read_query_id(child, log_url, storage_options) == session.query_id:
                return child
        except CheckpointError:
            continue  # not a query's checkpoint (or another query's)
    raise CheckpointError(
        f"no checkpoint of query {session.query_id} under the session root {root}; the txnlog sink reads the "
        "batch offsets from it: give the query a queryName or .option('checkpointLocation', DIR)"
    )
