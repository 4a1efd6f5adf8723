"""Pipelined appends of one process to one partition (PROTOCOL.md "Appenders", pipelining).

Two threads of a process appending to the same partition (a producer's data and the marker of its previous
transaction, written by its completer) used to take turns: the second waited for the first's whole create.
Now the second *claims* the slot after the first's while the first is in flight, writes its bytes (on local
disk: into an unnamed file, fsynced), and makes them visible only once the first one landed (its gate).

Invariants:

- An entry at slot ``s + 1`` claimed behind an in-flight claim at ``s`` becomes visible only after the entry
  at ``s`` is durable and this process knows it (its create returned). A crash anywhere leaves a prefix of
  the chain: never a missing slot below a present one (a hole, which is damage).
- A claim whose predecessor did not land (lost the slot to another process, its own gate closed, an error,
  a crash) never becomes visible: its gate closes and its appender claims again from the tail it knows.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class Claim:
    """This process's append in flight at ``slot``; ``next_offset`` is where the entry after it begins."""

    __slots__ = ("_done", "_landed", "next_offset", "slot")

    def __init__(self, slot: int, next_offset: int) -> None:
        self.slot = slot
        self.next_offset = next_offset
        self._done = threading.Event()
        self._landed = False

    def settle(self, landed: bool) -> None:
        """Record the outcome (once): whether the entry landed at :attr:`slot`."""
        self._landed = landed
        self._done.set()

    @property
    def settled(self) -> bool:
        """Whether the outcome is recorded."""
        return self._done.is_set()

    def wait_landed(self) -> bool:
        """Block until settled; whether the entry landed."""
        self._done.wait()
        return self._landed


class ChainGate:
    """The gate of an append claimed behind ``prev``: ``prev`` landed, then the caller's own ``gate`` opens.

    After the create, :attr:`prev_failed` tells a closed gate that calls for a new claim (the predecessor did
    not land; the caller's gate was not asked) from one the caller must hear of, and :attr:`opened` whether the
    entry may have become visible (a later attempt needs no gate).
    """

    __slots__ = ("gate", "opened", "prev", "prev_failed")

    def __init__(self, prev: Claim | None, gate: Callable[[], bool] | None) -> None:
        self.prev = prev
        self.gate = gate
        self.prev_failed = False
        self.opened = False

    def __call__(self) -> bool:
        if self.prev is not None and not self.prev.wait_landed():
            self.prev_failed = True
            return False
        if self.gate is not None and not self.gate():
            return False
        self.opened = True
        return True
