"""The object layout under a log URL: every key txnlog reads or writes is built here.

See PROTOCOL.md "Layout" for the same table with examples. Numbers are zero-padded so that a sorted
listing is in numeric order.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from txn_core.storage.base import Storage

INTERNAL = "_txnlog"
FORMAT_KEY = f"{INTERNAL}/format"
PRODUCER_IDS = f"{INTERNAL}/producer-ids/"
TOPICS = "topics/"
GROUPS = "groups/"
SUBSCRIPTIONS = "subscriptions/"
STAGING = "staging/"


def slot_name(slot: int) -> str:
    return f"{slot:020d}"


_SLOT_NAME = re.compile(r"[0-9]{20}")


def is_slot_name(name: str) -> bool:
    """Whether a listed name is a slot's: exactly 20 ASCII digits. Anything else under a slot directory
    (a store's temporary file, an operator's note, ``+1``) is not the log's: readers ignore it and
    maintenance never deletes it (PROTOCOL.md "Slot logs")."""
    return _SLOT_NAME.fullmatch(name) is not None


def slot_names(names: Iterable[str]) -> list[str]:
    """The slot names among listed ``names``, oldest first."""
    return sorted(n for n in names if is_slot_name(n))


def coordinator_root(coordinator: int) -> str:
    return f"{INTERNAL}/coordinators/{coordinator:05d}/"


def coordinator_log(coordinator: int) -> str:
    return coordinator_root(coordinator) + "log/"


def coordinator_snapshots(coordinator: int) -> str:
    return coordinator_root(coordinator) + "snapshots/"


def topic_root(topic: str) -> str:
    return f"{TOPICS}{topic}/"


def topic_meta(topic: str) -> str:
    return f"{TOPICS}{topic}/meta/"


def partition_log_path(topic: str, partition: int) -> str:
    """The log path (a participant name in transactions) of a topic partition."""
    return f"{TOPICS}{topic}/{partition:05d}"


def topic_partition_of(path: str) -> tuple[str, int] | None:
    """``(topic, partition)`` of a topic partition's log path; None for other logs (groups, ack logs)."""
    parts = path.split("/")
    if len(parts) == 3 and parts[0] + "/" == TOPICS and parts[2].isdigit() and len(parts[2]) == 5:
        return parts[1], int(parts[2])
    return None


def group_log_path(group: str) -> str:
    """The log path of a consumer group's offsets (an internal single-partition log)."""
    return f"{GROUPS}{group}/offsets"


def subscription_root(topic: str, partition: int, subscription: str) -> str:
    return f"{SUBSCRIPTIONS}{topic}/{partition:05d}/{subscription}/"


# --- inside one partition log (``path`` is a log path as above) -------------------------------


def entries(path: str) -> str:
    return f"{path}/log/"


def buffer_snapshots(path: str) -> str:
    return f"{path}/snapshots/"


def log_start(path: str) -> str:
    return f"{path}/start/"


def lost_entries(path: str) -> str:
    """Lost-entry records: an operator's mark that an entry's records are gone (PROTOCOL.md "Damage")."""
    return f"{path}/lost/"


def segments(path: str) -> str:
    return f"{path}/segments/"


def staged(path: str) -> str:
    return f"{path}/staged/"


def has_log(storage: Storage) -> bool:
    """Whether ``storage`` holds a log (its format object). Before answering no, the log's root is listed
    once: a lookup of one object cannot tell a missing bucket from a missing log, a listing can, and a
    missing bucket then raises its own error naming the bucket and the fix (:mod:`txn_core.storage.hints`)."""
    if storage.exists(FORMAT_KEY):
        return True
    storage.list(FORMAT_KEY.rpartition("/")[0] + "/")  # the log's own directory: small wherever it is
    return False
