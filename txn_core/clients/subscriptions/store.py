"""Where a subscription lives, its metadata object and its state snapshots (PROTOCOL.md "Subscriptions",
"Subscription layout").

Under ``subscriptions/<topic>/<05d partition>/<name>/``:

==============================  ===================================================================
``meta``                        subscription metadata (envelope kind 10, JSON), create-if-absent
``acks/log/<020d slot>``        the **ack log**: a partition log of ack records and COMMIT/ABORT markers;
                                its log path ``.../acks`` is a transaction participant
``acks/start/<020d slot>``      the ack log's log start (trimming), as for any partition log
``state/<020d slot>.<013d ms>`` a snapshot of the subscription state before ack-log slot ``slot``,
                                written at ``ms`` (envelope kind 10, JSON)
``leases/<020d range>-<020d g>``  dispatch lease generation ``g`` of an offset range (see ``leases.py``)
``hold/<020d g>``               generation ``g`` of the hold of an Exclusive or Failover subscription: who
                                delivers now (see ``hold.py``)
``members/<id>.<013d ms>``      a Failover or Key_Shared subscription's member ``id``, counting until ``ms``
                                (``members.py``)
``keys/<020d slice>-<020d g>``  lease generation ``g`` of a Key_Shared subscription's key slice (``keys.py``)
==============================  ===================================================================

Snapshots carry their write time in their name so that the trimmer can pick, from one LIST, the newest
snapshot older than the minimum entry age without reading any of them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from txn_core.clients.subscriptions.errors import SubscriptionNotFoundError
from txn_core.clients.subscriptions.state import SubscriptionState
from txn_core.errors import ConfigurationError, CorruptDataError, ObjectNotFoundError
from txn_core.format import envelope, paths
from txn_core.format.ids import is_int, validate_name
from txn_core.storage.base import Storage

#: Metadata of a Shared subscription is written as version 1 (readable by every release); of any other type
#: as version 2, which releases that know only Shared refuse, so they never consume it as a shared one.
META_VERSION = 1
META_VERSION_TYPED = 2
DEFAULT_RANGE_SIZE = 256
#: How the consumers of a Key_Shared subscription divide the keys (Pulsar's AUTO_SPLIT and STICKY).
KEY_MODES = ("auto_split", "sticky")
_KIND = envelope.ObjectKind.SUBSCRIPTION


class SubscriptionType(enum.Enum):
    """Who may consume a subscription at once (Pulsar's subscription types; PROTOCOL.md "Subscription types")."""

    SHARED = "shared"  # any number of consumers, records spread over them by range leases
    EXCLUSIVE = "exclusive"  # one consumer; a second is refused while the first holds the subscription
    FAILOVER = "failover"  # any number of consumers; one of them, chosen by name and partition, is active
    KEY_SHARED = "key_shared"  # any number of consumers; the records of one key go to one of them at a time

    @property
    def held(self) -> bool:
        """Whether one consumer at a time holds the subscription (its hold, ``hold.py``)."""
        return self in (SubscriptionType.EXCLUSIVE, SubscriptionType.FAILOVER)

    @classmethod
    def parse(cls, value: str | SubscriptionType) -> SubscriptionType:
        if isinstance(value, SubscriptionType):
            return value
        try:
            return cls(str(value).lower())
        except ValueError:
            choices = ", ".join(repr(t.value) for t in cls)
            raise ConfigurationError(f"subscription_type must be one of {choices}, got {value!r}") from None


@dataclass(frozen=True, slots=True)
class SubscriptionRef:
    """Names one subscription: (topic, partition, name)."""

    topic: str
    partition: int
    name: str

    @property
    def root(self) -> str:
        return paths.subscription_root(self.topic, self.partition, self.name)

    @property
    def ack_log_path(self) -> str:
        """The ack log's log path: the participant name transactions register."""
        return self.root + "acks"

    @property
    def meta_key(self) -> str:
        return self.root + "meta"

    @property
    def snapshots(self) -> str:
        return self.root + "state/"

    @property
    def leases(self) -> str:
        return self.root + "leases/"

    @property
    def hold(self) -> str:
        return self.root + "hold/"

    @property
    def members(self) -> str:
        return self.root + "members/"

    @property
    def keys(self) -> str:
        return self.root + "keys/"

    def __str__(self) -> str:
        return f"subscription {self.name!r} of {self.topic}-{self.partition}"


@dataclass(frozen=True, slots=True)
class SubscriptionMeta:
    """The immutable settings of a subscription, fixed when it is created."""

    ref: SubscriptionRef
    initial_offset: int  # the mark-delete position of a new subscription
    range_size: int  # offsets per dispatch lease range
    created_ms: int
    type: SubscriptionType = SubscriptionType.SHARED
    #: Key_Shared: the column whose value is the key, and whether consumers split the keys among themselves
    #: ("auto_split") or name their ranges ("sticky")
    key_column: str | None = None
    key_mode: str | None = None

    def to_json(self) -> dict[str, Any]:
        value: dict[str, Any] = {
            "version": META_VERSION,
            "topic": self.ref.topic,
            "partition": self.ref.partition,
            "name": self.ref.name,
            "initial_offset": self.initial_offset,
            "range_size": self.range_size,
            "created_ms": self.created_ms,
        }
        if self.type is not SubscriptionType.SHARED:
            value["version"] = META_VERSION_TYPED
            value["type"] = self.type.value
        if self.type is SubscriptionType.KEY_SHARED:
            value["key_column"] = self.key_column
            value["key_mode"] = self.key_mode
        return value

    @classmethod
    def from_json(cls, ref: SubscriptionRef, v: dict[str, Any], key: str) -> SubscriptionMeta:
        try:
            version = int(v["version"])
            if version not in (META_VERSION, META_VERSION_TYPED) or v["name"] != ref.name or v["topic"] != ref.topic:
                raise CorruptDataError(f"{key}: metadata does not describe {ref}", key)
            kind = SubscriptionType(v["type"]) if version == META_VERSION_TYPED else SubscriptionType.SHARED
            key_column = key_mode = None
            if kind is SubscriptionType.KEY_SHARED:
                key_column, key_mode = str(v["key_column"]), str(v["key_mode"])
                if key_mode not in KEY_MODES:
                    raise ValueError(f"key_mode {key_mode!r}")
            created = int(v["created_ms"])
            return cls(ref, int(v["initial_offset"]), int(v["range_size"]), created, kind, key_column, key_mode)
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptDataError(f"{key}: malformed subscription metadata: {exc!r}", key) from exc


def validate_ref(topic: str, partition: int, name: str) -> SubscriptionRef:
    validate_name("topic", topic, allow_internal=True)
    validate_name("subscription", name)
    if not is_int(partition) or partition < 0:
        raise ConfigurationError(f"partition must be a non-negative int, got {partition!r}")
    return SubscriptionRef(topic, partition, name)


def read_meta(storage: Storage, ref: SubscriptionRef) -> SubscriptionMeta:
    """The metadata of ``ref``; :class:`SubscriptionNotFoundError` (listing the existing ones) if absent."""
    try:
        value = envelope.read_json(storage, ref.meta_key, _KIND)
    except ObjectNotFoundError:
        existing = list_subscriptions(storage, ref.topic, ref.partition)
        raise SubscriptionNotFoundError(
            f"{ref} does not exist (existing: {', '.join(existing) or 'none'}); subscribe with create=True to create it"
        ) from None
    return SubscriptionMeta.from_json(ref, value, ref.meta_key)


def create_meta(storage: Storage, meta: SubscriptionMeta) -> SubscriptionMeta:
    """Create the subscription if absent (exactly one racing creator wins); returns the stored metadata."""
    envelope.create_json(storage, meta.ref.meta_key, _KIND, meta.to_json())
    return read_meta(storage, meta.ref)


def list_subscriptions(storage: Storage, topic: str, partition: int) -> list[str]:
    prefix = paths.subscription_root(topic, partition, "x")[: -len("x/")]
    return [n.rstrip("/") for n in storage.list(prefix) if n.endswith("/")]


@dataclass(frozen=True, slots=True, order=True)
class SnapshotRef:
    slot: int
    time_ms: int

    @property
    def name(self) -> str:
        return f"{paths.slot_name(self.slot)}.{self.time_ms:013d}"


class SnapshotStore:
    """The state snapshots of one subscription."""

    def __init__(self, storage: Storage, ref: SubscriptionRef) -> None:
        self.storage = storage
        self.prefix = ref.snapshots

    def list(self) -> list[SnapshotRef]:
        """Snapshots present, ascending by slot then time (one LIST)."""
        out = []
        for name in self.storage.list(self.prefix):
            slot, _, ms = name.partition(".")
            if slot.isdigit() and ms.isdigit():
                out.append(SnapshotRef(int(slot), int(ms)))
        return sorted(out)

    def write(self, state: SubscriptionState, time_ms: int) -> SnapshotRef:
        ref = SnapshotRef(state.slot, time_ms)
        value = state.to_json()
        value["time_ms"] = time_ms
        envelope.create_json(self.storage, self.prefix + ref.name, _KIND, value)
        return ref

    def read(self, snap: SnapshotRef) -> SubscriptionState:
        key = self.prefix + snap.name
        state = SubscriptionState.from_json(envelope.read_json(self.storage, key, _KIND), key)
        if state.slot != snap.slot:
            raise CorruptDataError(f"{key}: holds the state at slot {state.slot}", key)
        return state

    def load_latest(self, min_slot: int, max_slot: int | None = None) -> SubscriptionState | None:
        """The newest readable snapshot with ``min_slot <= slot (<= max_slot)``; damaged ones are skipped."""
        for snap in reversed(self.list()):
            if snap.slot < min_slot or (max_slot is not None and snap.slot > max_slot):
                continue
            try:
                return self.read(snap)
            except (ObjectNotFoundError, CorruptDataError):
                continue  # raced a delete, or damaged: an older one will do
        return None

    def delete(self, snap: SnapshotRef) -> None:
        self.storage.delete(self.prefix + snap.name)
