"""Entry points :class:`~spark_txn_source.datasource.TxnLogDataSource` dispatches to, and the executor read.

* :func:`source_schema`: options parsed and checked, log opened, topic schemas unified (errors surface when
  the DataFrame is defined, i.e. at query start);
* :func:`make_batch_reader` / :func:`make_stream_reader`: the readers (:mod:`spark_txn_source.batch`,
  :mod:`spark_txn_source.stream`);
* :func:`read_partition`: what every task runs, on executors: read one planned
  :class:`~txn_core.partition.ranges.OffsetRange` with :func:`txn_core.partition.ranges.read_range` and hand
  Spark Arrow record batches of exactly the schema it expects. Executors never talk to the transaction
  coordinator and never write: the range carries every filter, and storage is opened without the write self-test.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pyarrow as pa
from pyspark.sql.datasource import InputPartition
from pyspark.sql.types import (
    ArrayType,
    DataType,
    DateType,
    DayTimeIntervalType,
    MapType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from spark_txn_source.options import SourceOptions, parse_options
from spark_txn_source.planning import (
    SourceCorruptDataError,
    SourceDataLossError,
    damage_hint,
    data_loss_hint,
    open_existing_log,
)
from spark_txn_source.schema import (
    BatchOrigin,
    arrow_target,
    check_requested,
    conform,
    metadata_fields,
    spark_schema,
    topic_arrow_schema,
)
from txn_core.clock import system_clock
from txn_core.errors import CorruptDataError, DataLossError
from txn_core.partition.partition import PartitionLog
from txn_core.partition.ranges import OffsetRange, read_range
from txn_core.storage import Storage, open_storage

if TYPE_CHECKING:
    from spark_txn_source.batch import TxnLogBatchReader
    from spark_txn_source.stream import TxnLogStreamReader


class RangePartition(InputPartition):
    """One Spark task: one or more :class:`OffsetRange` read one after the other, in the given order
    (picklable, no credentials beyond the reader's options). ``range`` is the first."""

    def __init__(self, rng: OffsetRange, *more: OffsetRange) -> None:
        super().__init__((rng, *more))
        self.ranges = (rng, *more)
        self.range = rng

    def __repr__(self) -> str:
        return "RangePartition(" + ", ".join(f"{r.topic}-{r.partition} [{r.start}, {r.end})" for r in self.ranges) + ")"


def source_schema(options: dict[str, str]) -> StructType:
    """The Spark schema of a read (see :mod:`spark_txn_source.schema`); validates options and topics."""
    opts = parse_options(options, streaming=None)  # schema() serves batch and streaming reads alike
    log = open_existing_log(opts.path, opts.storage_options)
    schemas = {t: log.topics.get(t).schema for t in opts.topics}
    return spark_schema(topic_arrow_schema(schemas), opts.include_metadata)


def _checked(options: dict[str, str], schema: StructType, streaming: bool, table: bool) -> SourceOptions:
    """The parsed options, once ``schema`` (the one Spark asks for) is known to fit the topics' columns and types
    (:func:`~spark_txn_source.schema.check_requested`; ``table``: it is a catalog table's stored schema)."""
    opts = parse_options(options, streaming=streaming)
    check_requested(schema, source_schema(options), table=table)
    return opts


def make_batch_reader(options: dict[str, str], schema: StructType, *, table: bool = False) -> TxnLogBatchReader:
    from spark_txn_source import batch

    return batch.make(_checked(options, schema, streaming=False, table=table), schema)


def make_stream_reader(options: dict[str, str], schema: StructType, *, table: bool = False) -> TxnLogStreamReader:
    from spark_txn_source.stream import TxnLogStreamReader

    return TxnLogStreamReader(_checked(options, schema, streaming=True, table=table), schema)


def _has_temporal(dt: DataType) -> bool:
    """Whether ``dt`` holds a timestamp, date or day-time interval at any depth: a conversion from the topic's
    unit may then meet a value Spark cannot hold, and the error names its offset."""
    if isinstance(dt, TimestampType | TimestampNTZType | DateType | DayTimeIntervalType):
        return True
    if isinstance(dt, StructType):
        return any(_has_temporal(f.dataType) for f in dt.fields)
    if isinstance(dt, ArrayType):
        return _has_temporal(dt.elementType)
    if isinstance(dt, MapType):
        return _has_temporal(dt.keyType) or _has_temporal(dt.valueType)
    return False


# --- executor side ------------------------------------------------------------------------------

_storages: dict[str, Storage] = {}
_storages_lock = threading.Lock()


def _storage(opts: SourceOptions) -> Storage:
    """One storage per log and options per worker process (Python workers are reused across tasks)."""
    key = json.dumps([opts.path, opts.storage_options], sort_keys=True, default=str)
    with _storages_lock:
        storage = _storages.get(key)
        if storage is None:
            storage = open_storage(opts.path, dict(opts.storage_options) or None, self_test=False)
            _storages[key] = storage
        return storage


def read_partition(opts: SourceOptions, schema: StructType, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    """The record batches of one task, each with exactly the Arrow schema Spark expects for ``schema``."""
    if not isinstance(partition, RangePartition):
        return  # Spark's placeholder partition when the plan is empty
    target = arrow_target(schema)
    for rng in partition.ranges:
        yield from _read_range(opts, schema, target, rng)


def _read_range(
    opts: SourceOptions, schema: StructType, target: pa.Schema, rng: OffsetRange
) -> Iterator[pa.RecordBatch]:
    plog = PartitionLog(_storage(opts), rng.path, clock=system_clock)  # a task has no Log: its own clock
    origin = BatchOrigin(rng.topic, rng.partition, truncate=opts.timestamp_precision == "truncate")
    try:
        for batch in read_range(
            plog,
            rng,
            metadata=opts.include_metadata or _has_temporal(schema),  # offsets name a value Spark cannot hold
            fail_on_data_loss=opts.fail_on_data_loss,
            metadata_fields=metadata_fields(target),
        ):
            yield conform(batch, target, origin)  # the batch itself when the topic's columns are Spark's types
    except DataLossError as exc:
        raise SourceDataLossError(data_loss_hint(str(exc))) from exc
    except CorruptDataError as exc:  # damaged since planning, or a damaged payload (failOnDataLoss=true)
        if isinstance(exc, SourceCorruptDataError) or not opts.fail_on_data_loss:
            raise
        raise damage_hint(exc) from exc
