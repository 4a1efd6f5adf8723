"""Key_Shared dispatch: which records this consumer delivers now (PROTOCOL.md "Subscription types",
"Key_Shared").

The rules of shared dispatch (:mod:`.dispatcher`) hold with a **key slice** (:mod:`.keys`) in place of an
offset range: a consumer delivers a record only if it holds the current lease of the slice the record's key
hashes into (with at least half its ack timeout left), the state says the record is neither acknowledged nor
pending, and it has not already delivered it under this lease. So the records of one key reach one consumer
at a time, and it delivers them in offset order.

Every consumer reads the whole partition (read_committed, in windows of :data:`WINDOW` offsets) and keeps,
per slice it wants, how far it has looked (``scan``). It claims a slice only after a look shows a deliverable
record in it, so idle consumers write no slice lease. A look at a slice this consumer does not hold never loses
sight of a record that is not acknowledged: one in flight at another holder makes it try to claim the slice
(and learn the holder); one held by an open transaction (or waiting out a negative acknowledgement) is
**watched**, and the slice's look goes back to it once it may go out. So what another holder left is found
again when its lease lapses or is released, and a pending record never holds up the look at other slices.

**Hand-over.** A consumer wants the slices :mod:`.keys` assigns it (auto split over the members, or its sticky
ranges). A slice it holds and no longer wants goes out of delivery at once, and its lease is released as soon
as nothing of it is in flight: a joining consumer gets a key only after the previous holder's deliveries of it
are acknowledged or negatively acknowledged (or its lease lapsed: it died). A wanted slice another consumer
holds is looked at again every :data:`SLICE_CHECK_MS`, so a release is noticed without waiting for the lease
to lapse.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from txn_core.clients.subscriptions.acklog import AckLog
from txn_core.clients.subscriptions.dispatcher import Dispatcher
from txn_core.clients.subscriptions.keys import KEY_SLICES, KeyLeaseStore, slices_of
from txn_core.clients.subscriptions.redelivery import RedeliveryBackoff
from txn_core.clients.subscriptions.state import AckStatus
from txn_core.clients.subscriptions.store import SubscriptionMeta
from txn_core.format.arrays import to_numpy
from txn_core.logs import get_logger
from txn_core.storage.parallel import parallel_map

if TYPE_CHECKING:
    from txn_core.clients.context import SupportsContext

#: Offsets read per look at the partition at most (bounds the memory of one receive); a look reads
#: :data:`WINDOW_PER_RECORD` offsets per record the receive may still return, at least :data:`MIN_WINDOW`, so a
#: small receive does not read (and hash) far past what it returns, only to read it again next time.
WINDOW = 4096
MIN_WINDOW = 128
WINDOW_PER_RECORD = 4
#: Looks per receive at most (a receive over a long stretch of other consumers' keys returns and goes on
#: at the next call).
MAX_WINDOWS = 16
#: How often (log clock) a wanted slice another consumer holds is looked at again.
SLICE_CHECK_MS = 200

logger = get_logger(__name__)


class KeyDispatcher(Dispatcher):
    """The dispatch state of one Key_Shared consumer (see module doc). ``wanted(now)``: the slices it should
    hold now. Not thread-safe: the consumer locks."""

    def __init__(
        self,
        log: SupportsContext,
        meta: SubscriptionMeta,
        acklog: AckLog,
        owner: str,
        *,
        wanted: Callable[[int], frozenset[int]],
        ack_timeout_ms: int,
        nack_delay_ms: int,
        max_unacked: int,
        backoff: RedeliveryBackoff | None = None,
    ) -> None:
        super().__init__(
            log,
            meta,
            acklog,
            owner,
            ack_timeout_ms=ack_timeout_ms,
            nack_delay_ms=nack_delay_ms,
            max_unacked=max_unacked,
            max_ranges=MAX_WINDOWS,
            backoff=backoff,
        )
        if meta.key_column is None:  # pragma: no cover - open_meta checks it
            raise ValueError("a Key_Shared subscription without a key column")
        self.key_column = meta.key_column
        self.leases: KeyLeaseStore = KeyLeaseStore(self.ctx.storage, meta.ref)
        self.wanted = wanted
        self._others_checked: dict[int, int] = {}  # slice -> when its holder was last looked at
        #: slice not held -> offsets a look passed over that were not acknowledged (held by an open transaction,
        #: or waiting out this consumer's negative acknowledgement): looked at again when they may go out
        self.watch: dict[int, set[int]] = {}

    def receive(self, max_records: int, now: int) -> pa.Table:
        self._catch_up(now)
        wanted = self.wanted(now)
        for k in [k for k in self.scan if k not in wanted and k not in self.owned]:
            del self.scan[k]  # when wanted again, looked at from the mark-delete position
            self.watch.pop(k, None)
        busy = {d.range for o, d in self.inflight.items() if self._current(o)}
        leaving = [k for k in self.owned if k not in wanted and k not in busy]  # stepping down: none in flight
        parallel_map(lambda k: self.leases.release(self.owned[k], now), leaving)
        for k in leaving:
            self._drop(k)
        self._look_at_others(wanted, now)
        out: list[pa.Table] = []
        if sum(1 for o in self.inflight if self._current(o)) >= self.max_unacked:
            return self._finish(out)
        try:
            budget = max_records
            agains = {}  # records to deliver again (negatively acknowledged, or their transaction aborted)
            for k in sorted(set(self.owned) & wanted):
                again = None if self._paused(k, busy, now) else self._again(k, now)
                if again is not None and again.num_rows:
                    agains[k] = again
            half_spent = [k for k in agains if now >= self.owned[k].acquired_ms + self.ack_timeout_ms // 2]
            for k in self._claim(half_spent, now):  # renewed first, as for fresh records
                del agains[k]
            for k, again in agains.items():
                if budget > 0:
                    taken, _stop = self._take(k, self.owned[k], again, budget, now)
                    out.append(taken)
                    budget -= taken.num_rows
            self._recheck_watched(wanted, now)
            self._deliver_fresh(wanted, busy, budget, now, out)
        except Exception as exc:
            # Records taken before it are in flight now: hand them out, or nobody would until their lease runs
            # out (and a key's later records could go out first). The error comes again at a later call.
            if not any(t.num_rows for t in out):
                raise
            logger.warning("%s; delivering records already taken first", exc)
        return self._finish(out)

    def _paused(self, k: int, busy: set[int], now: int) -> bool:
        """Whether slice ``k`` (ours) delivers nothing now: its lease is half spent with records in flight."""
        lease = self.owned[k]
        return k in busy and now >= lease.acquired_ms + self.ack_timeout_ms // 2

    def _skipped(self, k: int, busy: set[int], now: int) -> bool:
        """Whether wanted slice ``k`` is left out of this look: paused (ours), or another consumer's."""
        return self._paused(k, busy, now) if k in self.owned else k in self.others

    def _look_at_others(self, wanted: frozenset[int], now: int) -> None:
        """Forget the holder of a wanted slice that released it (looked at every :data:`SLICE_CHECK_MS`, all
        such slices in one round)."""
        due = [
            k
            for k in sorted(wanted & set(self.others))
            if now - self._others_checked.get(k, now - SLICE_CHECK_MS) >= SLICE_CHECK_MS
        ]
        if not due:
            return
        for k, current in self.leases.latest_many(due).items():
            self._others_checked[k] = now
            if current is None or not current.valid(now) or current.owner == self.owner:
                del self.others[k]
            else:
                self.others[k] = current

    def _deliver_fresh(
        self, wanted: frozenset[int], busy: set[int], budget: int, now: int, out: list[pa.Table]
    ) -> None:
        """Look at the partition from the lowest position of a deliverable slice on, a window at a time, and
        deliver what the slices this consumer holds (or claims on the way) allow."""
        end = self.topic_log.readable_end()
        for _ in range(MAX_WINDOWS):
            if budget <= 0:
                return
            mark = self.acklog.state.mark_delete
            live = sorted(k for k in wanted if not self._skipped(k, busy, now))
            if not live:
                return
            lo = min(max(self.scan.get(k, mark), mark) for k in live)
            if lo >= end:
                return
            window = min(WINDOW, max(MIN_WINDOW, WINDOW_PER_RECORD * budget))
            table, reached = self._read(lo, min(end, lo + window))
            if table is None or reached <= lo:
                return
            slices = slices_of(table.column(self.key_column))
            offsets = to_numpy(table.column("_offset"))
            starts = np.full(KEY_SLICES, np.iinfo(np.int64).max, dtype=np.int64)  # per slice: deliver from here
            claims: list[int] = []  # slices with a deliverable record to claim or renew first
            for k in live:
                start = max(self.scan.get(k, mark), mark)
                if start >= reached:
                    continue
                rows = (slices == k) & (offsets >= start)
                if not rows.any():
                    self.scan[k] = reached
                    continue
                lease = self.owned.get(k)
                fresh = lease is None or now >= lease.acquired_ms + self.ack_timeout_ms // 2
                sub = table.filter(pa.array(rows)) if fresh else None
                if sub is not None and not self._any_deliverable(sub, k, lease, now):
                    # Held: everything passed over is in flight under this lease, acknowledged or pending (then in
                    # revisit). Not held: what is not acknowledged is watched (see _recheck_watched).
                    if lease is None:
                        self._watch(k, sub)
                    self.scan[k] = reached
                    continue
                starts[k] = start
                if fresh:
                    claims.append(k)
            for k in self._claim(claims, now):
                starts[k] = np.iinfo(np.int64).max
            taking = [k for k in live if starts[k] < reached]
            if not taking:
                continue
            rows = offsets >= starts[slices]  # rows of slices being taken, from each one's start, in offset order
            taken, stop = self._take_rows(table.filter(pa.array(rows)), slices[rows].tolist(), self.owned, budget, now)
            out.append(taken)
            budget -= taken.num_rows
            for k in taking:
                self.scan[k] = stop if stop is not None else reached

    def _claim(self, ks: list[int], now: int) -> list[int]:
        """Claim (or renew) the slices ``ks`` in one round (:meth:`KeyLeaseStore.claim_many`); returns those not
        held now, noting their holders. Below a newly claimed slice's look every record is acknowledged, or
        watched (then delivered again from the slice's revisits), or the look began at the mark-delete position:
        nothing the last holder left is missed."""
        if not ks:
            return []
        failed = []
        for k, result in self.leases.claim_many(ks, self.owner, now, self.ack_timeout_ms).items():
            if result.lease is None:
                failed.append(k)
                self._drop(k)
                if result.holder is not None:
                    self.others[k] = result.holder
                    self._others_checked[k] = now
                continue
            if k not in self.owned:
                self.revisit[k] = self.watch.pop(k, set())  # what its looks passed over, not acknowledged
            self.others.pop(k, None)
            self.owned[k] = result.lease
        if len(failed) < len(ks):
            self.acklog.refresh()  # acknowledgements that landed while we claimed
        return failed

    def _watch(self, k: int, sub: pa.Table) -> None:
        """Remember the records of ``sub`` (slice ``k``, not held) that are not acknowledged."""
        state = self.acklog.state
        pending = {int(o) for o in sub.column("_offset").to_pylist() if state.status(o) is not AckStatus.ACKED}
        if pending:
            self.watch.setdefault(k, set()).update(pending)

    def _recheck_watched(self, wanted: frozenset[int], now: int) -> None:
        """Look again at watched records that may go out now (their transaction aborted, their delay passed):
        their slice's look goes back to the first of them. Acknowledged ones are forgotten."""
        state = self.acklog.state
        for k in [k for k in self.watch if k in wanted and k not in self.owned and k not in self.others]:
            watched = self.watch[k]
            watched -= {o for o in watched if state.status(o) is AckStatus.ACKED}
            due = [o for o in watched if state.status(o) is AckStatus.UNACKED and self.nacked.get(o, 0) <= now]
            if due:
                self.scan[k] = min(*due, self.scan.get(k, state.mark_delete))
                watched.difference_update(due)
            if not watched:
                del self.watch[k]

    def _drop(self, k: int) -> None:
        super()._drop(k)
        self.watch.pop(k, None)
