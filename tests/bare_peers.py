"""The bare peers of txnlog's Spark source and sink: the least a Python data source can do.

``format("bench_bare_arrow")`` (:class:`BareArrowSink`) appends the Arrow batches each task is handed to one
IPC file: no transactions, no fsync, no commit. ``format("bench_bare_arrow_source")`` (:class:`BareArrowSource`)
yields Arrow IPC files' batches as they are on disk, ``maxFilesPerTrigger`` files per micro-batch. Nothing
written with PySpark's Python data source API can be faster than these; ``tests/bench_spark_sink.py`` measures
txnlog's copies against them. :func:`register_bare_peers` registers both in a session.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow


class _BareMessage(WriterCommitMessage):
    pass


class _BareArrowWriter(DataSourceStreamArrowWriter):
    """Streams each task's batches into one Arrow IPC file: no transactions, no fsync, no commit."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        import uuid

        writer = None
        with open(os.path.join(self.directory, uuid.uuid4().hex), "wb") as f:
            for batch in iterator:
                if writer is None:
                    writer = pa.ipc.new_stream(f, batch.schema)
                writer.write_batch(batch)
            if writer is not None:
                writer.close()
        return _BareMessage()

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        pass

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        pass


class BareArrowSink(DataSource):
    """``format("bench_bare_arrow")``: the peer the transactional sink is measured against."""

    @classmethod
    def name(cls) -> str:
        return "bench_bare_arrow"

    def streamWriter(self, schema: Any, overwrite: bool) -> DataSourceStreamArrowWriter:  # noqa: N802
        directory = self.options["path"]
        os.makedirs(directory, exist_ok=True)
        return _BareArrowWriter(directory)


class _File(InputPartition):
    def __init__(self, path: str) -> None:
        self.path = path


class _BareArrowStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Arrow IPC files (one per input chunk, in name order) as a stream, ``maxFilesPerTrigger`` files per
    micro-batch (under ``Trigger.AvailableNow`` too, as txnlog's and parquet's sources: without
    ``SupportsTriggerAvailableNow`` Spark would read everything in one micro-batch), each file a task that
    yields its batches as they are on disk: no checks, no offsets in the rows, nothing but PySpark's own
    hand-over to the JVM."""

    def __init__(self, directory: str, per_trigger: int) -> None:
        self.files = sorted(os.path.join(directory, f) for f in os.listdir(directory))
        self.per_trigger = per_trigger

    def initialOffset(self) -> dict[str, int]:  # noqa: N802
        return {"file": 0}

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802
        return ReadMaxRows(self.per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802
        pass  # the files are all there at start: nothing to fix

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:  # noqa: N802
        step = limit.max_rows if isinstance(limit, ReadMaxRows) else len(self.files)
        return {"file": min(len(self.files), start["file"] + step)}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        return [_File(f) for f in self.files[start["file"] : end["file"]]]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, _File)
        with pa.OSFile(partition.path, "rb") as f:
            reader = pa.ipc.open_file(f)
            for i in range(reader.num_record_batches):
                yield reader.get_batch(i)


class BareArrowSource(DataSource):
    """``format("bench_bare_arrow_source")``: the cheapest streaming source PySpark's Python data source API
    allows, the peer of txnlog's source."""

    @classmethod
    def name(cls) -> str:
        return "bench_bare_arrow_source"

    def schema(self) -> str:
        return self.options["ddl"]

    def streamReader(self, schema: Any) -> DataSourceStreamReader:  # noqa: N802
        return _BareArrowStreamReader(self.options["path"], int(self.options["maxFilesPerTrigger"]))


def into_bare_sink(df: Any, root: Path, name: str) -> Any:
    """Start ``df`` into :class:`BareArrowSink` (files under ``root / name``), ``Trigger.AvailableNow``."""
    return (
        df.writeStream.format("bench_bare_arrow")
        .option("checkpointLocation", str(root / f"chk-{name}"))
        .trigger(availableNow=True)
        .start(str(root / name))
    )


def register_bare_peers(spark: Any) -> None:
    """Register :class:`BareArrowSink` and :class:`BareArrowSource` (this module pickled by value: the Python
    workers cannot import ``tests``)."""
    import sys

    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # type: ignore[no-untyped-call]
    spark.dataSource.register(BareArrowSink)
    spark.dataSource.register(BareArrowSource)
