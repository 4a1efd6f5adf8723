"""Subscriptions with transactional acknowledgements: Pulsar's pending-ack state on the core
(PROTOCOL.md "Subscriptions").

Modules, one concept each: :mod:`.bitsets` (ack sets and the AND / flip / OR procedure), :mod:`.records`
(ack-log record format), :mod:`.state` (the replayed cursor and pending acks, with ``_check``),
:mod:`.acklog` (append, replay, verdicts), :mod:`.store` (layout, metadata, snapshots), :mod:`.leases` and
:mod:`.dispatcher` (shared dispatch), :mod:`.hold` (the one consumer delivering an Exclusive or Failover
subscription), :mod:`.members` (a Failover subscription's members and its active one), :mod:`.seats` (who
delivers, by type), :mod:`.redelivery` and :mod:`.deadletter` (back-off, dead letters), :mod:`.trim`
(bounded growth), :mod:`.consumer` (the API) and :mod:`.subscription` (administration).
"""

from txn_core.clients.subscriptions.consumer import SubscriptionConsumer
from txn_core.clients.subscriptions.errors import ConsumerBusyError, SubscriptionNotFoundError
from txn_core.clients.subscriptions.redelivery import DeadLetterPolicy, RedeliveryBackoff
from txn_core.clients.subscriptions.state import AckStatus, SubscriptionState
from txn_core.clients.subscriptions.store import SubscriptionType, list_subscriptions
from txn_core.clients.subscriptions.subscription import Subscription, SubscriptionDescription, trim_all
from txn_core.clients.subscriptions.trim import TrimResult

__all__ = [
    "AckStatus",
    "ConsumerBusyError",
    "DeadLetterPolicy",
    "RedeliveryBackoff",
    "Subscription",
    "SubscriptionConsumer",
    "SubscriptionDescription",
    "SubscriptionNotFoundError",
    "SubscriptionState",
    "SubscriptionType",
    "TrimResult",
    "list_subscriptions",
    "trim_all",
]
