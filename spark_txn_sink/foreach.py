"""Exactly-once writes from ``foreachBatch``: what ``outputMode("update")`` needs.

Spark refuses ``outputMode("update")`` for every Python data source before the sink is reached (it
requires a JVM interface, ``SupportsStreamingUpdateAsAppend``, that the Python API does not offer; the query
fails with Spark's "txnlog does not support Update mode.", and no txnlog code runs to say more). The
same result, each micro-batch's updated rows appended in one transaction, exactly once, comes from
``foreachBatch`` and an idempotent batch write: every call writes with ``txnAppId`` (the application)
and ``txnVersion`` (the batch id), and a batch that Spark replays after a failure commits nothing the
second time (PROTOCOL.md here, "Idempotent batch writes").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from spark_txn_source.datasource import FORMAT_NAME


def idempotent_batch_writer(url: str, topic: str, app_id: str, **options: str) -> Callable[[Any, int], None]:
    """A ``foreachBatch`` function appending each micro-batch to ``topic`` exactly once.

    ``app_id`` names the application and must stay the same across restarts of the query (one per
    query: two queries writing under one ``app_id`` to one topic would skip each other's batches; versions
    are counted per topic, so one query may write its batches to several topics under one ``app_id``). It belongs to the
    query's checkpoint: a new checkpoint numbers batches from 0 again, and under an ``app_id`` that already
    committed batches they would be skipped as replays, so a query started afresh needs a new ``app_id``
    (PROTOCOL.md here, "Idempotent batch writes"). Other writer options (``partitions``, ``keyColumn``,
    ``storage.*``...) pass through::

        (counts.writeStream.outputMode("update")
            .foreachBatch(idempotent_batch_writer("s3://b/log", "counts", "counts-job", partitions="4"))
            .option("checkpointLocation", "...").start())
    """

    def write(df: Any, batch_id: int) -> None:
        writer = df.write.format(FORMAT_NAME).mode("append").option("topic", topic)
        for key, value in options.items():
            writer = writer.option(key, str(value))
        writer.option("txnAppId", app_id).option("txnVersion", str(int(batch_id))).save(url)

    return write
