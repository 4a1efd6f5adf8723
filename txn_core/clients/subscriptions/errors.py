"""Errors of subscriptions (members of the :class:`~txn_core.errors.TxnLogError` family).

A conflicting acknowledgement raises the core's :class:`~txn_core.errors.TransactionConflictError`.
"""

from __future__ import annotations

from txn_core.errors import TxnLogError


class SubscriptionNotFoundError(TxnLogError, LookupError):
    """The subscription does not exist. The message lists the subscriptions of that topic partition."""
