"""Markers that travel in the producer's next entry (PROTOCOL.md "Carried markers").

A decided transaction's COMMIT or ABORT marker for a topic partition need not be an entry of its own: the
producer's next data entry to that partition carries it in its header (version 2), when one follows within
:data:`MARKER_LINGER_S`; after that, or when the producer needs the markers durable (its next decision,
``close()``, ``wait_for_markers()``), the markers nobody carried are written alone. In a steady stream of
transactions this halves the creates per partition per transaction.

:class:`MarkerSet` holds one decided transaction's carriable markers, one :class:`Offer` per partition log;
:class:`MarkerOffers` is the producer's registry the :class:`~txn_core.clients.producer.sender.Sender` takes
offers from when it encodes a new entry.

Invariants:

* an offer is carried by at most one entry: a new entry takes it only while it is free, under its set's
  lock; it is *landed* once an entry holding its marker is durable (a carrier that was appended, or the
  lone marker), and never goes back;
* a carrier whose append fails releases its offer, which is then written alone (the carrier may still
  land on a retry: a second marker for an ended transaction changes nothing, PROTOCOL.md "Transaction
  buffer");
* :meth:`MarkerSet.force` never waits for another party: it writes alone every marker not landed yet,
  those a carrier holds included (a carrier in flight at that moment lands a second marker, harmless), so
  a carrier that never finishes cannot hang it; it waits only for another lone write, which lands or frees
  its markers;
* the set is landed (:meth:`MarkerSet.wait`) only when every offer is: only then is the transaction's
  Complete record written (:mod:`txn_core.clients.producer.completion`); a set whose transaction was
  completed another way (every marker written by the coordinator's whole second phase) is *retired*: no
  entry carries its markers any more.

Crash windows: a producer dying with offers pending leaves a prepared transaction without those markers,
as a producer dying before its background markers does; whoever meets it after the completion grace writes
them (PROTOCOL.md "Recovery").
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass

from txn_core.format import paths as _paths
from txn_core.format.entry import CarriedMarker

#: How long a decided transaction's markers wait for the producer's next entries to carry them before they
#: are written alone (the producer's ``marker_linger_ms`` overrides it; 0 writes them at once).
MARKER_LINGER_S = 0.2


@dataclass(eq=False)
class Offer:
    """One partition log's marker of a :class:`MarkerSet`."""

    path: str
    owner: MarkerSet
    #: offered (free to take), carrying (a carrier entry holds it), writing (a lone write holds it) or landed
    state: str = "offered"

    @property
    def marker(self) -> CarriedMarker:
        return self.owner.marker

    def landed(self) -> None:
        """An entry holding this marker is durable."""
        self.owner._landed(self)

    def release(self) -> None:
        """The carrier that took it failed: free to take again (a lone write or a later carrier)."""
        self.owner._release(self, "carrying")

    def release_alone(self) -> None:
        """The lone write that took it did not land it: free to take again."""
        self.owner._release(self, "writing")

    def write_alone(self) -> None:
        """Write this offer's marker (held by the caller's lone write) as an entry of its own."""
        self.owner._write([self])


class MarkerSet:
    """The carriable markers of one decided transaction, offered to its producer's next entries."""

    def __init__(
        self,
        marker: CarriedMarker,
        producer_id: int,
        paths: Collection[str],
        write: Callable[[list[str]], None],
    ) -> None:
        self.marker = marker
        self.producer_id = producer_id
        self._write_paths = write
        self._lock = threading.Lock()
        self.offers = {path: Offer(path, self) for path in paths}
        self._left = len(self.offers)
        self._done = threading.Event()
        if not self._left:
            self._done.set()
        #: completed another way: nothing more to carry (:meth:`retire`)
        self.retired = False

    def take(self, path: str, *, alone: bool = False) -> Offer | None:
        """The offer of ``path`` if it is free, now held by the caller's carrier entry (or, ``alone``, its lone
        write); else None."""
        with self._lock:
            offer = self.offers.get(path)
            if offer is None or offer.state != "offered":
                return None
            offer.state = "writing" if alone else "carrying"
            return offer

    def wait(self, timeout: float | None = None) -> bool:
        """Whether every marker landed (waiting up to ``timeout``)."""
        return self._done.wait(timeout)

    @property
    def landed(self) -> bool:
        return self._done.is_set()

    def force(self) -> None:
        """Write alone now (in parallel) every marker not landed yet, those a carrier holds included, and
        wait for those another lone write holds (it lands or frees them): on return all markers are durable.
        Raises what a lone write raised (its offers are free again)."""
        while True:
            with self._lock:
                due = [o for o in self.offers.values() if o.state in ("offered", "carrying")]
                for offer in due:
                    offer.state = "writing"
            if due:
                self._write(due)
            if self._done.wait(0 if due else 0.01):
                return

    def retire(self) -> None:
        """The transaction was completed another way (every marker written): no entry carries these any more."""
        with self._lock:
            self.retired = True
            for offer in self.offers.values():
                if offer.state == "offered":
                    offer.state = "writing"  # never taken again: its marker is written

    def _write(self, offers: list[Offer]) -> None:
        try:
            self._write_paths([o.path for o in offers])
        except BaseException:
            for offer in offers:
                self._release(offer, "writing")
            raise
        for offer in offers:
            self._landed(offer)

    def _landed(self, offer: Offer) -> None:
        with self._lock:
            if offer.state == "landed":
                return
            offer.state = "landed"
            self._left -= 1
            if not self._left:
                self._done.set()

    def _release(self, offer: Offer, held: str) -> None:
        with self._lock:
            if offer.state == held and not self.retired:
                offer.state = "offered"


class MarkerOffers:
    """A producer's offered markers by partition log, oldest transaction first. Thread-safe."""

    def __init__(self, linger_s: float = MARKER_LINGER_S) -> None:
        self.linger_s = linger_s
        self._lock = threading.Lock()
        self._sets: deque[MarkerSet] = deque()

    @property
    def enabled(self) -> bool:
        return self.linger_s > 0

    @staticmethod
    def carriable(participants: Collection[str]) -> list[str]:
        """The participant logs whose markers may travel in data entries: topic partitions (a group's offsets
        log or a subscription's ack log gets its marker alone)."""
        return [p for p in participants if _paths.topic_partition_of(p) is not None]

    def add(self, markers: MarkerSet) -> None:
        with self._lock:
            self._sets.append(markers)

    def take(self, path: str, producer_id: int) -> Offer | None:
        """The oldest free offer for ``path`` of ``producer_id`` (now taken by the caller's entry), or None."""
        sets = self._live()
        for markers in sets:
            if markers.producer_id == producer_id:
                offer = markers.take(path)
                if offer is not None:
                    return offer
        return None

    def take_all(self, exclude: Collection[str] = ()) -> list[Offer]:
        """Every free offer for a log not in ``exclude`` (now taken by the caller, to write alone)."""
        sets = self._live()
        out = []
        for markers in sets:
            for path in list(markers.offers):
                if path not in exclude:
                    offer = markers.take(path, alone=True)
                    if offer is not None:
                        out.append(offer)
        return out

    def _live(self) -> list[MarkerSet]:
        """The sets with markers still to land, oldest first (dropping the others)."""
        with self._lock:
            self._sets = deque(m for m in self._sets if not (m.landed or m.retired))
            return list(self._sets)
