"""Dead letters: a record delivered too often goes to the dead-letter topic and is acknowledged in one
transaction (PROTOCOL.md "Subscriptions", "Redelivery and dead letters").

The consumer's dead-letter producer (transactional id ``<consumer id>-dlq``) begins a transaction, sends
the records (the source topic's columns, to the same partition index of the dead-letter topic), appends
their acknowledgement to the ack log inside that transaction, commits, and waits for the markers (so the
acknowledgement has applied when the receive that moved them returns). Invariant: a dead letter is
visible exactly when its acknowledgement is applied, so a record is never both dead-lettered and delivered
again, nor lost:

* the acknowledgement conflicts (another consumer acknowledged or holds a record first): the transaction
  cannot commit and is aborted; the dead letter is never visible and the other party's outcome stands;
* the process dies before the commit is decided: the transaction is aborted by its timeout (the
  transactional id belongs to that consumer instance alone, so nothing else aborts it sooner), and the
  record is delivered again;
* it dies after the commit is decided: the transaction is completed by any replica after the grace, and
  both the dead letter and the acknowledgement apply.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import pyarrow as pa

from txn_core.clients.subscriptions.redelivery import DeadLetterPolicy
from txn_core.clients.subscriptions.store import SubscriptionRef
from txn_core.clients.topics import TopicConfig
from txn_core.errors import ConfigurationError, TopicExistsError, TransactionConflictError, TxnLogError
from txn_core.logs import get_logger
from txn_core.partition.records import METADATA_FIELDS

if TYPE_CHECKING:
    from collections.abc import Callable

    from txn_core.clients.context import SupportsContext
    from txn_core.clients.producer import Producer


logger = get_logger(__name__)


class DeadLetters:
    """The dead-letter side of one consumer (lazy: no topic, producer or transaction until the first)."""

    def __init__(self, log: SupportsContext, ref: SubscriptionRef, owner: str, policy: DeadLetterPolicy) -> None:
        self.ctx = log.context
        self.ref = ref
        self.policy = policy
        self.topic = policy.topic_for(ref)
        self.transactional_id = f"{owner}-dlq"
        self._producer: Producer | None = None
        self._partitions = 0
        self.written = 0  # records this consumer dead-lettered (committed)

    def _ensure(self) -> Producer:
        if self._producer is not None:
            return self._producer
        source = self.ctx.topics.get(self.ref.topic)
        with contextlib.suppress(TopicExistsError):
            self.ctx.topics.create(self.topic, source.partitions, source.schema, TopicConfig(None, None).check())
        target = self.ctx.topics.get(self.topic)
        if not target.schema.equals(source.schema):
            raise ConfigurationError(
                f"dead-letter topic {self.topic!r} of {self.ref} has schema {_fields(target.schema)} but the records "
                f"come from {self.ref.topic!r} with schema {_fields(source.schema)}; use a dead-letter topic of the "
                "same schema "
                "(DeadLetterPolicy(dead_letter_topic=...))"
            )
        self._partitions = target.partitions
        from txn_core.clients.producer import Producer

        producer = Producer(self.ctx, self.transactional_id, transaction_timeout_ms=self.policy.transaction_timeout_ms)
        producer.init_transactions()
        self._producer = producer
        return producer

    def move(self, records: pa.Table, acknowledge: Callable[[pa.Table, Producer], None]) -> bool:
        """Write ``records`` (delivered to this consumer) to the dead-letter topic and acknowledge them with
        ``acknowledge(records, producer)`` in one transaction. True if it committed; False if the
        acknowledgement lost to another party's (aborted: nothing written, nothing acknowledged)."""
        producer = self._ensure()
        producer.begin_transaction()
        try:
            data = records.drop_columns([f.name for f in METADATA_FIELDS])
            producer.send(self.topic, data, partition=self.ref.partition % self._partitions)
            acknowledge(records, producer)
            producer.commit_transaction()
        except TransactionConflictError:
            producer.abort_transaction()
            return False
        except TxnLogError:
            with contextlib.suppress(TxnLogError):
                producer.abort_transaction()
            raise
        self.written += records.num_rows
        try:  # the markers, so the acknowledgement applies before the receive that moved them returns
            producer.wait_for_completion()
        except TxnLogError as exc:  # decided all the same: the next call or any replica completes it
            logger.warning("%s: dead letters committed, markers not yet written: %s", self.ref, exc)
        return True

    def close(self) -> None:
        if self._producer is not None:
            self._producer.close()


def _fields(schema: pa.Schema) -> str:
    return ", ".join(f"{f.name}: {f.type}" for f in schema)
