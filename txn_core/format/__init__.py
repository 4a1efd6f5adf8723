"""The bottom layer: what txnlog writes, byte for byte (PROTOCOL.md "Envelope", "Entries", "Segments",
"Slot logs", "Layout", "Identifiers", "State machines", "Schemas").

Holds: ``entry`` (the partition entry: header and payload kinds), ``envelope`` (every other object),
``checksum`` (CRC-32C), ``ids`` (topic-partitions, transaction ids), ``paths`` (every key under a log URL),
``segment`` (the segment object), ``slotlog`` (a dense sequence of immutable objects), ``states`` (the
transaction state machines as data), ``schema`` (conforming input to a topic's Arrow schema).

May import: ``txn_core.storage`` (the contract it writes through), ``errors``, ``clock``, ``logs``.
Nothing above it.
"""
