"""The transaction coordinator (PROTOCOL.md "Transaction log", "Producer ids"): the transaction log of each
coordinator partition, the state of each transactional id, the actions its records hold and how they
apply, producer-id allocation, and the service that begins, decides and completes transactions.

Holds: ``txnlog`` (a coordinator partition: replay, refresh and queries; the views of all of them),
``groupcommit`` (appends batched into one record), ``snapshots`` (its snapshots and compaction), ``holes``
(hole probes and damage), ``txnindex`` (open transactions and recent outcomes), ``actions`` (the record
kinds, declared), ``apply`` (how an action changes a transactional id's state), ``tidstate`` (that state),
``pidalloc`` (producer ids), ``service`` (the coordinator).

May import: ``txn_core.partition`` (it writes markers into partitions), ``txn_core.format``,
``txn_core.storage``, ``errors``, ``clock``, ``logs``."""
