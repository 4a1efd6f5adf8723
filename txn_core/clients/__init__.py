"""The clients (PROTOCOL.md "Transactions", "Consuming", "Consumer groups", "Topics", "Subscriptions",
"Application transactions").

Holds: ``context`` (:class:`LogContext`, the dependencies every client and operation is given),
``producer`` (the idempotent and transactional producer: API, transaction manager, accumulator, sender),
``consumer``, ``groups`` (consumer-group offsets), ``offsets_fence``, ``topics`` (topic metadata),
``routing`` (rows to partitions), ``appunit`` (an application transaction's unit and the rules of its
progress), ``progress`` (the progress record), ``apptxn`` (committing a unit exactly once), ``appmanifest``
(a unit's manifest and the cleanup of its staged objects), ``subscriptions`` (Pulsar-style subscriptions
with transactional acknowledgements).

May import: ``txn_core.coordinator``, ``txn_core.partition``, ``txn_core.format``, ``txn_core.storage``,
``errors``, ``clock``, ``logs``.
"""
