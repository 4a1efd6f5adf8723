"""Planning checks on the driver: the target topic exists (or is created) and accepts the frame's schema.

Runs before any task starts, so a mismatch fails the query with nothing written. The frame's columns
``_topic``, ``_partition``, ``_offset`` and ``_timestamp`` (added by a txnlog source) are ignored.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from spark_txn_sink.options import SOURCE_METADATA_COLUMNS, SinkOptions
from txn_core import ConfigurationError, SchemaMismatchError, TopicExistsError, TopicNotFoundError
from txn_core.log import Log
from txn_core.schema import conform
from txn_core.topics import TopicMeta


def frame_arrow_schema(spark_schema: Any) -> pa.Schema:
    """The Arrow schema of the frame's data columns (metadata columns and field metadata removed)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    try:
        arrow = to_arrow_schema(spark_schema, timezone="UTC")
    except Exception as exc:  # pyspark raises its own error types for unsupported types
        raise SchemaMismatchError(f"the frame has a column type Arrow cannot represent: {exc}") from exc
    fields = [pa.field(f.name, f.type, f.nullable) for f in arrow if f.name not in SOURCE_METADATA_COLUMNS]
    if not fields:
        raise SchemaMismatchError(
            f"the frame has no data columns (only {[f.name for f in arrow]}); nothing to write")
    return pa.schema(fields)


def ensure_topic(log: Log, opts: SinkOptions, frame: pa.Schema) -> TopicMeta:
    """The target topic, created from ``frame`` when missing and ``partitions`` is set; checks the schema."""
    try:
        meta = log.topics.get(opts.topic)
    except TopicNotFoundError as exc:
        if opts.partitions is None:
            raise TopicNotFoundError(
                f"{exc} Or let the sink create it from the frame's schema: .option('partitions', N)."
            ) from exc
        try:
            meta = log.create_topic(opts.topic, opts.partitions, frame)
        except TopicExistsError:  # a concurrent creator won: fine if its schema accepts ours (checked below)
            meta = log.topics.get(opts.topic)
    check_schema(meta, frame, opts)
    return meta


def check_schema(meta: TopicMeta, frame: pa.Schema, opts: SinkOptions) -> None:
    """Raise :class:`SchemaMismatchError` naming every column that does not fit the topic."""
    from spark_txn_sink.stager import align_timestamps

    empty = pa.RecordBatch.from_arrays([pa.array([], type=f.type) for f in frame], schema=frame)
    try:
        conform(align_timestamps(empty, meta.schema), meta.schema, topic=meta.name)
    except SchemaMismatchError as exc:
        raise SchemaMismatchError(
            f"{exc} Columns {list(SOURCE_METADATA_COLUMNS)} of a txnlog source are ignored; select or cast "
            "the other columns to match.", exc.differences) from exc
    if opts.key_column is not None and opts.key_column not in frame.names:
        raise ConfigurationError(
            f"keyColumn {opts.key_column!r} is not a column of the frame; its columns are {frame.names}")
