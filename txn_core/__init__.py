"""txnlog core: a transactional log on any fsspec filesystem, with no broker (see PROTOCOL.md).

Start with :func:`open_log`::

    log = txn_core.open_log("file:///tmp/mylog")
    log.create_topic("orders", partitions=4, schema=pa.schema([("id", pa.int64())]))
    p = log.producer(transactional_id="copier-1")
    p.init_transactions(); p.begin_transaction(); p.send("orders", table); p.commit_transaction()
"""

from txn_core.admin import HangingTransaction, TransactionDescription, TransactionListing
from txn_core.apptxn import AppCommitter, AppVersion, CommitResult, GroupPosition, abort_staged, commit_staged
from txn_core.consumer import Consumer
from txn_core.coordinator.states import ClientState, CoordinatorState
from txn_core.errors import (
    CommitFailedError,
    CommitStateUnknownError,
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
    TransactionConflictError,
    TransactionTimedOutError,
    TxnLogError,
    UnknownOutcomeError,
    UnstableOffsetsError,
)
from txn_core.ids import TopicPartition, TxnId
from txn_core.log import (
    DamagedEntryDescription,
    Log,
    OngoingTransaction,
    PartitionDescription,
    TopicDescription,
    open_log,
)
from txn_core.logs import configure_from_env
from txn_core.producer import Producer, RecordMetadata
from txn_core.reader import READ_COMMITTED, READ_UNCOMMITTED
from txn_core.records import METADATA_FIELDS
from txn_core.subscriptions import (
    AckStatus,
    Subscription,
    SubscriptionConsumer,
    SubscriptionNotFoundError,
    SubscriptionState,
)

__version__ = "0.1.0"

__all__ = [
    "METADATA_FIELDS",
    "READ_COMMITTED",
    "READ_UNCOMMITTED",
    "AckStatus",
    "AppCommitter",
    "AppVersion",
    "ClientState",
    "CommitFailedError",
    "CommitResult",
    "CommitStateUnknownError",
    "ConcurrentTransactionsError",
    "ConfigurationError",
    "Consumer",
    "CoordinatorState",
    "CorruptDataError",
    "DamagedEntryDescription",
    "DamagedEntryError",
    "DataLossError",
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
    "RetryableStorageError",
    "SchemaMismatchError",
    "StorageContractError",
    "StorageError",
    "Subscription",
    "SubscriptionConsumer",
    "SubscriptionNotFoundError",
    "SubscriptionState",
    "TopicDescription",
    "TopicExistsError",
    "TopicNotFoundError",
    "TopicPartition",
    "TransactionConflictError",
    "TransactionDescription",
    "TransactionListing",
    "TransactionTimedOutError",
    "TxnId",
    "TxnLogError",
    "UnknownOutcomeError",
    "UnstableOffsetsError",
    "abort_staged",
    "commit_staged",
    "open_log",
]

configure_from_env()  # TXNLOG_LOG_LEVEL: logging in every process that imports txnlog (txn_core.logs)
