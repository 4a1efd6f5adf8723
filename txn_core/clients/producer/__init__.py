"""The producer (PROTOCOL.md "Transactions"), by concept:

* :mod:`~txn_core.clients.producer.client`: the :class:`Producer` API, which only composes the others;
* :mod:`~txn_core.clients.producer.transactions`: the client state machine and every coordinator request;
* :mod:`~txn_core.clients.producer.accumulator`: routing, buffering and batching per partition log, appends in flight;
* :mod:`~txn_core.clients.producer.sender`: writing entries to partition logs (data, staged references, offsets);
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
