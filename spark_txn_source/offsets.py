"""The streaming offset: ``{"log": URL, "topics": {topic: {"partition": next offset to read}}}``.

This exact shape is a contract: Spark writes it to the checkpoint's ``offsets/<batchId>`` file and the
txnlog sink reads it back from there. ``log`` is the log URL without credentials. Offsets are encoded
canonically (topics sorted by name, partitions by number) so that "no new data" gives a dict equal to the
start, which is how Spark decides to run no batch.

With ``startingOffsets=group``, the end offset of the query's first batch also carries ``"start"``: the
group's committed offsets that batch started from (``{topic: {"partition": offset}}``, -1 where the group
had none). The txnlog sink claims that position for its offsets fence (txn_core PROTOCOL.md "Offsets
fence"): Spark records no start for a first batch, and later batches start at the previous batch's end.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from txn_core.errors import ConfigurationError
from txn_core.format.ids import TopicPartition

Positions = dict[TopicPartition, int]
START = "start"


def encode(log_url: str, positions: Mapping[TopicPartition, int]) -> dict[str, Any]:
    topics: dict[str, dict[str, int]] = {}
    for tp in sorted(positions):
        topics.setdefault(tp.topic, {})[str(tp.partition)] = int(positions[tp])
    return {"log": log_url, "topics": topics}


def decode(offset: Mapping[str, Any], log_url: str) -> Positions:
    """Positions of an offset dict written for ``log_url`` (a checkpoint of another log is refused)."""
    try:
        url = offset["log"]
        topics = offset["topics"]
        positions = {TopicPartition(str(t), int(p)): int(o) for t, parts in topics.items() for p, o in parts.items()}
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ConfigurationError(
            f"the checkpoint holds a source offset txnlog does not understand ({offset!r}); was it written "
            "by another source? Use a new checkpoint location."
        ) from exc
    if url != log_url:
        raise ConfigurationError(
            f"the checkpoint's offsets belong to log {url!r}, but this query reads {log_url!r}; offsets of "
            "one log mean nothing in another. Use a new checkpoint location, or point 'path' back at the "
            "old log."
        )
    return positions
