"""Entries appended straight to a partition log, past the producer: what a zombie's late write or a
transaction whose partition was never registered (a hanging transaction) leaves behind; and staged rows,
as a writer of large rows stages them before it references them."""

from __future__ import annotations

import pyarrow as pa

import txn_core
from txn_core.clock import system_clock
from txn_core.format import paths
from txn_core.format.entry import EntryKind, Payload
from txn_core.format.ids import TxnId
from txn_core.partition import staging
from txn_core.partition.staging import StagedRef


def staged_rows(
    log: txn_core.Log, writer: str, attempt: int, topic: str, ids: list[int], schema: pa.Schema
) -> StagedRef:
    """A staged object of partition 0 of ``topic`` holding ``ids`` (a one-column ``id`` batch), as a writer
    staging large rows writes it; its reference, for ``send_staged``."""
    ref = staging.write_staged(
        log.storage,
        staging.staging_prefix(writer, attempt),
        topic,
        0,
        [pa.record_batch({"id": ids}, schema=schema)],
        schema,
        clock=system_clock,
    )
    assert ref is not None
    return ref


def append_data(
    log: txn_core.Log,
    topic: str,
    partition: int,
    batch: pa.RecordBatch,
    schema: pa.Schema,
    *,
    producer_id: int,
    epoch: int,
    txn: TxnId | None,
    base_sequence: int = 0,
) -> None:
    """One DATA entry holding ``batch``, stamped with the given producer, epoch, sequence and transaction."""
    log.partition_log(paths.partition_log_path(topic, partition)).append_payload(
        EntryKind.DATA,
        Payload.of_arrow([batch], schema),
        batch.num_rows,
        producer_id=producer_id,
        producer_epoch=epoch,
        base_sequence=base_sequence,
        txn=txn,
    )
