"""Redelivery policy: how long a negatively acknowledged record waits, and how many times a record is
delivered before it goes to the dead-letter topic (PROTOCOL.md "Subscriptions", "Redelivery and dead
letters").

* :class:`RedeliveryBackoff` is Pulsar's ``MultiplierRedeliveryBackoff``: the ``n``-th redelivery of a
  negatively acknowledged record waits ``min_delay_ms * multiplier ** (n - 1)``, at most ``max_delay_ms``.
* :class:`DeadLetterPolicy` is Pulsar's ``DeadLetterPolicy``: a record is handed to the application at most
  ``1 + max_redeliveries`` times; the next time it would be delivered it is written to the dead-letter topic
  and acknowledged in one transaction instead (:mod:`.deadletter`).
* :class:`DeliveryCounts` counts how many times this consumer delivered each record (Pulsar's
  ``redeliveryCount``, which the broker keeps in memory). Invariant: a count only grows while the record is
  unacknowledged, and is forgotten once the record is below the mark-delete position. Counts live in the
  consumer: one that restarts counts from zero, so a record is delivered *at least* ``1 + max_redeliveries``
  times before it is dead-lettered, never fewer.
"""

from __future__ import annotations

from dataclasses import dataclass

from txn_core.clients.subscriptions.store import SubscriptionRef
from txn_core.errors import ConfigurationError
from txn_core.format.ids import is_int, validate_name

#: Suffix of the default dead-letter topic, ``<topic>-<subscription>-DLQ`` (Pulsar's default name).
DLQ_SUFFIX = "-DLQ"


@dataclass(frozen=True, slots=True)
class RedeliveryBackoff:
    """Delay before the ``n``-th redelivery of a negatively acknowledged record (see module doc)."""

    min_delay_ms: int
    max_delay_ms: int
    multiplier: float = 2.0

    def __post_init__(self) -> None:
        if not is_int(self.min_delay_ms) or self.min_delay_ms < 0:
            raise ConfigurationError(f"RedeliveryBackoff.min_delay_ms must be an int >= 0, got {self.min_delay_ms!r}")
        if not is_int(self.max_delay_ms) or self.max_delay_ms < self.min_delay_ms:
            raise ConfigurationError(
                f"RedeliveryBackoff.max_delay_ms must be an int >= min_delay_ms ({self.min_delay_ms}), got "
                f"{self.max_delay_ms!r}"
            )
        if not isinstance(self.multiplier, int | float) or isinstance(self.multiplier, bool) or self.multiplier < 1:
            raise ConfigurationError(f"RedeliveryBackoff.multiplier must be a number >= 1, got {self.multiplier!r}")

    def delay_ms(self, redelivery: int) -> int:
        """The delay before redelivery number ``redelivery`` (1 for the first)."""
        exponent = max(0, redelivery - 1)
        if self.multiplier == 1 or self.min_delay_ms == 0:
            return self.min_delay_ms
        if exponent > 64:  # far past any cap: avoid overflowing the float
            return self.max_delay_ms
        return int(min(self.max_delay_ms, self.min_delay_ms * self.multiplier**exponent))


@dataclass(frozen=True, slots=True)
class DeadLetterPolicy:
    """Where records go after ``max_redeliveries`` redeliveries (see module doc).

    ``dead_letter_topic``: default ``<topic>-<subscription>-DLQ``, created on first use with the source
    topic's schema and partition count (a record of partition ``p`` goes to partition ``p``).
    ``transaction_timeout_ms``: of the transaction that writes a dead letter and acknowledges it."""

    max_redeliveries: int
    dead_letter_topic: str | None = None
    transaction_timeout_ms: int = 60_000

    def __post_init__(self) -> None:
        if not is_int(self.max_redeliveries) or self.max_redeliveries < 0:
            raise ConfigurationError(
                f"DeadLetterPolicy.max_redeliveries must be an int >= 0, got {self.max_redeliveries!r}"
            )
        if self.dead_letter_topic is not None:
            validate_name("dead-letter topic", self.dead_letter_topic)
        if not is_int(self.transaction_timeout_ms) or self.transaction_timeout_ms < 1:
            raise ConfigurationError(
                f"DeadLetterPolicy.transaction_timeout_ms must be a positive int, got {self.transaction_timeout_ms!r}"
            )

    def topic_for(self, ref: SubscriptionRef) -> str:
        return self.dead_letter_topic or default_dead_letter_topic(ref)


def default_dead_letter_topic(ref: SubscriptionRef) -> str:
    return f"{ref.topic}-{ref.name}{DLQ_SUFFIX}"


class DeliveryCounts:
    """How many times this consumer delivered each unacknowledged record (see module doc)."""

    __slots__ = ("_counts",)

    def __init__(self) -> None:
        self._counts: dict[int, int] = {}

    def delivered(self, offset: int) -> int:
        """Count one delivery of ``offset``; returns how many there were."""
        n = self._counts.get(offset, 0) + 1
        self._counts[offset] = n
        return n

    def redeliveries(self, offset: int) -> int:
        """Deliveries of ``offset`` after its first (0 if delivered once or never)."""
        return max(0, self._counts.get(offset, 0) - 1)

    def forget_below(self, offset: int) -> None:
        for o in [o for o in self._counts if o < offset]:
            del self._counts[o]

    def forget(self, offset: int) -> None:
        self._counts.pop(offset, None)
