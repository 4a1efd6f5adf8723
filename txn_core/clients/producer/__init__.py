"""The producer (PROTOCOL.md "Transactions"), by concept:

* :mod:`~txn_core.clients.producer.client`: the :class:`Producer` API and its client state machine;
* :mod:`~txn_core.clients.producer.accumulator`: buffering and batching per partition log, appends in flight;
* :mod:`~txn_core.clients.producer.completion`: the second phase of decided transactions (markers, Complete).
"""

from txn_core.clients.producer.accumulator import InFlight, PartitionBuffer
from txn_core.clients.producer.client import DEFAULT_BATCH_BYTES, MAX_ENTRY_BYTES, Producer, RecordMetadata
from txn_core.clients.producer.completion import COMPLETE_LINGER_S, Completions

__all__ = [
    "COMPLETE_LINGER_S",
    "DEFAULT_BATCH_BYTES",
    "MAX_ENTRY_BYTES",
    "Completions",
    "InFlight",
    "PartitionBuffer",
    "Producer",
    "RecordMetadata",
]
