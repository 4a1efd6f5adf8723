"""Errors of subscriptions (members of the :class:`~txn_core.errors.TxnLogError` family).

A conflicting acknowledgement raises the core's :class:`~txn_core.errors.TransactionConflictError`.
"""

from __future__ import annotations

from txn_core.errors import TxnLogError


class SubscriptionNotFoundError(TxnLogError, LookupError):
    """The subscription does not exist. The message lists the subscriptions of that topic partition."""


class ConsumerBusyError(TxnLogError):
    """An Exclusive subscription is held by another consumer, or a sticky Key_Shared consumer's key ranges
    overlap another's (Pulsar's ``ConsumerBusyException``).

    ``holder`` is that consumer's id (its name and a random suffix), ``expires_ms`` when its hold lapses
    unless renewed (log clock, milliseconds since the epoch)."""

    def __init__(self, message: str, *, holder: str, expires_ms: int) -> None:
        super().__init__(message)
        self.holder = holder
        self.expires_ms = expires_ms
