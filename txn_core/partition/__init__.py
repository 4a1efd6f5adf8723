"""One partition log and its state (PROTOCOL.md "Partition log", "Appenders", "Transaction buffer",
"Snapshots", "Idempotence", "Reading", "Read bound", "Damage", "Staged data").

Holds: ``partition`` (the partition log: it builds the parts below and forwards their API), ``logstart``
(the log start), ``index`` (the offset -> slot index and the cached tail), ``holes`` (what a missing slot
is: rolled, removed by retention, a hole, the log end), ``fetch`` (reading entries through segments and lost
entries), ``tail`` (the tail search), ``appender`` (appends), ``appendchain`` (pipelined appends),
``segments`` (the segments as a reader knows them), ``readahead``, ``records`` (entries to Arrow batches),
``buffer`` (the transaction buffer and the last stable offset), ``aborted`` (the aborted-transaction index),
``sequences`` (per-producer sequences for de-duplication), ``snapshots`` (multi-part buffer snapshots),
``state`` (the partition's transaction state and read bound), ``reader`` (its reader under an isolation
level), ``registry`` (one partition log and one shared state per path), ``ranges`` (reading an offset
range), ``timeindex``, ``lost`` (lost-entry records), ``skipping`` (passing over lost or skipped records),
``staging`` (staged data committed by reference), ``ages`` (how old an object must be to be deleted).

May import: ``txn_core.format``, ``txn_core.storage``, ``errors``, ``clock``, ``logs``. The reader learns
transactions' outcomes through a resolver it is given (the coordinator's, from above), never by importing
the coordinator.
"""
