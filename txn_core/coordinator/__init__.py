"""The transaction coordinator (PROTOCOL.md "Transaction log", "Producer ids"): the transaction log of each
coordinator partition, the state of each transactional id, the actions its records hold and how they
apply, producer-id allocation, and the service that begins, decides and completes transactions.

May import: ``txn_core.partition`` (it writes markers into partitions), ``txn_core.format``,
``txn_core.storage``, ``errors``, ``clock``, ``logs``."""
