"""The subscription consumer: shared consumption with individual, cumulative, negative and
transactional acknowledgements (PROTOCOL.md "Subscriptions").

::

    c = log.subscribe("orders", 0, "billing", ack_timeout_ms=30_000)
    p = log.producer(transactional_id="billing-worker-1"); p.init_transactions()
    while True:
        batch = c.receive(max_records=100, timeout_s=1.0)
        if not batch.num_rows:
            continue
        p.begin_transaction()
        try:
            p.send("invoices", process(batch))
            c.acknowledge(batch, transaction=p)     # pending until the transaction ends
            p.commit_transaction()                  # the acks apply when the commit marker lands
        except txn_core.TransactionConflictError:   # another transaction acknowledged one of them first
            p.abort_transaction()
            c.redeliver_unacknowledged()

Any number of consumers, in any processes, may consume one Shared subscription (the default type); each
record is delivered to one of them at a time (range leases, see :mod:`.dispatcher`). An Exclusive one
(``subscription_type="exclusive"``) takes one consumer at a time: a second is refused with
:class:`ConsumerBusyError` naming the first, until the first closes or stops calling ``receive`` for its
``session_timeout_ms`` (its hold, see :mod:`.hold`, lapses). A Failover one (``subscription_type="failover"``)
takes any number of consumers, of which one is active: the ``partition % n``-th of their ids sorted (so
by consumer name); when it closes or its session lapses the next one takes over from the acknowledged
position (see :mod:`.seats`). A Key_Shared one (``subscription_type="key_shared"``, ``key_column=...``) takes
any number of consumers and gives the records of one key to one of them at a time, in order: the keys are
split evenly over the consumers, or each names its ``key_ranges`` of hashes (sticky); a consumer that joins
gets a key once the previous holder's deliveries of it are settled (see :mod:`.keydispatch`).

A record is delivered again when it is not acknowledged within the ack timeout, when it is negatively
acknowledged (after ``nack_delay_ms``, or a growing delay with ``nack_backoff``), or when the transaction
holding its acknowledgement aborts; with a ``dead_letter_policy`` a record delivered too often goes to the
dead-letter topic instead, in the transaction that acknowledges it (see :mod:`.redelivery`,
:mod:`.deadletter`). A transactional acknowledgement is appended to the ack log inside the producer's
current transaction; the consumer replays the log up to it and raises :class:`TransactionConflictError`
(and makes the transaction abortable) if an earlier record in the log already acknowledged or holds one
of its records.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterable
from typing import TYPE_CHECKING

import pyarrow as pa

from txn_core.clients.subscriptions import trim as trimming
from txn_core.clients.subscriptions.acklog import AckLog
from txn_core.clients.subscriptions.deadletter import DeadLetters
from txn_core.clients.subscriptions.dispatcher import Dispatcher
from txn_core.clients.subscriptions.keydispatch import KeyDispatcher
from txn_core.clients.subscriptions.keys import parse_ranges
from txn_core.clients.subscriptions.members import Membership
from txn_core.clients.subscriptions.records import AckOp, AckRecord, entry_acks
from txn_core.clients.subscriptions.redelivery import DeadLetterPolicy, RedeliveryBackoff
from txn_core.clients.subscriptions.seats import KeySharedSeat, Seat, seat_for
from txn_core.clients.subscriptions.state import AckStatus, SubscriptionState
from txn_core.clients.subscriptions.store import (
    DEFAULT_RANGE_SIZE,
    SubscriptionMeta,
    SubscriptionRef,
    SubscriptionType,
    create_meta,
    read_meta,
    validate_ref,
)
from txn_core.errors import ConfigurationError, DataLossError, InvalidOffsetError, ProducerClosedError, TxnLogError
from txn_core.format import paths
from txn_core.format.arrays import empty_table
from txn_core.format.ids import TxnId, is_int, validate_name
from txn_core.partition.ages import SAFE_ENTRY_AGE_MS, check_min_age_of
from txn_core.partition.partition import AppendResult
from txn_core.partition.ranges import available_end
from txn_core.partition.reader import READ_COMMITTED

if TYPE_CHECKING:
    from txn_core.clients.context import SupportsContext
    from txn_core.clients.producer import Producer

INITIAL_POSITIONS = ("earliest", "latest")
#: How often a consumer considers trimming (log clock).
TRIM_EVERY_MS = 30_000


def open_meta(
    log: SupportsContext,
    topic: str,
    partition: int,
    name: str,
    *,
    create: bool,
    initial_position: str,
    range_size: int | None,
    subscription_type: SubscriptionType = SubscriptionType.SHARED,
    key_column: str | None = None,
    key_mode: str | None = None,
) -> SubscriptionMeta:
    """The subscription's metadata, creating it if asked (checks the topic partition exists and that the
    stored type, and a Key_Shared one's key column and mode, are the ones asked for)."""
    ctx = log.context
    ref = validate_ref(topic, partition, name)
    meta = ctx.topics.get(topic)
    if not 0 <= partition < meta.partitions:
        raise ConfigurationError(f"topic {topic!r} has no partition {partition} (partitions 0..{meta.partitions - 1})")
    if initial_position not in INITIAL_POSITIONS:
        raise ConfigurationError(f"initial_position must be one of {INITIAL_POSITIONS}, got {initial_position!r}")
    if range_size is not None and (not isinstance(range_size, int) or not 1 <= range_size <= 1 << 20):
        raise ConfigurationError(f"range_size must be an int in [1, {1 << 20}], got {range_size!r}")
    if subscription_type is SubscriptionType.KEY_SHARED:
        columns = meta.schema.names
        if key_column is None:
            raise ConfigurationError(
                f"a key_shared subscription needs key_column, the column whose value is the key (one of {columns})"
            )
        if key_column not in columns:
            raise ConfigurationError(
                f"key_column {key_column!r} is not a column of topic {topic!r}: columns are {columns}"
            )
    elif key_column is not None:  # key_ranges on another type are refused before (SubscriptionConsumer)
        raise ConfigurationError(
            f"key_column and key_ranges are for subscription_type='key_shared', not {subscription_type.value!r}"
        )
    if not create:
        stored = read_meta(ctx.storage, ref)
    else:
        path = paths.partition_log_path(topic, partition)
        if initial_position == "earliest":
            initial = ctx.partition_log(path).log_start(refresh=True).offset
        else:  # the last stable offset: a transaction open at the log end is delivered once it commits
            initial = available_end(ctx.partition_state(path, shared=False), READ_COMMITTED)  # its own: not thread-safe
        stored = create_meta(
            ctx.storage,
            SubscriptionMeta(
                ref,
                initial,
                range_size or DEFAULT_RANGE_SIZE,
                ctx.clock(),
                subscription_type,
                key_column,  # None for other types (refused above otherwise)
                key_mode,  # None for other types (the consumer passes none)
            ),
        )
    if stored.type is not subscription_type:
        raise ConfigurationError(
            f"{ref} was created as {stored.type.value}; it cannot be opened as {subscription_type.value}. "
            f"Subscribe with subscription_type={stored.type.value!r}, or use another subscription name"
        )
    if stored.type is SubscriptionType.KEY_SHARED and stored.key_column != key_column:
        raise ConfigurationError(
            f"{ref} keys records by column {stored.key_column!r}; it cannot be opened with key_column={key_column!r}. "
            "Subscribe with the same key_column, or use another subscription name"
        )
    if stored.type is SubscriptionType.KEY_SHARED and stored.key_mode != key_mode:
        how = {"sticky": "with key_ranges", "auto_split": "without key_ranges"}
        raise ConfigurationError(
            f"{ref} was created {stored.key_mode}: its consumers subscribe {how[stored.key_mode or 'auto_split']} "
            f"(this one subscribed {how[key_mode or 'auto_split']}; Pulsar refuses mixing them too). Use another "
            "subscription name for the other mode"
        )
    if range_size is not None and stored.range_size != range_size:
        raise ConfigurationError(
            f"{ref} was created with range_size {stored.range_size}; it cannot be opened with {range_size}"
        )
    return stored


