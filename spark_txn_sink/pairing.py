"""Pairing a source batch with its sink transaction (PROTOCOL.md here, "Offsets committed with the output").

With ``consumerGroup=G``, the transaction that commits batch ``N``'s output also commits, to group ``G``,
the end offsets of batch ``N`` of every txnlog source of the query, taken from the checkpoint file
``offsets/N`` (see :mod:`spark_txn_sink.checkpoint`). Why this pairs correctly:

* Spark writes ``offsets/N`` before batch ``N`` runs and never rewrites it; a replay of ``N`` after a
  restart reads the same file. So whichever run commits batch ``N`` commits exactly the offsets that
  batch ``N``'s data was read up to, and a replay that finds ``N`` committed is a no-op for both.
* Output and offsets are one transaction: the group's committed offsets always describe exactly the
  output that is visible, so a new query started from ``startingOffsets=group`` continues exactly-once.

A txnlog source's offset is ``{"log": URL, "topics": {topic: {partition: next offset to read}}}``.

Limits (each raises :class:`PairingError` with the fix, rather than committing something wrong):

* A transaction spans one log: every txnlog source must read the sink's log (same URL).
* Two txnlog sources that disagree on the end offset of one topic-partition cannot share a group.
* With ``consumerGroup`` set the query needs at least one txnlog source; offsets of other sources (files,
  Kafka, rate) are never committed anywhere by this sink.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

from txn_core import ConfigurationError
from txn_core.storage.urls import redact_url

_ALIASES = {"s3a": "s3", "gcs": "gs", "abfss": "abfs"}


class PairingError(ConfigurationError):
    """The batch's source offsets cannot be committed with its output (see module doc, "Limits")."""


def normalize_log_url(url: str) -> str:
    """A log URL in one canonical form, for comparing a source's log with the sink's.

    Local paths become ``file://<absolute path>`` (as :func:`txn_core.open_log` reports them); object
    store URLs lose credentials, scheme aliases (``s3a`` -> ``s3``) and trailing slashes.
    """
    text = url.strip()
    parts = urlsplit(text)
    scheme = parts.scheme.lower()
    if scheme in ("", "file", "local") or len(scheme) == 1:
        path = text if not scheme or len(scheme) == 1 else (parts.netloc + parts.path)
        return "file://" + os.path.abspath(path)
    scheme = _ALIASES.get(scheme, scheme)
    bare = urlsplit(redact_url(text))
    return f"{scheme}://{bare.netloc}{bare.path.rstrip('/')}"


def is_txnlog_offset(value: Any) -> bool:
    """Whether a source offset has the txnlog source's shape (``log`` and ``topics``)."""
    return isinstance(value, dict) and isinstance(value.get("log"), str) and isinstance(value.get("topics"), dict)


def group_offsets(
    sources: Iterable[Any], sink_log_url: str, *, batch_id: int, group: str
) -> dict[tuple[str, int], int]:
    """The ``{(topic, partition): next offset}`` to commit to ``group`` with batch ``batch_id``.

    ``sources`` are the end offsets of every source of the batch (None for a source without one).
    """
    sink = normalize_log_url(sink_log_url)
    out: dict[tuple[str, int], int] = {}
    found = 0
    for value in sources:
        if not is_txnlog_offset(value):
            continue
        found += 1
        source_log = normalize_log_url(value["log"])
        if source_log != sink:
            raise PairingError(
                f"consumerGroup={group!r}: batch {batch_id} reads txnlog {value['log']!r} but writes to "
                f"{redact_url(sink_log_url)!r}; one transaction spans one log, so the source offsets cannot "
                "be committed atomically with the output. Write to the source's log, or drop consumerGroup."
            )
        for topic, parts in value["topics"].items():
            if not isinstance(parts, dict):
                raise PairingError(f"batch {batch_id}: malformed txnlog offset of {topic!r}: {parts!r}")
            for p, offset in parts.items():
                try:
                    key, off = (str(topic), int(p)), int(offset)
                except (TypeError, ValueError):
                    raise PairingError(
                        f"batch {batch_id}: malformed txnlog source offset {topic}/{p}: {offset!r}"
                    ) from None
                if off < 0:
                    raise PairingError(f"batch {batch_id}: negative source offset {off} for {topic}-{p}")
                if key in out and out[key] != off:
                    raise PairingError(
                        f"consumerGroup={group!r}: two txnlog sources of the query read {topic}-{p} and "
                        f"ended batch {batch_id} at different offsets ({out[key]} and {off}); one group "
                        "holds one offset per partition. Read each topic-partition with one source, or drop "
                        "consumerGroup."
                    )
                out[key] = off
    if not found:
        raise PairingError(
            f"consumerGroup={group!r} is set but batch {batch_id} has no txnlog source offsets in the "
            "checkpoint: the option commits the offsets of txnlog sources read by this query. Read from "
            "spark.readStream.format('txnlog'), or drop consumerGroup."
        )
    return out


def group_start(
    sources: tuple[Any, ...], previous: tuple[Any, ...] | None, ends: dict[tuple[str, int], int]
) -> dict[tuple[str, int], int] | None:
    """Where batch ``N``'s input for the group started, for the offsets fence (txn_core PROTOCOL.md
    "Offsets fence"): the ``start`` a txnlog source recorded in its end offset (the first batch of a query
    started from the group), else the end offsets of batch ``N - 1`` (``previous``; None for a first batch).

    Returns None when a source's first batch recorded no start (a query that did not start from the
    group). Partitions without a known start (added to a topic since) get -1, as a group without offsets.
    """
    out: dict[tuple[str, int], int] = {}
    for i, value in enumerate(sources):
        if not is_txnlog_offset(value):
            continue
        recorded = value.get("start")
        if not isinstance(recorded, dict):
            prev = previous[i] if previous is not None and i < len(previous) else None
            if prev is None or not is_txnlog_offset(prev):
                return None
            recorded = prev["topics"]
        for topic, parts in recorded.items():
            if isinstance(parts, dict):
                for p, offset in parts.items():
                    out[(str(topic), int(p))] = int(offset)
    return {tp: out.get(tp, -1) for tp in ends}
