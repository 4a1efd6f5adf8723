"""Spark sink for txnlog: ``df.write.format("txnlog")`` and ``df.writeStream.format("txnlog")``."""

from spark_txn_sink.demo import run_demo
from spark_txn_sink.foreach import idempotent_batch_writer
from spark_txn_source.datasource import FORMAT_NAME, TxnLogDataSource, register

__all__ = ["FORMAT_NAME", "TxnLogDataSource", "idempotent_batch_writer", "register", "run_demo"]
