"""The txnlog error family.

Every error raised on purpose by txnlog derives from :class:`TxnLogError`. Each message says what
happened, with the ids, offsets or objects involved, and what to do about it (PROTOCOL.md section
"Errors"). Errors are raised with ``raise ... from cause`` wherever a lower-level exception caused them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from txn_core.entry import EntryHeader


class TxnLogError(Exception):
    """Root of all txnlog errors."""


# --- configuration and input -------------------------------------------------------------------


class ConfigurationError(TxnLogError, ValueError):
    """A bad option, URL or argument. The message names the option and the accepted values."""


class InvalidNameError(ConfigurationError):
    """A topic, group or transactional id that is not a valid name."""


class TopicNotFoundError(TxnLogError, LookupError):
    """The topic does not exist. The message lists the topics that do."""


class TopicExistsError(TxnLogError):
    """A topic with that name already exists."""


class GroupNotFoundError(TxnLogError, LookupError):
    """The consumer group has never committed offsets."""


class SchemaMismatchError(TxnLogError, ValueError):
    """Data does not match the topic's Arrow schema. Raised before anything is written."""

    def __init__(self, message: str, differences: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.differences = differences


# --- storage -----------------------------------------------------------------------------------


class StorageError(TxnLogError, OSError):
    """A storage operation failed for a reason other than a lost race."""


class StoragePermissionError(StorageError, PermissionError):
    """The store refused a write for want of permission: a read-only mount (EROFS), read-only
    credentials (HTTP 403 / AccessDenied), a directory the process may not write (EACCES). Reading is
    unaffected: readers skip the writes they only make opportunistically (snapshots) on such a store."""


class ObjectExistsError(StorageError):
    """Create-if-absent lost the race: the object exists (HTTP 412 / EEXIST)."""


class ObjectNotFoundError(StorageError, FileNotFoundError):
    """The object does not exist."""


class RetryableStorageError(StorageError):
    """The store asked to retry (HTTP 409 ConditionalRequestConflict, throttling, 5xx)."""


class UnknownOutcomeError(StorageError):
    """A write may or may not have landed. Resolve by reading the object back (PROTOCOL.md "Writes")."""


class StorageContractError(StorageError):
    """The backend does not honour the storage contract (e.g. a second create of a key succeeded)."""


class CorruptDataError(TxnLogError):
    """An object is corrupt, truncated or not a txnlog object. Nothing after it is skipped silently.

    ``check`` names the check the object failed (``"header checksum mismatch"``), when one did."""

    def __init__(self, message: str, key: str | None = None, check: str | None = None) -> None:
        super().__init__(message)
        self.key = key
        self.check = check


class DamagedEntryError(CorruptDataError):
    """A partition entry fails its checks and is not marked lost (PROTOCOL.md "Damage").

    ``path`` and ``slot`` locate it; ``header`` is its header when only the payload is damaged (the
    entry's offsets are then known); ``first_offset`` is where its offsets begin, when the caller knows.
    Reads stop before it; an operator restores the object or marks its offsets lost."""

    def __init__(
        self,
        message: str,
        key: str,
        check: str,
        *,
        path: str,
        slot: int,
        header: EntryHeader | None = None,
        first_offset: int | None = None,
    ) -> None:
        super().__init__(message, key, check)
        self.path = path
        self.slot = slot
        self.header = header
        self.first_offset = first_offset


class DataLossError(TxnLogError):
    """Requested offsets were removed by retention (or are otherwise missing)."""


class OffsetOutOfRangeError(TxnLogError, IndexError):
    """An offset outside [log start, log end]."""


# --- producers and transactions ----------------------------------------------------------------


class ProducerFencedError(TxnLogError):
    """A newer producer with the same transactional id (a higher epoch) exists; this one is a zombie.

    Close this producer. Nothing it writes from now on can become visible.
    """


class TransactionTimedOutError(ProducerFencedError):
    """The transaction exceeded its timeout and was aborted by another participant."""


class InvalidTxnStateError(TxnLogError):
    """An operation that is not valid in the current transaction state (client or coordinator)."""


class OutOfOrderSequenceError(TxnLogError):
    """A gap in a producer's per-partition sequence numbers: a batch is missing."""


class UnstableOffsetsError(RetryableStorageError):
    """A consumer group's offsets are pending in an open transaction (Kafka's UNSTABLE_OFFSET_COMMIT)."""


class TransactionConflictError(TxnLogError):
    """Another open transaction holds a conflicting pending acknowledgement."""


class GroupFencedError(TxnLogError):
    """Another transaction already committed (or holds) a consumer group's input from the same start
    position (PROTOCOL.md "Offsets fence"); this transaction must abort and commits nothing."""

    def __init__(self, message: str, group: str = "") -> None:
        super().__init__(message)
        self.group = group


class ConcurrentTransactionsError(RetryableStorageError):
    """The previous transaction of this transactional id is still completing; retry shortly."""


class ProducerClosedError(TxnLogError):
    """The producer or consumer was closed."""


class InvalidOffsetError(TxnLogError, ValueError):
    """A negative or otherwise impossible offset was given."""
