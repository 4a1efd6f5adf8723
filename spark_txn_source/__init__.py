"""Spark source for txnlog: ``spark.read.format("txnlog")`` and ``spark.readStream.format("txnlog")``."""

from spark_txn_source.datasource import FORMAT_NAME, TxnLogDataSource, register

__all__ = ["FORMAT_NAME", "TxnLogDataSource", "register"]
