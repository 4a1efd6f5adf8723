"""txnlog core: a transactional log on any fsspec filesystem, with no broker (see PROTOCOL.md).

Start with :func:`open_log`::

    log = txn_core.open_log("file:///tmp/mylog")
    log.create_topic("orders", partitions=4, schema=pa.schema([("id", pa.int64())]))
    p = log.producer(transactional_id="copier-1")
    p.init_transactions(); p.begin_transaction(); p.send("orders", table); p.commit_transaction()

Importing ``txn_core`` is cheap: the names below load their module on first use (PEP 562), so a process
that only reads (a Spark task, the stream source's driver process) never imports the producer, the
subscriptions or the admin API.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from txn_core.logs import configure_from_env

if TYPE_CHECKING:
    from txn_core.clients.apptxn import AppCommitter, CommitResult, GroupPosition, abort_staged, commit_staged
    from txn_core.clients.appunit import AppVersion
    from txn_core.clients.consumer import Consumer
    from txn_core.clients.producer import Producer, RecordMetadata
    from txn_core.clients.subscriptions import (
        AckStatus,
        ConsumerBusyError,
        DeadLetterPolicy,
        RedeliveryBackoff,
        Subscription,
        SubscriptionConsumer,
        SubscriptionNotFoundError,
        SubscriptionState,
        SubscriptionType,
    )
    from txn_core.errors import (
        AppScopeError,
        CommitFailedError,
        CommitStateUnknownError,
        CompletionFailedError,
        ConcurrentTransactionsError,
        ConfigurationError,
        CorruptDataError,
        DamagedEntryError,
        DataLossError,
        GroupFencedError,
        GroupNotFoundError,
        InvalidNameError,
        InvalidOffsetError,
        InvalidTxnStateError,
        ObjectExistsError,
        ObjectNotFoundError,
        OffsetOutOfRangeError,
        OutOfOrderSequenceError,
        ProducerClosedError,
        ProducerFencedError,
        RetryableStorageError,
        SchemaMismatchError,
        StorageContractError,
        StorageError,
        TopicExistsError,
        TopicNotFoundError,
        TransactionalIdTakenOverError,
        TransactionConflictError,
        TransactionTimedOutError,
        TransactionTooLargeError,
        TxnLogError,
        UnknownOutcomeError,
        UnstableOffsetsError,
    )
    from txn_core.format.ids import TopicPartition, TxnId
    from txn_core.format.states import ClientState, CoordinatorState
    from txn_core.log import Log, open_log
    from txn_core.ops.admin import HangingTransaction, TransactionDescription, TransactionListing
    from txn_core.ops.describe import (
        DamagedEntryDescription,
        OngoingTransaction,
        PartitionDescription,
        TopicDescription,
    )
    from txn_core.partition.reader import READ_COMMITTED, READ_UNCOMMITTED
    from txn_core.partition.records import METADATA_FIELDS

#: Public name -> the module that defines it.
_EXPORTS: dict[str, str] = {
    "AckStatus": "txn_core.clients.subscriptions",
    "AppCommitter": "txn_core.clients.apptxn",
    "AppVersion": "txn_core.clients.appunit",
    "AppScopeError": "txn_core.errors",
    "ClientState": "txn_core.format.states",
    "CommitFailedError": "txn_core.errors",
    "CommitResult": "txn_core.clients.apptxn",
    "CommitStateUnknownError": "txn_core.errors",
    "CompletionFailedError": "txn_core.errors",
    "ConsumerBusyError": "txn_core.clients.subscriptions",
    "DeadLetterPolicy": "txn_core.clients.subscriptions",
    "RedeliveryBackoff": "txn_core.clients.subscriptions",
    "ConcurrentTransactionsError": "txn_core.errors",
    "ConfigurationError": "txn_core.errors",
    "Consumer": "txn_core.clients.consumer",
    "CoordinatorState": "txn_core.format.states",
    "CorruptDataError": "txn_core.errors",
    "DamagedEntryDescription": "txn_core.ops.describe",
    "DamagedEntryError": "txn_core.errors",
    "DataLossError": "txn_core.errors",
    "GroupFencedError": "txn_core.errors",
    "GroupNotFoundError": "txn_core.errors",
    "GroupPosition": "txn_core.clients.apptxn",
    "HangingTransaction": "txn_core.ops.admin",
    "InvalidNameError": "txn_core.errors",
    "InvalidOffsetError": "txn_core.errors",
    "InvalidTxnStateError": "txn_core.errors",
    "Log": "txn_core.log",
    "METADATA_FIELDS": "txn_core.partition.records",
    "ObjectExistsError": "txn_core.errors",
    "ObjectNotFoundError": "txn_core.errors",
    "OffsetOutOfRangeError": "txn_core.errors",
    "OngoingTransaction": "txn_core.ops.describe",
    "OutOfOrderSequenceError": "txn_core.errors",
    "TransactionTooLargeError": "txn_core.errors",
    "PartitionDescription": "txn_core.ops.describe",
    "Producer": "txn_core.clients.producer",
    "ProducerClosedError": "txn_core.errors",
    "ProducerFencedError": "txn_core.errors",
    "READ_COMMITTED": "txn_core.partition.reader",
    "READ_UNCOMMITTED": "txn_core.partition.reader",
    "RecordMetadata": "txn_core.clients.producer",
    "RetryableStorageError": "txn_core.errors",
    "SchemaMismatchError": "txn_core.errors",
    "StorageContractError": "txn_core.errors",
    "StorageError": "txn_core.errors",
    "Subscription": "txn_core.clients.subscriptions",
    "SubscriptionConsumer": "txn_core.clients.subscriptions",
    "SubscriptionNotFoundError": "txn_core.clients.subscriptions",
    "SubscriptionState": "txn_core.clients.subscriptions",
    "SubscriptionType": "txn_core.clients.subscriptions",
    "TopicDescription": "txn_core.ops.describe",
    "TopicExistsError": "txn_core.errors",
    "TopicNotFoundError": "txn_core.errors",
    "TopicPartition": "txn_core.format.ids",
    "TransactionConflictError": "txn_core.errors",
    "TransactionDescription": "txn_core.ops.admin",
    "TransactionListing": "txn_core.ops.admin",
    "TransactionTimedOutError": "txn_core.errors",
    "TransactionalIdTakenOverError": "txn_core.errors",
    "TxnId": "txn_core.format.ids",
    "TxnLogError": "txn_core.errors",
    "UnknownOutcomeError": "txn_core.errors",
    "UnstableOffsetsError": "txn_core.errors",
    "abort_staged": "txn_core.clients.apptxn",
    "commit_staged": "txn_core.clients.apptxn",
    "open_log": "txn_core.log",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'txn_core' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups bypass this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


__version__ = "0.1.0"

__all__ = [
    "METADATA_FIELDS",
    "READ_COMMITTED",
    "READ_UNCOMMITTED",
    "AckStatus",
    "AppCommitter",
    "AppScopeError",
    "AppVersion",
    "ClientState",
    "CommitFailedError",
    "CommitResult",
    "CommitStateUnknownError",
    "CompletionFailedError",
    "ConcurrentTransactionsError",
    "ConfigurationError",
    "Consumer",
    "ConsumerBusyError",
    "CoordinatorState",
    "CorruptDataError",
    "DamagedEntryDescription",
    "DamagedEntryError",
    "DataLossError",
    "DeadLetterPolicy",
    "GroupFencedError",
    "GroupNotFoundError",
    "GroupPosition",
    "HangingTransaction",
    "InvalidNameError",
    "InvalidOffsetError",
    "InvalidTxnStateError",
    "Log",
    "ObjectExistsError",
    "ObjectNotFoundError",
    "OffsetOutOfRangeError",
    "OngoingTransaction",
    "OutOfOrderSequenceError",
    "PartitionDescription",
    "Producer",
    "ProducerClosedError",
    "ProducerFencedError",
    "RecordMetadata",
    "RedeliveryBackoff",
    "RetryableStorageError",
    "SchemaMismatchError",
    "StorageContractError",
    "StorageError",
    "Subscription",
    "SubscriptionConsumer",
    "SubscriptionNotFoundError",
    "SubscriptionState",
    "SubscriptionType",
    "TopicDescription",
    "TopicExistsError",
    "TopicNotFoundError",
    "TopicPartition",
    "TransactionConflictError",
    "TransactionDescription",
    "TransactionListing",
    "TransactionTimedOutError",
    "TransactionTooLargeError",
    "TransactionalIdTakenOverError",
    "TxnId",
    "TxnLogError",
    "UnknownOutcomeError",
    "UnstableOffsetsError",
    "abort_staged",
    "commit_staged",
    "open_log",
]

configure_from_env()  # TXNLOG_LOG_LEVEL: logging in every process that imports txnlog (txn_core.logs)
