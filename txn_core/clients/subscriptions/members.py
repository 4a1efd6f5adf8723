"""The consumers of a Failover or Key_Shared subscription, and which one is active (PROTOCOL.md "Subscription
types", "Failover", "Key_Shared").

Each consumer keeps a **member object** ``members/<consumer id>.<013d expires_ms>`` (envelope kind 10,
JSON ``{"owner", "acquired_ms", "expires_ms"}``, and ``"key_ranges"`` for a sticky Key_Shared consumer): the
expiry is in the name, so one LIST gives every member and how long it counts, with no reads. A member renews
by creating a new object once half its session timeout is spent and then deleting its older ones; leaving
deletes them all. A member counts while its newest object's expiry is in the future (by the looker's clock).

The **active consumer** of partition ``p`` is ``sorted(member ids)[p % len(members)]``, as Pulsar picks the
active consumer of a partitioned topic's failover subscription (consumer ids begin with the consumer's
name, so names order them). Every member computes it from its own view; views differ for a moment after a
join or a lapse, so membership only says who *should* deliver: the hold (:mod:`.hold`) says who *may*.

Crash windows: a member that dies leaves objects that stop counting at their expiry; any member deletes
objects lapsed for a whole session timeout. Dying between creating a renewed object and deleting the older
ones leaves both; the newest counts.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from txn_core.clients.subscriptions.store import SubscriptionRef
from txn_core.errors import ObjectNotFoundError
from txn_core.format import envelope
from txn_core.storage.base import Storage

_KIND = envelope.ObjectKind.SUBSCRIPTION


def _objects(storage: Storage, prefix: str) -> Iterator[tuple[str, str, int]]:
    """``(name, member id, expires_ms)`` of every member object (one LIST)."""
    for name in storage.list(prefix):
        owner, _, expires = name.rpartition(".")
        if owner and expires.isdigit():
            yield name, owner, int(expires)


def active_of(members: Sequence[str], partition: int) -> str | None:
    """The active consumer of ``partition`` among ``members`` (None if there are none)."""
    ordered = sorted(set(members))
    return ordered[partition % len(ordered)] if ordered else None


class Membership:
    """One consumer's membership and its view of the others (see module doc). Not thread-safe: the consumer
    locks."""

    def __init__(
        self, storage: Storage, ref: SubscriptionRef, owner: str, ttl_ms: int, extra: dict[str, Any] | None = None
    ) -> None:
        self.storage = storage
        self.extra = dict(extra or {})  # more fields of this member's objects
        self.prefix = ref.members
        self.owner = owner
        self.ttl_ms = ttl_ms
        self.refresh_ms = max(1, ttl_ms // 4)
        self._mine: list[str] = []  # names of this member's objects, oldest first
        self._acquired: int | None = None
        self._view: dict[str, int] = {}  # member id -> newest expiry
        self._listed_ms: int | None = None

    def keep(self, now_ms: int) -> None:
        """Join, or renew once half the session timeout is spent (one create, then deletes)."""
        if self._acquired is not None and now_ms < self._acquired + self.ttl_ms // 2:
            return
        expires = now_ms + self.ttl_ms
        name = f"{self.owner}.{expires:013d}"
        value = {**self.extra, "owner": self.owner, "acquired_ms": now_ms, "expires_ms": expires}
        envelope.create_json(self.storage, self.prefix + name, _KIND, value)  # unique name: ours either way
        self._acquired = now_ms
        old, self._mine = self._mine, [name]
        for stale in old:
            if stale != name:
                self._delete(stale)
        self._view[self.owner] = max(self._view.get(self.owner, 0), expires)

    def leave(self) -> None:
        """Stop counting as a member now (delete this member's objects)."""
        for name in self._mine:
            self._delete(name)
        self._mine, self._acquired = [], None
        self._view.pop(self.owner, None)

    def members(self, now_ms: int, *, fresh: bool = False) -> list[str]:
        """The members that count now, sorted (one LIST at most every quarter session timeout, or if
        ``fresh``)."""
        if fresh or self._listed_ms is None or now_ms - self._listed_ms >= self.refresh_ms:
            self._list(now_ms)
        return sorted(m for m, expires in self._view.items() if now_ms < expires)

    def active(self, now_ms: int, partition: int, *, fresh: bool = False) -> str | None:
        return active_of(self.members(now_ms, fresh=fresh), partition)

    def _list(self, now_ms: int) -> None:
        view: dict[str, int] = {}
        for name, owner, expires in _objects(self.storage, self.prefix):
            if expires + self.ttl_ms <= now_ms and owner != self.owner:
                self._delete(name)  # lapsed for a whole session: its consumer is gone
                continue
            view[owner] = max(view.get(owner, 0), expires)
        if self._mine:  # our own newest object, even if a slow listing missed it
            view[self.owner] = max(view.get(self.owner, 0), int(self._mine[-1].rpartition(".")[2]))
        self._view, self._listed_ms = view, now_ms

    def _delete(self, name: str) -> None:
        self.storage.delete(self.prefix + name)  # idempotent: a racing member may have deleted it

    def objects_of_others(self, now_ms: int) -> dict[str, dict[str, Any]]:
        """The newest object of every other counting member: one LIST, one read each. A member that renewed
        between the LIST and the read (its object deleted, a newer one created) is listed and read again; only
        a member with no counting object left (it left) is left out."""
        out: dict[str, dict[str, Any]] = {}
        missing: set[str] | None = None  # members whose object vanished: look for their newer one
        for _ in range(3):
            newest: dict[str, tuple[int, str]] = {}
            for name, owner, expires in _objects(self.storage, self.prefix):
                if owner == self.owner or owner in out or (missing is not None and owner not in missing):
                    continue
                if now_ms < expires and expires > newest.get(owner, (0, ""))[0]:
                    newest[owner] = (expires, name)
            missing = set()
            for owner, (_expires, name) in sorted(newest.items()):
                try:
                    out[owner] = envelope.read_json(self.storage, self.prefix + name, _KIND)
                except ObjectNotFoundError:
                    missing.add(owner)
            if not missing:
                break
        return dict(sorted(out.items()))


def list_members(storage: Storage, ref: SubscriptionRef, now_ms: int) -> list[str]:
    """The members of ``ref`` that count at ``now_ms``, sorted (one LIST; for descriptions)."""
    newest: dict[str, int] = {}
    for _name, owner, expires in _objects(storage, ref.members):
        newest[owner] = max(newest.get(owner, 0), expires)
    return sorted(m for m, expires in newest.items() if now_ms < expires)
