"""Topic metadata: versions of ``topics/<name>/meta/<020d version>`` (PROTOCOL.md "Topics").

Version 0 is written by ``create_topic`` with create-if-absent, so of two concurrent creators exactly one
wins and the other gets :class:`TopicExistsError`. Later versions (more partitions, new retention
settings) are appended to the same slot log; the newest version is the topic's current metadata. The
partition count never shrinks and the schema never changes.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa

from txn_core.clock import Clock
from txn_core.errors import (
    ConfigurationError,
    CorruptDataError,
    ObjectExistsError,
    ObjectNotFoundError,
    TopicExistsError,
    TopicNotFoundError,
)
from txn_core.format import envelope, paths
from txn_core.format.ids import is_int, validate_name
from txn_core.format.slotlog import SlotLog
from txn_core.storage.base import Storage, create_resolving
from txn_core.storage.parallel import submit

METADATA_COLUMNS = ("_topic", "_partition", "_offset", "_timestamp")
MAX_PARTITIONS = 10_000


@dataclass(frozen=True, slots=True)
class TopicConfig:
    """Per-topic settings. ``None`` retention means keep forever."""

    retention_ms: int | None = None
    retention_bytes: int | None = None

    def check(self) -> TopicConfig:
        """Itself, if each setting is unset or a positive whole number; else :class:`ConfigurationError`."""
        for name, value in (("retention_ms", self.retention_ms), ("retention_bytes", self.retention_bytes)):
            if value is not None and (not is_int(value) or value <= 0):
                raise ConfigurationError(
                    f"{name} must be a whole number > 0, or None to keep everything; got {value!r}"
                )
        return self

    def to_json(self) -> dict[str, Any]:
        return {"retention_ms": self.retention_ms, "retention_bytes": self.retention_bytes}

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> TopicConfig:
        return cls(value.get("retention_ms"), value.get("retention_bytes"))


@dataclass(frozen=True, slots=True)
class TopicMeta:
    name: str
    partitions: int
    schema: pa.Schema
    version: int
    created_ms: int
    config: TopicConfig = field(default_factory=TopicConfig)
    internal: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "partitions": self.partitions,
            "schema": base64.b64encode(self.schema.serialize().to_pybytes()).decode(),
            "schema_text": self.schema.to_string(show_schema_metadata=False),
            "version": self.version,
            "created_ms": self.created_ms,
            "config": self.config.to_json(),
            "internal": self.internal,
        }

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> TopicMeta:
        schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(value["schema"])))
        return cls(
            value["name"],
            int(value["partitions"]),
            schema,
            int(value["version"]),
            int(value["created_ms"]),
            TopicConfig.from_json(value.get("config", {})),
            bool(value.get("internal", False)),
        )


def normalize_schema(schema: pa.Schema) -> pa.Schema:
    """The schema a topic stores: no schema-level metadata, ``large_string`` kept as given."""
    if not isinstance(schema, pa.Schema):
        raise ConfigurationError(f"schema must be a pyarrow.Schema, got {type(schema).__name__}")
    reserved = [f.name for f in schema if f.name in METADATA_COLUMNS]
    if reserved:
        raise ConfigurationError(
            f"schema uses reserved column name(s) {reserved}: {METADATA_COLUMNS} are added by txnlog readers"
        )
    if len(set(schema.names)) != len(schema.names):
        raise ConfigurationError(f"schema has duplicate column names: {schema.names}")
    if not schema.names:
        raise ConfigurationError("schema has no columns")
    return schema.remove_metadata()


class TopicStore:
    """Create, list and read topic metadata."""

    def __init__(self, storage: Storage, *, clock: Clock, created: Callable[[str], None] = lambda _name: None) -> None:
        self.storage = storage
        self.clock = clock
        self._created = created  # told of each topic this process creates (see create)
        self._cache: dict[str, TopicMeta] = {}

    def _slots(self, name: str) -> SlotLog:
        return SlotLog(self.storage, paths.topic_meta(name))

    def create(
        self,
        name: str,
        partitions: int,
        schema: pa.Schema,
        config: TopicConfig | None = None,
        *,
        internal: bool = False,
    ) -> TopicMeta:
        validate_name("topic", name, allow_internal=internal)
        if not is_int(partitions) or not 1 <= partitions <= MAX_PARTITIONS:
            raise ConfigurationError(f"partitions must be an integer in [1, {MAX_PARTITIONS}], got {partitions!r}")
        meta = TopicMeta(name, partitions, normalize_schema(schema), 0, self.clock(), config or TopicConfig(), internal)
        header, payload = envelope.encode_json(envelope.ObjectKind.TOPIC_META, meta.to_json())
        try:
            create_resolving(self.storage, self._slots(name).key(0), [header, payload], header)
        except ObjectExistsError as exc:
            raise TopicExistsError(f"topic {name!r} already exists; pick another name or use it as is") from exc
        # The topic did not exist a moment ago: what this process remembers of partitions of that name (a
        # tail, a log start) was of a topic deleted by hand since, and an append there would take the old
        # slot numbers, leaving the new partition's first slots missing.
        self._created(name)
        self._cache[name] = meta
        return meta

    def get(self, name: str, *, refresh: bool = True) -> TopicMeta:
        """The newest metadata of ``name``; :class:`TopicNotFoundError` lists existing topics."""
        if not refresh and name in self._cache:
            return self._cache[name]
        slots = self._slots(name)
        cached = self._cache.get(name)
        if cached is None:
            meta = self._first_read(name, slots)
            if meta is not None:
                return meta
        lower = cached.version if cached else 0
        tail = slots.find_tail(lower, near=True)
        if tail == 0:
            existing = self.list()
            raise TopicNotFoundError(
                f"unknown topic {name!r}; existing topics: {', '.join(existing) if existing else '(none)'}. "
                "Create it with Log.create_topic(name, partitions, schema)."
            )
        if cached is not None and cached.version == tail - 1:
            return cached
        meta = self._read_version(name, slots, tail - 1)
        self._cache[name] = meta
        return meta

    def _first_read(self, name: str, slots: SlotLog) -> TopicMeta | None:
        """A first look at ``name`` in one round: version 0 read while version 1 is checked for (most topics
        have one version). The metadata when version 1 is absent; None when the topic has more versions or
        none (the caller searches, as for a cached topic)."""
        later = submit(slots.exists, 1, leaf=True)
        try:
            meta: TopicMeta | None = self._read_version(name, slots, 0)
        except ObjectNotFoundError:
            meta = None
        except CorruptDataError:
            if later.result():
                return None  # an older version: the newest one decides
            raise
        if later.result() or meta is None:
            return None
        self._cache[name] = meta
        return meta

    def _read_version(self, name: str, slots: SlotLog, version: int) -> TopicMeta:
        key = slots.key(version)
        try:
            return TopicMeta.from_json(envelope.read_json(self.storage, key, envelope.ObjectKind.TOPIC_META))
        except CorruptDataError as exc:
            raise CorruptDataError(
                f"{exc} It is version {version} of the metadata of topic {name!r} (its partition count, schema "
                "and settings), which no older version can stand in for: restore the object from a backup. "
                "Until then the topic can be neither read nor written; other topics are unaffected.",
                exc.key,
                exc.check,
            ) from exc

    def list(self, *, include_internal: bool = False) -> list[str]:
        names = [n.rstrip("/") for n in self.storage.list(paths.TOPICS) if n.endswith("/")]
        out = []
        for n in names:
            if n.startswith("__") and not include_internal:
                continue
            if self.storage.exists(self._slots(n).key(0)):
                out.append(n)
        return out

    def update(self, name: str, *, partitions: int | None = None, config: TopicConfig | None = None) -> TopicMeta:
        """Write a new metadata version (more partitions, new config); retried on concurrent updates."""
        if partitions is not None and (not is_int(partitions) or not 1 <= partitions <= MAX_PARTITIONS):
            raise ConfigurationError(f"partitions must be an integer in [1, {MAX_PARTITIONS}], got {partitions!r}")
        while True:
            current = self.get(name)
            if partitions is not None and partitions < current.partitions:
                raise ConfigurationError(
                    f"topic {name!r} has {current.partitions} partitions; the count can only grow, "
                    f"not shrink to {partitions}"
                )
            if partitions is not None and partitions > MAX_PARTITIONS:
                raise ConfigurationError(f"partitions must be at most {MAX_PARTITIONS}")
            new = replace(
                current,
                version=current.version + 1,
                partitions=partitions if partitions is not None else current.partitions,
                config=config if config is not None else current.config,
            )
            header, payload = envelope.encode_json(envelope.ObjectKind.TOPIC_META, new.to_json())
            try:
                create_resolving(self.storage, self._slots(name).key(new.version), [header, payload], header)
            except ObjectExistsError:
                continue
            self._cache[name] = new
            return new
