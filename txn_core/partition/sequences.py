"""Per-partition producer state for de-duplication (PROTOCOL.md "Idempotence").

For each producer id seen in a partition: its epoch and the next expected sequence. An entry with
``base_sequence == -1`` carries no sequence (markers, non-idempotent writers). Otherwise, for the
producer's current epoch:

* ``base_sequence == next``: in order, accepted; ``next += record_count``.
* ``base_sequence < next``: a duplicate of something already in the log (a retry that landed twice):
  the entry is skipped.
* ``base_sequence > next``: a gap -- a batch is missing. The entry is marked; delivering it raises
  :class:`OutOfOrderSequenceError` (see :func:`gap_error`), but only if it would be delivered, so a
  fenced zombie's gapped write into an aborted transaction cannot make a partition unreadable.

A higher epoch resets the sequence (the first entry of a new epoch is accepted whatever its sequence);
an entry with a lower epoch than already seen is a fenced zombie's write and is skipped. Producers idle
for longer than :data:`PRODUCER_STATE_RETENTION_MS` of log time are forgotten each time the log's time
enters a new hour (:data:`PRODUCER_EXPIRY_STEP_MS`, PROTOCOL.md "Idempotence", expiry): at the same entry
for every reader, so the buffer stays a function of the log's prefix.

After a lost entry (PROTOCOL.md "Damage") every known producer is **resynchronised** by its next entry:
the lost entry may have held any of them's next sequence numbers, so a gap right after it is accepted
(duplicates are still skipped).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from txn_core.errors import OutOfOrderSequenceError

#: Producers whose last entry is older than this, in log time, are dropped (Kafka: 1 day).
PRODUCER_STATE_RETENTION_MS = 24 * 3600 * 1000
#: Idle states are dropped whenever log time enters a new step of this length (PROTOCOL.md "Idempotence")
PRODUCER_EXPIRY_STEP_MS = 3600 * 1000


class SequenceCheck(enum.Enum):
    ACCEPT = 0
    DUPLICATE = 1
    FENCED = 2
    GAP = 3


@dataclass(slots=True)
class ProducerEntry:
    epoch: int
    next_sequence: int
    last_timestamp_ms: int


class ProducerStates:
    """Producer id -> (epoch, next sequence) for one partition."""

    __slots__ = ("last_gap", "producers", "resync")

    def __init__(self) -> None:
        self.producers: dict[int, ProducerEntry] = {}
        self.last_gap: tuple[int, int] = (0, 0)
        #: producers whose next entry follows a lost entry: a gap there is accepted (see module doc)
        self.resync: set[int] = set()

    def resync_all(self) -> None:
        """A lost entry was passed: let every known producer's next entry resynchronise it."""
        self.resync.update(self.producers)

    def check(
        self, producer_id: int, epoch: int, base_sequence: int, count: int, timestamp_ms: int, where: str, offset: int
    ) -> SequenceCheck:
        """Classify an entry and update the state (see module doc)."""
        if producer_id < 0 or base_sequence < 0:
            return SequenceCheck.ACCEPT
        cur = self.producers.get(producer_id)
        if cur is None or epoch > cur.epoch:
            self.resync.discard(producer_id)
            self.producers[producer_id] = ProducerEntry(epoch, base_sequence + count, timestamp_ms)
            return SequenceCheck.ACCEPT
        if epoch < cur.epoch:
            return SequenceCheck.FENCED
        resync = producer_id in self.resync
        if resync:
            self.resync.discard(producer_id)
        if base_sequence == cur.next_sequence:
            cur.next_sequence += count
            cur.last_timestamp_ms = max(cur.last_timestamp_ms, timestamp_ms)
            return SequenceCheck.ACCEPT
        if base_sequence < cur.next_sequence:
            return SequenceCheck.DUPLICATE
        # A gap: remember it (the caller records where) and resynchronise on this entry.
        self.last_gap = (cur.next_sequence, base_sequence)
        cur.next_sequence = base_sequence + count
        cur.last_timestamp_ms = max(cur.last_timestamp_ms, timestamp_ms)
        return SequenceCheck.ACCEPT if resync else SequenceCheck.GAP

    def expire(self, now_ms: int, retention_ms: int = PRODUCER_STATE_RETENTION_MS) -> None:
        for pid in [p for p, e in self.producers.items() if now_ms - e.last_timestamp_ms > retention_ms]:
            del self.producers[pid]
            self.resync.discard(pid)

    def _check(self) -> None:
        """Assert the invariants (the randomised model test calls it after every step): every state has a
        producer id >= 0, an epoch >= 0 and a next sequence >= 0."""
        for pid, e in self.producers.items():
            assert pid >= 0 and e.epoch >= 0 and e.next_sequence >= 0, (pid, e)
        assert self.last_gap[0] <= self.last_gap[1] or self.last_gap == (0, 0), self.last_gap

    def to_list(self) -> list[list[int]]:
        return [[p, e.epoch, e.next_sequence, e.last_timestamp_ms] for p, e in sorted(self.producers.items())]

    @classmethod
    def from_list(cls, rows: list[list[int]]) -> ProducerStates:
        s = cls()
        for pid, epoch, nxt, ts in rows:
            s.producers[int(pid)] = ProducerEntry(int(epoch), int(nxt), int(ts))
        return s

    def copy(self) -> ProducerStates:
        s = ProducerStates()
        s.producers = {
            p: ProducerEntry(e.epoch, e.next_sequence, e.last_timestamp_ms) for p, e in self.producers.items()
        }
        s.resync = set(self.resync)
        return s


def gap_error(
    where: str, offset: int, producer_id: int, epoch: int, expected: int, got: int
) -> OutOfOrderSequenceError:
    return OutOfOrderSequenceError(
        f"{where}: producer id {producer_id} epoch {epoch} skipped sequence numbers at offset {offset}: "
        f"expected sequence {expected}, got {got} ({got - expected} records missing). A batch of this "
        "producer was lost; the log cannot be read past this point without data loss. Investigate the "
        "writer; restore the missing entry if it exists elsewhere.",
        producer_id=producer_id,
        epoch=epoch,
        expected=expected,
        received=got,
        offset=offset,
    )
