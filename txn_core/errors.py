"""The txnlog error family.

Every error raised on purpose by txnlog derives from :class:`TxnLogError`. Each message says what
happened, with the ids, offsets or objects involved, and what to do about it (PROTOCOL.md section
"Errors"). Errors are raised with ``raise ... from cause`` wherever a lower-level exception caused them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from txn_core.format.entry import EntryHeader


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
    """A storage operation did not succeed. The subclass says what is known of a write's outcome:

    * :class:`ObjectExistsError`: a create-if-absent lost the race (the object exists; nothing was written);
    * :class:`RetryableStorageError`: the write **certainly did not land** (the store refused it: 409, 429,
      5xx ``SlowDown``); safe to retry or to give up;
    * :class:`UnknownOutcomeError`: the write **may or may not have landed**; resolve by reading back,
      never delete (PROTOCOL.md "Writes");
    * :class:`ObjectNotFoundError`, :class:`StoragePermissionError`: a read or write refused.

    A plain ``StorageError`` from a read, list or delete means that operation failed (the store was
    unreachable or answered with an error)."""


class StoragePermissionError(StorageError, PermissionError):
    """The store refused a request for want of permission. A write: a read-only mount (EROFS), read-only
    credentials (HTTP 403 / AccessDenied), a directory the process may not write (EACCES); reading is
    unaffected, as readers skip the writes they only make opportunistically (snapshots) on such a store. A
    read: an object the process may not read (EACCES, HTTP 403), named in the message."""


class ObjectExistsError(StorageError):
    """Create-if-absent lost the race: the object exists (HTTP 412 / EEXIST). Nothing was written."""


class ObjectNotFoundError(StorageError, FileNotFoundError):
    """The object does not exist."""


class RetryableStorageError(StorageError):
    """The store refused the request and asked to retry (HTTP 409 ConditionalRequestConflict, throttling,
    5xx): a write that raises this **did not land**."""


class UnknownOutcomeError(StorageError):
    """A write may or may not have landed. Resolve by reading the object back (PROTOCOL.md "Writes")."""


class CommitFailedError(StorageError):
    """A commit that certainly did not happen: a write before the decision failed, or the store refused the
    decision (pyiceberg's CommitFailedException). Call ``commit_transaction()`` again (it resumes where it
    stopped) or abort the transaction."""

    def __init__(self, message: str, *, transactional_id: str | None = None) -> None:
        super().__init__(message)
        self.transactional_id = transactional_id


class CompletionFailedError(StorageError):
    """Completing an earlier transaction of the producer, already decided, failed: writing its markers or its
    Complete record (the cause is chained). The producer's request that needed it first was **not made**.
    The earlier transaction keeps its decision; the producer's next call, ``close()`` or, after the
    transaction timeout, anyone completes it."""

    def __init__(self, message: str, *, txn: object) -> None:
        super().__init__(message)
        self.txn = txn


class CommitStateUnknownError(UnknownOutcomeError):
    """The decision on a transaction may or may not be durable (pyiceberg's CommitStateUnknownException).
    Call ``commit_transaction()`` again to learn it: it is idempotent. Never treat the transaction as
    aborted, and never redo its work elsewhere, until then."""

    def __init__(self, message: str, *, transactional_id: str | None = None) -> None:
        super().__init__(message)
        self.transactional_id = transactional_id


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

    Close this producer. Nothing it writes from now on can become visible. ``transactional_id``,
    ``producer_id`` and ``epoch`` name the fenced producer; ``current_producer_id`` and ``current_epoch``
    the coordinator's (when known).
    """

    def __init__(
        self,
        message: str,
        *,
        transactional_id: str | None = None,
        producer_id: int | None = None,
        epoch: int | None = None,
        current_producer_id: int | None = None,
        current_epoch: int | None = None,
    ) -> None:
        super().__init__(message)
        self.transactional_id = transactional_id
        self.producer_id = producer_id
        self.epoch = epoch
        self.current_producer_id = current_producer_id
        self.current_epoch = current_epoch

    def reworded(self, message: str) -> ProducerFencedError:
        """The same fencing told in a caller's terms (a command's, say): its class and attributes, ``message``."""
        other = type(self).__new__(type(self), message)
        other.__dict__.update(self.__dict__)
        return other


class TransactionalIdTakenOverError(ProducerFencedError):
    """An application run may not commit under its transactional id: another run committed there since
    this run's last commit (PROTOCOL.md "Application transactions"). ``other_run`` and ``other_version``
    name that commit; nothing of this unit was committed."""

    def __init__(self, message: str, *, transactional_id: str, other_run: str, other_version: int) -> None:
        super().__init__(message, transactional_id=transactional_id)
        self.other_run = other_run
        self.other_version = other_version


class AppScopeError(ConfigurationError):
    """A unit of an application transaction cannot be honoured: its transactional id's last commit is the same
    run's version ``version`` (or a later one) to ``other_topic``, and this unit writes ``topic``
    (PROTOCOL.md "Application transactions", scope). Versions are counted per topic; one transactional id
    named for two topics cannot tell whether this unit was committed. Nothing of the unit was committed."""

    def __init__(self, message: str, *, transactional_id: str, topic: str, other_topic: str, version: int) -> None:
        super().__init__(message)
        self.transactional_id = transactional_id
        self.topic = topic
        self.other_topic = other_topic
        self.version = version


class TransactionTimedOutError(ProducerFencedError):
    """The transaction exceeded its timeout and was aborted: by another participant that met it, or by its own
    producer's commit, which records the abort instead of the commit it asked for."""


class InvalidTxnStateError(TxnLogError):
    """An operation that is not valid in the current transaction state (client or coordinator).
    ``transactional_id``, ``current`` and ``target`` (state names) say which, when known."""

    def __init__(
        self,
        message: str,
        *,
        transactional_id: str | None = None,
        current: str | None = None,
        target: str | None = None,
    ) -> None:
        super().__init__(message)
        self.transactional_id = transactional_id
        self.current = current
        self.target = target


class TransactionTooLargeError(TxnLogError):
    """A transaction would write more records to one partition than one epoch's sequence numbers count
    (2**31 - 1). Nothing of the write was sent; abort the transaction and commit in smaller ones."""


class OutOfOrderSequenceError(TxnLogError):
    """A gap in a producer's per-partition sequence numbers: a batch is missing. The attributes give the
    producer, its epoch, the expected and received sequence and the offset of the entry after the gap."""

    def __init__(
        self,
        message: str,
        *,
        producer_id: int | None = None,
        epoch: int | None = None,
        expected: int | None = None,
        received: int | None = None,
        offset: int | None = None,
    ) -> None:
        super().__init__(message)
        self.producer_id = producer_id
        self.epoch = epoch
        self.expected = expected
        self.received = received
        self.offset = offset


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


class ConcurrentTransactionsError(TxnLogError):
    """Other participants kept changing a transactional id's state faster than this operation could act on
    it (e.g. ``init_transactions`` racing a stream of new transactions); nothing was changed by this call,
    and it may be retried."""


class ProducerClosedError(TxnLogError):
    """The producer or consumer was closed."""


class InvalidOffsetError(TxnLogError, ValueError):
    """A negative or otherwise impossible offset was given."""
