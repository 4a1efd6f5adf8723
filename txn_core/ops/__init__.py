"""Operations on a log (PROTOCOL.md "Admin", "Retention", "Segments", "Compaction", "Damage").

Holds: ``admin`` (list, describe, abort, expire and find hanging transactions), ``describe`` (topics,
partitions and groups described), ``maintenance`` (retention,
snapshots, compaction, the staged-data sweep), ``rolling`` (history into segments), ``damage`` (finding
damaged entries and marking them lost).

May import every layer below: ``txn_core.clients``, ``txn_core.coordinator``, ``txn_core.partition``,
``txn_core.format``, ``txn_core.storage``, ``errors``, ``clock``, ``logs``.
"""
