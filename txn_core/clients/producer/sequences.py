"""What a producer's entries carry to be de-duplicated: its producer id, its epoch, and the next base sequence
per partition log in that epoch (PROTOCOL.md "Idempotence"; the readers' side is
:mod:`txn_core.partition.sequences`).

Invariants:

* the sequences belong to the epoch: they restart at 0 in every partition log whenever the epoch moves
  (:meth:`ProducerSequences.move_to`), and the producer id only changes with the epoch (``init``);
* the records of one epoch in one partition log end at :data:`SEQUENCE_LIMIT` (the header's base sequence
  is a signed 32-bit number): a writer asks :meth:`ProducerSequences.over` before writing, and an idempotent
  producer moves to the next epoch rather than pass it (:meth:`ProducerSequences.bump_epoch`);
* a transaction runs at one epoch (KIP-890: a fresh one); between transactions :attr:`next_epoch` says
  which (the current one, or a decided transaction's plus one).

Crash windows: none of its own, nothing here is durable. A new instance of a transactional id gets a new
epoch from ``init_transactions``, an idempotent producer a new producer id: its sequences start at 0.

Locking: none of its own. The producer's lock holder moves the epoch; the Sender's pool threads read it
and advance the sequence of one partition log each (a dict item, atomic under the GIL) while it waits.
"""

from __future__ import annotations

#: Records one epoch can write to one partition: the header's base sequence is a signed 32-bit number.
SEQUENCE_LIMIT = 2**31 - 1


class ProducerSequences:
    """The producer id, epoch and per-partition-log sequences of one producer; see module doc."""

    def __init__(self, producer_id: int = -1) -> None:
        self.producer_id = producer_id
        self.epoch = 0
        #: the epoch the next transaction begins at: the current epoch, or a decided one's plus one
        self.next_epoch = 0
        #: the next base sequence per partition log, in the current epoch (one dict: cleared, never replaced)
        self.sequences: dict[str, int] = {}

    def next(self, path: str) -> int:
        """The base sequence of the next entry to ``path``."""
        return self.sequences.get(path, 0)

    def advance(self, path: str, sequence: int) -> None:
        """An entry up to ``sequence`` (exclusive) is in ``path``: the next one starts there."""
        self.sequences[path] = sequence

    def over(self, rows: dict[str, int]) -> list[str]:
        """The partition logs where ``rows`` more records would pass :data:`SEQUENCE_LIMIT` in this epoch."""
        return [path for path, n in rows.items() if self.next(path) + n > SEQUENCE_LIMIT]

    def move_to(self, epoch: int, *, restart: bool = False) -> None:
        """Run at ``epoch`` from now; every partition's sequence restarts at 0 if it changed (or ``restart``)."""
        if restart or epoch != self.epoch:
            self.sequences.clear()
        self.epoch = self.next_epoch = epoch

    def take_next_epoch(self) -> None:
        """Run at the epoch the next transaction begins at: entries written ahead of its begin carry it."""
        self.move_to(self.next_epoch)

    def bump_epoch(self) -> None:
        """An idempotent producer out of sequence numbers moves to the next epoch."""
        self.move_to(self.epoch + 1, restart=True)
