"""Shared dispatch without a broker: which records this consumer delivers now (PROTOCOL.md
"Subscriptions", "Dispatch").

A consumer reads the topic partition with an ordinary read_committed :class:`PartitionReader` and
delivers a record only if

* it holds the current lease of the record's offset range (:mod:`.leases`) and that lease has at least
  half the ack timeout left (renewed first when nothing of the range is in flight),
* the replayed subscription state says the record is neither acknowledged nor held by an open
  transaction's pending acknowledgement, and
* it has not already delivered it under this lease (unless it was negatively acknowledged and the
  redelivery delay passed).

Ranges are examined from the mark-delete position upward; a range is claimed only after a look at the
topic shows something deliverable in it, so idle consumers create no objects. Records held by a pending
acknowledgement are remembered (``revisit``): when its transaction aborts they are delivered again by the
range's holder. Offsets the reader never delivers (markers, aborted data) are reported as ``skips`` in the
next ack record, so the mark-delete position can pass them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
from sortedcontainers import SortedDict

from txn_core.clients.subscriptions.acklog import AckLog
from txn_core.clients.subscriptions.leases import Lease, LeaseStore
from txn_core.clients.subscriptions.records import ranges_of
from txn_core.clients.subscriptions.redelivery import DeliveryCounts, RedeliveryBackoff
from txn_core.clients.subscriptions.state import AckStatus
from txn_core.clients.subscriptions.store import SubscriptionMeta
from txn_core.errors import InvalidOffsetError, OffsetOutOfRangeError
from txn_core.format import paths
from txn_core.format.arrays import empty_table, to_numpy
from txn_core.logs import get_logger
from txn_core.partition.reader import READ_COMMITTED, PartitionReader
from txn_core.partition.records import with_metadata_schema
from txn_core.storage.parallel import parallel_map

if TYPE_CHECKING:
    from txn_core.clients.context import SupportsContext

#: Skip ranges remembered for the next ack record (older ones are rediscovered if dropped).
MAX_SKIPS = 1024

logger = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Delivery:
    """A record handed to the application and not yet acknowledged or negatively acknowledged."""

    range: int
    gen: int
    delivered_ms: int


class Dispatcher:
    """The dispatch state of one consumer (see module doc). Not thread-safe: the consumer locks."""

    def __init__(
        self,
        log: SupportsContext,
        meta: SubscriptionMeta,
        acklog: AckLog,
        owner: str,
        *,
        ack_timeout_ms: int,
        nack_delay_ms: int,
        max_unacked: int,
        max_ranges: int,
        backoff: RedeliveryBackoff | None = None,
    ) -> None:
        self.ctx = ctx = log.context
        self.meta = meta
        self.acklog = acklog
        self.owner = owner
        self.ack_timeout_ms = ack_timeout_ms
        self.nack_delay_ms = nack_delay_ms
        self.backoff = backoff
        self.counts = DeliveryCounts()
        self.max_unacked = max_unacked
        self.max_ranges = max_ranges
        self.size = meta.range_size
        self.leases = LeaseStore(ctx.storage, meta.ref, meta.range_size)
        path = paths.partition_log_path(meta.ref.topic, meta.ref.partition)
        self.topic_log = ctx.partition_log(path)
        self.reader = PartitionReader(
            ctx.partition_state(path, shared=False), meta.ref.topic, meta.ref.partition, READ_COMMITTED
        )
        self._positioned = False
        self.schema = with_metadata_schema(ctx.topics.get(meta.ref.topic).schema)
        self.owned: dict[int, Lease] = {}
        self.others: dict[int, Lease] = {}  # ranges known to be leased by someone else
        self.inflight: dict[int, Delivery] = {}  # offset -> delivery
        self.scan: dict[int, int] = {}  # range -> next offset to look at under its lease
        self.revisit: dict[int, set[int]] = {}  # range -> offsets to look at again (pending, nacked)
        self.nacked: dict[int, int] = {}  # offset -> redelivery due (ms)
        self.skips: set[tuple[int, int]] = set()
        self._bounds: SortedDict = SortedDict()  # topic entry base -> record count

    # --- receiving ------------------------------------------------------------------------------

    def receive(self, max_records: int, now: int) -> pa.Table:
        self._catch_up(now)
        out: list[pa.Table] = []
        budget = max_records
        try:
            for k in sorted(self.owned):
                if budget <= 0:
                    break
                for t in self._deliver_owned(k, budget, now):
                    out.append(t)
                    budget -= t.num_rows
            if budget > 0:
                self._claim_and_deliver(budget, now, out)
        except Exception as exc:
            # Records taken before it (a loss, a storage error) are in flight now: hand them out, or nobody would
            # until their lease runs out. The error is raised by a later call, once the ranges this consumer
            # leases give nothing more (their records go first).
            if not any(t.num_rows for t in out):
                raise
            logger.warning("%s; delivering records already taken first", exc)
        return self._finish(out)

    def _catch_up(self, now: int) -> None:
        """Replay the ack log, forget what the mark-delete position passed, and drop lapsed leases."""
        state = self.acklog.refresh(resolve=True)
        for o in [o for o in self.inflight if o < state.mark_delete]:
            del self.inflight[o]
        for o in [o for o in self.nacked if o < state.mark_delete]:
            del self.nacked[o]
        self.counts.forget_below(state.mark_delete)
        for k in [k for k, lease in self.owned.items() if not lease.valid(now)]:
            self._drop(k)
        for k in [k for k, lease in self.others.items() if not lease.valid(now)]:
            del self.others[k]

    def _finish(self, out: list[pa.Table]) -> pa.Table:
        tables = [t for t in out if t.num_rows]
        if not tables:
            return empty_table(self.schema)
        return pa.concat_tables(tables).sort_by("_offset")

    def _drop(self, k: int) -> None:
        self.owned.pop(k, None)
        self.scan.pop(k, None)
        self.revisit.pop(k, None)

    def _range(self, k: int) -> tuple[int, int]:
        return k * self.size, (k + 1) * self.size

    def _deliver_owned(self, k: int, budget: int, now: int) -> list[pa.Table]:
        lease = self.owned[k]
        state = self.acklog.state
        first, end = self._range(k)
        busy = any(d.range == k and d.gen == lease.gen for d in self.inflight.values())
        half_spent = now >= lease.acquired_ms + self.ack_timeout_ms // 2
        if half_spent and busy:
            return []  # nothing more under a half-spent lease while records of it are in flight
        revisit = self.revisit.setdefault(k, set())
        again = self._again(k, now)
        pos = max(self.scan.get(k, first), state.mark_delete)
        fresh, scanned_to = self._read(pos, end) if pos < end else (None, pos)
        if pos >= end:
            self.scan[k] = end
        wanted = [t for t in (again, fresh) if t is not None and self._any_deliverable(t, k, lease, now)]
        if not wanted:
            if fresh is not None:
                self.scan[k] = scanned_to
            if half_spent or (self.scan.get(k, first) >= end and not revisit and not busy):
                self._drop(k)  # nothing for us here now; the lease simply runs out (no write)
            return []
        if half_spent:  # renew first, so every record goes out with at least half an ack timeout
            renewed = self.leases.claim(k, self.owner, now, self.ack_timeout_ms, renew=True)
            if renewed is None:
                self._drop(k)
                return []
            self.owned[k] = lease = renewed
        out: list[pa.Table] = []
        if again is not None:
            taken, _stop = self._take(k, lease, again, budget, now)
            out.append(taken)
            budget -= taken.num_rows
        if fresh is not None:
            if budget > 0:
                taken, stop = self._take(k, lease, fresh, budget, now)
                self.scan[k] = stop if stop is not None else scanned_to
                out.append(taken)
            elif all(t is not fresh for t in wanted):  # nothing in it for us: look further next time
                self.scan[k] = scanned_to
        return out

    def _again(self, k: int, now: int) -> pa.Table | None:
        """The records of ``k`` to look at again that may go out now (unacknowledged, their redelivery delay
        over); forgets those acknowledged meanwhile."""
        state = self.acklog.state
        revisit = self.revisit.setdefault(k, set())
        due = []
        for o in sorted(revisit):
            st = state.status(o)
            if st is AckStatus.ACKED:
                revisit.discard(o)
            elif st is AckStatus.UNACKED and self.nacked.get(o, 0) <= now:
                due.append(o)
        if not due:
            return None
        again, _ = self._read(due[0], due[-1] + 1)
        if again is None:
            return None
        import pyarrow.compute as pc  # here, not at import: it costs every txnlog process ~0.1 s

        return again.filter(pc.is_in(again.column("_offset"), pa.array(due, pa.int64())))

    def _claim_and_deliver(self, budget: int, now: int, out: list[pa.Table]) -> None:
        """Claim ranges with deliverable records and take them into ``out`` (the caller's: what was taken
        before an error is still handed out)."""
        if sum(1 for o in self.inflight if self._current(o)) >= self.max_unacked:
            return
        state = self.acklog.state
        end_offset = self.topic_log.readable_end()
        k = state.mark_delete // self.size
        examined = 0
        while k * self.size < end_offset and budget > 0 and examined < self.max_ranges:
            first, end = self._range(k)
            first = max(first, state.mark_delete)
            if k in self.owned or state.first_unacked(first, end) is None:
                k += 1
                continue
            known = self.others.get(k)
            if known is not None and known.valid(now):
                k += 1
                continue
            examined += 1
            # Look first (cheap at the tail), claim only if something is deliverable: idle consumers
            # write nothing.
            table, scanned_to = self._read(first, end)
            if table is None:
                break
            if not self._any_deliverable(table, k, None, now):
                k += 1
                continue
            lease = self.leases.claim(k, self.owner, now, self.ack_timeout_ms)
            if lease is not None and now >= lease.acquired_ms + self.ack_timeout_ms // 2:
                lease = self.leases.claim(k, self.owner, now, self.ack_timeout_ms, renew=True)  # ours, half-spent
            if lease is None:
                current = self.leases.latest(k)
                if current is not None:
                    self.others[k] = current
                k += 1
                continue
            self.others.pop(k, None)
            self.owned[k] = lease
            self.revisit[k] = set()
            state = self.acklog.refresh()  # acknowledgements that landed while we claimed
            taken, stop = self._take(k, lease, table, budget, now)
            self.scan[k] = stop if stop is not None else scanned_to
            out.append(taken)
            budget -= taken.num_rows
            k += 1

    def _current(self, offset: int) -> bool:
        d = self.inflight[offset]
        lease = self.owned.get(d.range)
        return lease is not None and lease.gen == d.gen

    def _any_deliverable(self, table: pa.Table, k: int, lease: Lease | None, now: int) -> bool:
        """Whether ``_take`` would deliver something of ``table`` (no side effects)."""
        state = self.acklog.state
        for o in table.column("_offset").to_pylist():
            d = self.inflight.get(o)
            if d is not None and lease is not None and d.range == k and d.gen == lease.gen:
                continue
            if self.nacked.get(o, 0) <= now and state.status(o) is AckStatus.UNACKED:
                return True
        return False

    def _take(self, k: int, lease: Lease, table: pa.Table, budget: int, now: int) -> tuple[pa.Table, int | None]:
        """Deliver up to ``budget`` deliverable records of ``table`` (range ``k``); returns them and, if the
        budget ran out, the offset where the next look must start."""
        return self._take_rows(table, [k] * table.num_rows, {k: lease}, budget, now)

    def _take_rows(
        self, table: pa.Table, ranges: Sequence[int], leases: Mapping[int, Lease], budget: int, now: int
    ) -> tuple[pa.Table, int | None]:
        """As :meth:`_take`, for rows of several ranges: row ``i`` belongs to ``ranges[i]``, held under
        ``leases[ranges[i]]``; rows are taken in table order."""
        state = self.acklog.state
        keep: list[int] = []
        stop: int | None = None
        for i, (o, k) in enumerate(zip(table.column("_offset").to_pylist(), ranges, strict=True)):
            lease = leases[k]
            d = self.inflight.get(o)
            if d is not None and d.range == k and d.gen == lease.gen:
                continue
            revisit = self.revisit.setdefault(k, set())
            if self.nacked.get(o, 0) > now:
                revisit.add(o)
                continue
            st = state.status(o)
            if st is AckStatus.ACKED:
                continue
            if st is AckStatus.PENDING:
                revisit.add(o)
                continue
            if len(keep) >= budget:
                stop = o
                break
            keep.append(i)
            self.counts.delivered(o)
            self.inflight[o] = Delivery(k, lease.gen, now)
            self.nacked.pop(o, None)
            revisit.discard(o)
        return table.take(pa.array(keep, pa.int64())), stop

    def _read(self, first: int, end: int) -> tuple[pa.Table | None, int]:
        """Deliverable (read_committed) records of the topic in ``[first, end)``, up to the read bound,
        and the offset the look reached. Offsets passed over without a record are noted as skips."""
        r = self.reader
        if not self._positioned or r.position != first:
            try:
                r.seek(first)
            except OffsetOutOfRangeError:
                return None, first
            self._positioned = True
        batches: list[pa.RecordBatch] = []
        while r.position < end:
            got = r.poll(end - r.position)
            if not got:
                break
            batches.extend(got)
        reached = min(end, r.position)
        table = pa.Table.from_batches(batches, schema=self.schema)
        offsets = table.column("_offset")
        import pyarrow.compute as pc  # here, not at import (see _deliver_owned)

        if table.num_rows and pc.max(offsets).as_py() >= end:
            table = table.filter(pc.less(offsets, end))
        self._note_skips(first, reached, to_numpy(table.column("_offset")))
        return table, reached

    def _note_skips(self, first: int, reached: int, delivered: np.ndarray) -> None:
        state = self.acklog.state
        prev = first
        for o in [*delivered.tolist(), reached]:
            if o > prev and state.first_unacked(prev, o) is not None and len(self.skips) < MAX_SKIPS:
                self.skips.add((prev, o))
            prev = max(prev, o + 1)

    def take_skips(self) -> tuple[tuple[int, int], ...]:
        """Skip ranges to report in the next ack record (merged)."""
        out = ranges_of(o for s, e in self.skips for o in range(s, e)) if self.skips else []
        self.skips.clear()
        return tuple(out)

    # --- acknowledgement bookkeeping ------------------------------------------------------------

    def check_delivered(self, offsets: Iterable[int], verb: str = "acknowledge") -> list[int]:
        """The offsets, sorted and unique, if every one was delivered to this consumer and is unsettled; the
        error names ``verb`` (what the caller asked: acknowledge, negatively acknowledge)."""
        done = {"acknowledge": "acknowledged", "negatively acknowledge": "negatively acknowledged"}.get(verb, verb)
        out = sorted(set(offsets))
        missing = [o for o in out if o not in self.inflight]
        if missing:
            end = self.topic_log.readable_end()
            bad = [o for o in missing if o >= end]
            if bad:
                raise OffsetOutOfRangeError(
                    f"{self.meta.ref}: offsets {bad[:10]} are beyond the partition's end {end}; nothing was {done}"
                )
            raise InvalidOffsetError(
                f"{self.meta.ref}: offsets {missing[:10]} were not delivered to consumer {self.owner!r} (or were "
                f"already acknowledged or negatively acknowledged); {verb} only records receive() returned. "
                f"Nothing was {done}."
            )
        return out

    def settled(self, offsets: Iterable[int], *, pending: bool) -> None:
        """Forget ``offsets`` as in flight; ``pending``: held by a transaction now, so look again if it
        aborts."""
        for o in offsets:
            d = self.inflight.pop(o, None)
            if pending and d is not None:
                self.revisit.setdefault(d.range, set()).add(o)
            elif not pending:
                self.counts.forget(o)

    def nack(self, offsets: Iterable[int], now: int) -> None:
        for o in offsets:
            d = self.inflight.pop(o)
            redelivery = self.counts.redeliveries(o) + 1
            self.nacked[o] = now + (self.backoff.delay_ms(redelivery) if self.backoff else self.nack_delay_ms)
            self.revisit.setdefault(d.range, set()).add(o)

    def redeliver_all(self, now: int) -> None:
        """Make every record in flight deliverable again (at once) — e.g. after aborting a transaction."""
        self.redeliver(list(self.inflight))

    def redeliver(self, offsets: Iterable[int]) -> None:
        """Make these records, if in flight, deliverable again at once."""
        for o in offsets:
            d = self.inflight.pop(o, None)
            if d is not None:
                self.nacked.pop(o, None)
                self.revisit.setdefault(d.range, set()).add(o)

    def bounds(self, offset: int) -> tuple[int, int]:
        """``(base, count)`` of the topic entry holding ``offset`` (cached; one header read per entry)."""
        i = self._bounds.bisect_right(offset) - 1
        if i >= 0:
            base, count = self._bounds.peekitem(i)
            if offset < base + count:
                return int(base), int(count)
        header = self.topic_log.read_header(self.topic_log.slot_for_offset(offset))
        self._bounds[header.base_offset] = header.record_count
        if len(self._bounds) > 65536:
            self._bounds.popitem(0)
        return header.base_offset, header.record_count

    def release_idle(self, now: int) -> None:
        """Release every range with nothing in flight under its lease (stepping down: what is in flight stays
        this consumer's until settled or its lease lapses, so it reaches no one else meanwhile)."""
        busy = {d.range for o, d in self.inflight.items() if self._current(o)}
        for k, lease in list(self.owned.items()):
            if k not in busy:
                if lease.valid(now):
                    self.leases.release(lease, now)
                self._drop(k)

    def release_all(self, now: int) -> None:
        """Release every lease this consumer holds (the releases overlapped)."""
        parallel_map(lambda lease: self.leases.release(lease, now), [x for x in self.owned.values() if x.valid(now)])
        self.owned.clear()
