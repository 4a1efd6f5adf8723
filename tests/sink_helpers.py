"""Helpers shared by the Spark sink tests: read a topic back, inspect staging, run a stream to its end."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pyarrow as pa

import txn_core


def read_topic(log: txn_core.Log, topic: str, *, isolation_level: str = "read_committed") -> pa.Table:
    """Every record of ``topic`` a fresh consumer sees (all partitions, from the beginning)."""
    meta = log.topics.get(topic)
    consumer = log.consumer(isolation_level=isolation_level)
    consumer.assign([(topic, p) for p in range(meta.partitions)])
    tables = []
    while True:
        t = consumer.poll()
        if t.num_rows == 0:
            break
        tables.append(t)
    consumer.close()
    if not tables:
        return consumer_schema_empty(log, topic)
    return pa.concat_tables(tables)


def consumer_schema_empty(log: txn_core.Log, topic: str) -> pa.Table:
    from txn_core.partition.records import with_metadata_schema

    return with_metadata_schema(log.topics.get(topic).schema).empty_table()


def ids(table: pa.Table, column: str = "id") -> list[int]:
    return sorted(table.column(column).to_pylist())


def duplicates(values: list[Any]) -> dict[Any, int]:
    return {v: n for v, n in Counter(values).items() if n > 1}


def staged_objects(log: txn_core.Log) -> list[str]:
    """Every object under ``staging/`` (recursively), as keys."""
    out: list[str] = []
    todo = ["staging/"]
    while todo:
        prefix = todo.pop()
        for name in log.storage.list(prefix):
            if name.endswith("/"):
                todo.append(prefix + name)
            else:
                out.append(prefix + name)
    return sorted(out)


def open_transactions(log: txn_core.Log, topic: str) -> list[Any]:
    """Transactions still open on any partition of ``topic`` (each holds read_committed readers back)."""
    desc = log.describe_topic(topic)
    return [o for p in desc.partitions for o in p.ongoing_transactions]


def referenced_keys(log: txn_core.Log, topic: str) -> set[str]:
    """Staged object keys named by any DATA_REF entry of ``topic`` (committed, open or aborted)."""
    from txn_core.format import paths
    from txn_core.format.entry import EntryKind, decode_json

    keys: set[str] = set()
    for p in range(log.topics.get(topic).partitions):
        plog = log.partition_log(paths.partition_log_path(topic, p))
        slot = plog.log_start(refresh=True).slot
        while True:
            try:
                entry = plog.read_entry(slot)
            except txn_core.ObjectNotFoundError:
                break
            if entry.header.kind == EntryKind.DATA_REF:
                keys.add(str(decode_json(entry.payload(), entry.key)["key"]))
            slot += 1
    return keys


def garbage(log: txn_core.Log, topic: str) -> list[str]:
    """Staged objects no entry references (failed attempts, replays, aborted commits), manifests included."""
    refs = referenced_keys(log, topic)
    return [k for k in staged_objects(log) if k not in refs]
