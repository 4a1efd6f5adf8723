"""The one ``txnlog`` Spark data source: batch and streaming reads and writes.

Spark knows a format name by one class; this is it. Reading is implemented in :mod:`spark_txn_source`,
writing in :mod:`spark_txn_sink`; this class only dispatches, so registering it from either package
(``spark_txn_source.register(spark)`` or ``spark_txn_sink.register(spark)``) makes ``read``,
``readStream``, ``write`` and ``writeStream`` all work.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from spark_txn_source import catalog

FORMAT_NAME = "txnlog"


class TxnLogDataSource(DataSource):
    """``spark.read/readStream/write/writeStream.format("txnlog")``."""

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self) -> StructType | str:
        from spark_txn_source.reader import source_schema

        schema = source_schema(catalog.normalise(self.options))
        if catalog.is_catalog_create(self.options):  # CREATE TABLE: the table must remember its options
            return catalog.embed(schema, self.options)  # type: ignore[no-any-return]
        return schema

    def reader(self, schema: StructType) -> DataSourceReader:
        from spark_txn_source.reader import make_batch_reader

        table = catalog.reads_table(self.options, schema)
        return make_batch_reader(catalog.recover(self.options, schema), catalog.strip(schema), table=table)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:  # noqa: N802 - Spark API
        from spark_txn_source.reader import make_stream_reader

        table = catalog.reads_table(self.options, schema)
        return make_stream_reader(catalog.recover(self.options, schema), catalog.strip(schema), table=table)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from spark_txn_sink.writer import make_batch_writer

        return make_batch_writer(*catalog.for_writing(self.options, schema), overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:  # noqa: N802
        from spark_txn_sink.writer import make_stream_writer

        return make_stream_writer(*catalog.for_writing(self.options, schema), overwrite)


def register(spark: Any) -> None:
    """Register the ``txnlog`` format with a SparkSession (classic or Connect)."""
    spark.dataSource.register(TxnLogDataSource)