class SubscriptionConsumer:
    """One consumer of a subscription (see module doc). Thread-safe; one receive at a time."""

    def __init__(
        self,
        log: SupportsContext,
        topic: str,
        partition: int,
        subscription: str,
        *,
        consumer_name: str | None = None,
        ack_timeout_ms: int = 30_000,
        nack_delay_ms: int = 1_000,
        create: bool = True,
        initial_position: str = "earliest",
        range_size: int | None = None,
        max_unacked: int = 1000,
        trim_min_age_ms: int = trimming.MIN_ENTRY_AGE_MS,
        subscription_type: str | SubscriptionType = SubscriptionType.SHARED,
        session_timeout_ms: int = 30_000,
        nack_backoff: RedeliveryBackoff | None = None,
        dead_letter_policy: DeadLetterPolicy | None = None,
        key_column: str | None = None,
        key_ranges: Iterable[tuple[int, int]] | None = None,
    ) -> None:
        ctx = log.context
        kind = SubscriptionType.parse(subscription_type)
        if kind is not SubscriptionType.KEY_SHARED and key_ranges is not None:  # before anything is created
            raise ConfigurationError(f"key_ranges are for subscription_type='key_shared', not {kind.value!r}")
        ranges = None if key_ranges is None else parse_ranges(key_ranges)
        if consumer_name is not None:
            validate_name("consumer", consumer_name)
        for what, value, low in (
            ("ack_timeout_ms", ack_timeout_ms, 1),
            ("nack_delay_ms", nack_delay_ms, 0),
            ("max_unacked", max_unacked, 1),
            ("trim_min_age_ms", trim_min_age_ms, 0),
            ("session_timeout_ms", session_timeout_ms, 2),
        ):
            if not is_int(value) or value < low:
                raise ConfigurationError(f"{what} must be an int >= {low}, got {value!r}")
        if nack_backoff is not None and not isinstance(nack_backoff, RedeliveryBackoff):
            raise ConfigurationError(
                f"nack_backoff must be a RedeliveryBackoff(min_delay_ms, max_delay_ms) or None, got {nack_backoff!r}"
            )
        if dead_letter_policy is not None and not isinstance(dead_letter_policy, DeadLetterPolicy):
            raise ConfigurationError(
                f"dead_letter_policy must be a DeadLetterPolicy(max_redeliveries) or None, got {dead_letter_policy!r}"
            )
        check_min_age_of("trim_min_age_ms: trimming the ack log", trim_min_age_ms, SAFE_ENTRY_AGE_MS, flag=None)
        self.ctx = ctx
        self.meta = open_meta(
            ctx,
            topic,
            partition,
            subscription,
            create=create,
            initial_position=initial_position,
            range_size=range_size,
            subscription_type=kind,
            key_column=key_column,
            key_mode=None if kind is not SubscriptionType.KEY_SHARED else "auto_split" if ranges is None else "sticky",
        )
        self.ref: SubscriptionRef = self.meta.ref
        self.consumer_id = f"{consumer_name or 'consumer'}-{uuid.uuid4().hex[:12]}"
        self.trim_min_age_ms = trim_min_age_ms
        self.acklog = AckLog(ctx, self.meta)
        self._dispatch: Dispatcher
        self._seat: Seat
        if kind is SubscriptionType.KEY_SHARED:
            extra = {} if ranges is None else {"key_ranges": [list(r) for r in ranges]}
            seat = KeySharedSeat(Membership(ctx.storage, self.ref, self.consumer_id, session_timeout_ms, extra), ranges)
            self._dispatch = KeyDispatcher(
                ctx,
                self.meta,
                self.acklog,
                self.consumer_id,
                wanted=seat.wanted,
                ack_timeout_ms=ack_timeout_ms,
                nack_delay_ms=nack_delay_ms,
                max_unacked=max_unacked,
                backoff=nack_backoff,
            )
            self._seat = seat
        else:
            self._dispatch = Dispatcher(
                ctx,
                self.meta,
                self.acklog,
                self.consumer_id,
                ack_timeout_ms=ack_timeout_ms,
                nack_delay_ms=nack_delay_ms,
                max_unacked=max_unacked,
                max_ranges=8,
                backoff=nack_backoff,
            )
            self._seat = seat_for(self.meta, self.consumer_id, session_timeout_ms, self._dispatch)
        self._deferred: TxnLogError | None = None  # a dead-letter move that failed beside records handed out
        self._dead = (
            None if dead_letter_policy is None else DeadLetters(ctx, self.ref, self.consumer_id, dead_letter_policy)
        )
        self._last_trim = ctx.clock()
        self._closed = False
        self._lock = threading.RLock()
        self._seat.join(self._last_trim)  # Exclusive: ConsumerBusyError if someone else holds it

    def __repr__(self) -> str:
        return f"SubscriptionConsumer({self.ref}, id={self.consumer_id!r})"

    @property
    def ack_log_path(self) -> str:
        """The log path of the subscription's ack log (a transaction participant)."""
        return self.ref.ack_log_path

    def _check_open(self) -> None:
        if self._closed:
            raise ProducerClosedError(f"consumer {self.consumer_id!r} of {self.ref} is closed")

    # --- receiving ------------------------------------------------------------------------------

    def receive(self, max_records: int = 100, *, timeout_s: float = 0.0) -> pa.Table:
        """Up to ``max_records`` records for this consumer (topic columns plus ``_topic``, ``_partition``,
        ``_offset``, ``_timestamp``), waiting up to ``timeout_s`` for some; an empty table if none."""
        if not isinstance(max_records, int) or max_records <= 0:
            raise ConfigurationError(f"max_records must be a positive int, got {max_records!r}")
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                self._check_open()
                if self._deferred is not None:  # met by the previous call, after the records it returned
                    error, self._deferred = self._deferred, None
                    raise error
                now = self.ctx.clock()
                try:
                    table = (
                        self._dispatch.receive(max_records, now)
                        if self._seat.may_deliver(now)
                        else empty_table(self._dispatch.schema)
                    )
                except DataLossError as exc:
                    raise DataLossError(
                        f"{self.ref}: {exc}. Retention removed records this subscription had not acknowledged; "
                        "they cannot be delivered. Call skip_lost() to give them up and go on from the log "
                        "start (recorded in the ack log: every consumer of the subscription goes on from there)"
                    ) from exc
                if table.num_rows and self._dead is not None:
                    table = self._divert(table, self._dead)
                skips = self._dispatch.take_skips() if not table.num_rows else ()
                if skips:
                    self.acklog.append(AckRecord(AckOp.SKIP, skips=skips, consumer=self.consumer_id))
                self._maintain(now)
            if table.num_rows or time.monotonic() >= deadline:
                return table
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))

    def _divert(self, table: pa.Table, dead_letters: DeadLetters) -> pa.Table:
        """Move the records delivered more than ``1 + max_redeliveries`` times to the dead-letter topic (one
        transaction that writes them and acknowledges them); the rest is the application's."""
        limit = dead_letters.policy.max_redeliveries
        counts = self._dispatch.counts
        over = [counts.redeliveries(o) > limit for o in table.column("_offset").to_pylist()]
        if not any(over):
            return table
        dead = table.filter(pa.array(over))
        rest = table.filter(pa.array([not x for x in over]))
        try:
            moved = dead_letters.move(dead, lambda records, producer: self.acknowledge(records, transaction=producer))
        except TxnLogError as exc:
            # Not moved: they go back to be delivered (and moved) again, never left in flight unseen. The
            # records taken beside them are the application's: handed out now, the error at the next call.
            self._dispatch.redeliver(dead.column("_offset").to_pylist())
            if not rest.num_rows:
                raise
            self._deferred = exc
            return rest
        if not moved:
            self._dispatch.redeliver(dead.column("_offset").to_pylist())  # lost to another acknowledgement
        return rest

    def _maintain(self, now: int) -> None:
        if self.acklog.snapshot_due(now):
            self.acklog.write_snapshot(now)
        if now - self._last_trim >= TRIM_EVERY_MS:
            self._last_trim = now
            trimming.trim(
                self.ctx,
                self.acklog,
                self._dispatch.leases,
                min_age_ms=self.trim_min_age_ms,
                now_ms=now,
                holds=self._seat.holds,
            )

    def unacknowledged(self) -> list[int]:
        """Offsets delivered to this consumer and not yet acknowledged or negatively acknowledged."""
        with self._lock:
            return sorted(self._dispatch.inflight)

    # --- acknowledging --------------------------------------------------------------------------

    def acknowledge(self, offsets: int | Iterable[int] | pa.Table, *, transaction: Producer | None = None) -> None:
        """Acknowledge records delivered to this consumer (individually; several of one entry become a
        batch-index acknowledgement with a bitset).

        With ``transaction`` (a transactional producer inside a transaction), the acknowledgement is
        pending until that transaction ends: applied if it commits, discarded (the records deliverable
        again) if it aborts. Raises :class:`TransactionConflictError` if another party's acknowledgement
        of one of these records comes first in the ack log (the transaction then cannot commit),
        :class:`InvalidOffsetError` for records this consumer does not hold.
        """
        offs = _offsets(offsets)
        with self._lock:
            self._check_open()
            if not offs:
                return
            offs = self._dispatch.check_delivered(offs)
            acks = entry_acks(offs, self._dispatch.bounds)
            record = AckRecord(AckOp.ACK, acks, 0, self._dispatch.take_skips(), self.consumer_id)
            try:
                self._submit(record, offs, transaction)
            except Exception:
                state = self.acklog.state  # records someone else holds or finished are no longer ours
                self._dispatch.settled([o for o in offs if state.status(o) is not AckStatus.UNACKED], pending=False)
                raise
            self._dispatch.settled(offs, pending=transaction is not None)

    def acknowledge_cumulative(self, offset: int, *, transaction: Producer | None = None) -> None:
        """Acknowledge every record of the partition at or below ``offset`` (delivered to this consumer).

        In a subscription shared by several consumers this also acknowledges records delivered to the
        others; Pulsar refuses cumulative acknowledgement on shared subscriptions for that reason — use it
        when one consumer reads the subscription. In a transaction it is pending like an individual one,
        and conflicts with any other transaction holding an unacknowledged record below ``offset``.
        """
        (off,) = _offsets(offset)
        with self._lock:
            self._check_open()
            self._dispatch.check_delivered([off])
            record = AckRecord(AckOp.CUMULATIVE, (), off + 1, self._dispatch.take_skips(), self.consumer_id)
            self._submit(record, [off], transaction)
            self._dispatch.settled(
                [o for o in list(self._dispatch.inflight) if o <= off], pending=transaction is not None
            )

    def _submit(self, record: AckRecord, offsets: list[int], transaction: Producer | None) -> None:
        if transaction is None:
            result = self.acklog.append(record)
            AckLog.raise_if_void(self.acklog.verdict(result.slot), self.ref, offsets)
            return

        def check(txn: TxnId | None, result: AppendResult) -> None:
            AckLog.raise_if_void(self.acklog.verdict(result.slot), self.ref, offsets)

        transaction.append_to_transaction(self.ref.ack_log_path, record.encode(), check=check)

    def negative_acknowledge(self, offsets: int | Iterable[int] | pa.Table) -> None:
        """Ask for these records again: they are redelivered after the consumer's ``nack_delay_ms``."""
        offs = _offsets(offsets)
        with self._lock:
            self._check_open()
            self._dispatch.nack(self._dispatch.check_delivered(offs, "negatively acknowledge"), self.ctx.clock())

    def redeliver_unacknowledged(self) -> None:
        """Deliver every record in flight again on the next receive (e.g. after aborting a transaction)."""
        with self._lock:
            self._dispatch.redeliver_all(self.ctx.clock())

    def skip_lost(self) -> int:
        """Give up the records retention removed before they were acknowledged: the subscription goes on
        from the topic partition's log start (Pulsar's cursor reset, Kafka's ``auto.offset.reset``), for every
        consumer of it. Returns how far its mark-delete position moved (0 when nothing was lost; offsets
        acknowledged above the old position and markers count too).

        One non-transactional ``lost`` record in the ack log: the mark-delete position moves to the log
        start, whatever acknowledgements or transactions held below it (a transaction holding some still
        commits or aborts; what it held there no longer matters)."""
        with self._lock:
            self._check_open()
            return self.acklog.give_up_lost(self.consumer_id)

    # --- state ----------------------------------------------------------------------------------

    def state(self) -> SubscriptionState:
        """The replayed subscription state, caught up (shared with this consumer: do not modify)."""
        with self._lock:
            return self.acklog.refresh(resolve=True)

    def close(self) -> None:
        """Release this consumer's leases so others redeliver its unacknowledged records at once."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            now = self.ctx.clock()
            skips = self._dispatch.take_skips()
            if skips:
                self.acklog.append(AckRecord(AckOp.SKIP, skips=skips, consumer=self.consumer_id))
            self._dispatch.release_all(now)
            self._seat.leave(now)
            if self._dead is not None:
                self._dead.close()

    def __enter__(self) -> SubscriptionConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _offsets(value: int | Iterable[int] | pa.Table) -> list[int]:
    if isinstance(value, pa.Table):
        if "_offset" not in value.column_names:
            raise ConfigurationError("acknowledge a table returned by receive() (it needs the _offset column)")
        return [int(o) for o in value.column("_offset").to_pylist()]
    items = [value] if isinstance(value, int) else list(value)
    for o in items:
        if not is_int(o) or o < 0:
            raise InvalidOffsetError(f"offsets must be non-negative ints, got {o!r}")
    return items
