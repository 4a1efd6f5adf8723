"""Staged writes: data written by many workers, committed by reference (PROTOCOL.md "Staged data").

Distributed writers (Spark tasks) write their rows as **staged objects** -- complete entry-format DATA
objects under ``staging/<owner>/<batch>/`` -- and return a :class:`StagedRef` each. One committer then
appends a small ``DATA_REF`` entry per staged object to the target partition inside a transaction; the
rows become visible when that transaction commits, exactly like inline data. The committer never reads
or re-sends the rows, and a staged object that no committed reference names (a failed or duplicate task
attempt, a zombie task of a crashed run) is never visible: it is garbage, removed by
:func:`delete_unreferenced` after the batch and by :func:`txn_core.ops.maintenance.sweep_staging` by age.

Crash windows: a worker dying mid-write leaves at most a temp file (local) or nothing (object stores);
a committer dying before PrepareCommit leaves references in an ongoing transaction, which is aborted
(its staged objects are then garbage); after PrepareCommit the references are committed, and their
staged objects are never deleted by the cleanup (it only deletes keys not in the committed set).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from txn_core.clock import Clock
from txn_core.errors import ConfigurationError, ObjectExistsError
from txn_core.format import paths
from txn_core.format.entry import EntryHeader, EntryKind, Payload
from txn_core.storage.base import Storage, create_resolving

_SAFE = re.compile(r"[^A-Za-z0-9._-]")


@dataclass(frozen=True, slots=True)
class StagedRef:
    """A staged object holding ``rows`` records for ``topic``/``partition``."""

    topic: str
    partition: int
    key: str
    size: int
    crc: int
    rows: int
    nbytes: int

    def to_json(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "partition": self.partition,
            "key": self.key,
            "size": self.size,
            "crc": self.crc,
            "rows": self.rows,
            "nbytes": self.nbytes,
        }

    @classmethod
    def from_json(cls, v: dict[str, Any]) -> StagedRef:
        return cls(
            v["topic"],
            int(v["partition"]),
            v["key"],
            int(v["size"]),
            int(v["crc"]),
            int(v["rows"]),
            int(v.get("nbytes", 0)),
        )


def staging_prefix(owner: str, batch: str | int) -> str:
    """Where the staged objects of one batch of one owner (a transactional id) go."""
    return f"{paths.STAGING}{_SAFE.sub('_', owner)}/{_SAFE.sub('_', str(batch))}/"


def name_prefix(topic: str, partition: int) -> str:
    """How the names of a partition's staged objects begin (the staging sweep keeps a partition's by it)."""
    return f"{topic}-{partition:05d}-"


def write_staged(
    storage: Storage,
    prefix: str,
    topic: str,
    partition: int,
    batches: Iterable[pa.RecordBatch],
    schema: pa.Schema,
    *,
    tag: str = "",
    clock: Clock,
) -> StagedRef | None:
    """Write ``batches`` as one staged object under ``prefix``; None when there are no rows. ``clock``
    stamps the object's header (the log's clock)."""
    batch_list = [b for b in batches if b.num_rows]
    if not batch_list:
        return None
    payload = Payload.of_arrow(batch_list, schema)
    rows = sum(b.num_rows for b in batch_list)
    header = EntryHeader(
        EntryKind.DATA, 0, rows, -1, 0, -1, None, clock(), payload.length, payload.crc, uuid.uuid4().bytes
    ).encode()
    name = f"{name_prefix(topic, partition)}{_SAFE.sub('_', tag)}-{uuid.uuid4().hex}"
    key = prefix + name
    try:
        create_resolving(storage, key, [header, *payload.chunks], header)
    except ObjectExistsError as exc:  # a uuid collision: impossible in practice
        raise ConfigurationError(f"staged object {key} exists already") from exc
    return StagedRef(
        topic, partition, key, len(header) + payload.length, payload.crc, rows, sum(b.nbytes for b in batch_list)
    )


def reference_payload(ref: StagedRef) -> bytes:
    import json

    return json.dumps(
        {"key": ref.key, "size": ref.size, "crc": ref.crc, "rows": ref.rows}, separators=(",", ":"), sort_keys=True
    ).encode()


def delete_unreferenced(storage: Storage, prefix: str, referenced: Iterable[str]) -> int:
    """Delete every object under ``prefix`` not in ``referenced``.

    Only the committer whose transaction committed the batch may call this, with exactly the set it
    committed: no earlier transaction can have committed objects of that batch then. A replayed batch
    whose commit turned out to be a no-op must use :func:`delete_keys` with its own (uncommitted) keys.
    """
    keep = set(referenced)
    n = 0
    for name in storage.list(prefix):
        if name.endswith("/"):
            continue
        if prefix + name not in keep:
            storage.delete(prefix + name)
            n += 1
    return n


def delete_keys(storage: Storage, keys: Iterable[str]) -> int:
    """Delete the given staged objects (known to be referenced by no committed transaction)."""
    n = 0
    for key in keys:
        storage.delete(key)
        n += 1
    return n
