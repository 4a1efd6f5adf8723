"""The open transactions and recent outcomes of one coordinator partition (PROTOCOL.md "Transaction log":
transaction status for readers, low watermark).

:class:`TxnIndex` answers a reader's questions by transaction id rather than by transactional id: which id
holds the open transaction ``(c, sequence, index)``, what the oldest open transaction is (the low
watermark), and how a recently completed one ended. The replayed state
(:class:`~txn_core.coordinator.txnlog.CoordinatorPartition`) keeps it in step with every transition of an
id (its state before and after, :meth:`TxnIndex.note`), by replay and by the writer alike.

Invariants (:meth:`TxnIndex.check`): ``open`` holds the key (:func:`open_key`: sequence, index,
transactional id) of every transaction that is not complete (each id's current and completing ones, or a
reservation), mapped to its id, and nothing else; no two of them share a transaction id (records written
before begins had an index are the exception while both are open: replayed, never written); ``outcomes``
holds at most ``keep`` final states, oldest completion first.

Crash windows: none. The index lives in memory only and is rebuilt from a coordinator snapshot (its
``outcomes``; the open transactions from the ids' states) and the records after it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator
from typing import cast

from sortedcontainers import SortedDict

from txn_core.coordinator.tidstate import TidState
from txn_core.format.ids import TxnId
from txn_core.format.states import CoordinatorState

__all__ = ["TxnIndex", "open_key", "txn_key"]


def txn_key(txn: TxnId) -> tuple[int, int]:
    """A transaction's key in one coordinator partition's indexes: (sequence, index in its record)."""
    return txn.sequence, txn.index


def open_key(txn: TxnId, tid: str) -> tuple[int, int, str]:
    """A transaction's key in :attr:`TxnIndex.open`: its :func:`txn_key` and its transactional id. The id is
    part of the key because the begins of a record written before ids had an index share one id (PROTOCOL.md
    "Group commit"); for every other record the first two parts alone are unique."""
    return txn.sequence, txn.index, tid


def _finished(before: TidState | None, after: TidState) -> list[tuple[TxnId, CoordinatorState]]:
    """The transactions a step completed, with their final state: the current one reaching Complete*, or
    the completing one leaving."""
    out: list[tuple[TxnId, CoordinatorState]] = []
    if (
        before is not None
        and before.completing is not None
        and (after.completing is None or after.completing.txn != before.completing.txn)
    ):
        c = before.completing
        out.append((c.txn, CoordinatorState.COMPLETE_COMMIT if c.committed else CoordinatorState.COMPLETE_ABORT))
    a = before.ahead if before is not None else None
    if (
        a is not None
        and after.ahead is None
        and after.txn != a.txn
        and (after.completing is None or after.completing.txn != a.txn)
    ):
        out.append((a.txn, CoordinatorState.COMPLETE_ABORT))  # withdrawn unused: nothing of it exists
    complete = after.state in (CoordinatorState.COMPLETE_COMMIT, CoordinatorState.COMPLETE_ABORT)
    if (
        after.txn is not None
        and complete
        and (before is None or (before.txn, before.state) != (after.txn, after.state))
    ):
        out.append((after.txn, after.state))
    return out


class TxnIndex:
    """The transactions of one coordinator partition that are not complete, by :func:`open_key`, and the
    final states of the newest ``keep`` completed ones, by :func:`txn_key`. Not thread-safe: its owner's
    lock guards it."""

    def __init__(self, keep: int, outcomes: OrderedDict[tuple[int, int], CoordinatorState] | None = None) -> None:
        self.keep = keep
        self.open: SortedDict = SortedDict()  # (sequence, index, tid) -> tid, transactions not complete
        #: (sequence, index) -> final state, oldest completion first
        self.outcomes: OrderedDict[tuple[int, int], CoordinatorState] = OrderedDict() if outcomes is None else outcomes

    @classmethod
    def of(
        cls, tids: Iterable[TidState], outcomes: OrderedDict[tuple[int, int], CoordinatorState], keep: int
    ) -> TxnIndex:
        """The index of restored state: the open transactions of ``tids`` and ``outcomes`` as they are."""
        index = cls(keep, outcomes)
        for st in tids:
            for txn in st.open_txns():
                index.open[open_key(txn, st.tid)] = st.tid
        return index

    def note(self, before: TidState | None, after: TidState) -> None:
        """Keep the index in step with one transition of one id."""
        still_open = {open_key(t, after.tid) for t in after.open_txns()}
        if before is not None:
            for txn in before.open_txns():
                if open_key(txn, before.tid) not in still_open:
                    self.open.pop(open_key(txn, before.tid), None)
        for key in still_open:
            self.open[key] = after.tid
        for txn, final in _finished(before, after):
            self.outcomes[txn_key(txn)] = final
            while len(self.outcomes) > self.keep:
                self.outcomes.popitem(last=False)

    def oldest_open(self) -> int | None:
        """The smallest sequence of a transaction that is not complete; None if every one is."""
        if self.open:
            return int(self.open.keys()[0][0])
        return None

    def open_tids(self, txn: TxnId) -> list[str]:
        """The transactional ids whose open transaction is ``txn``, by name: one, except for the ids of a
        record written before indexes existed, whose begins share ``txn``."""
        seq, index = txn_key(txn)
        return [
            cast(str, self.open[key])
            for key in self.open.irange((seq, index), (seq, index + 1), inclusive=(True, False))
        ]

    def open_items(self) -> Iterator[tuple[tuple[int, int], str]]:
        """Every transaction that is not complete, oldest first: its :func:`txn_key` and its id."""
        for key, tid in self.open.items():
            yield key[:2], tid

    def outcome(self, txn: TxnId) -> CoordinatorState | None:
        """The final state of ``txn`` if it completed recently enough to be kept."""
        return self.outcomes.get(txn_key(txn))

    def check(self, tids: Iterable[TidState]) -> None:
        """Assert the invariants against the ids' states ``tids``. Transactions of a record written before
        indexes existed that share an id fail it while both are open: such records are replayed, never
        written."""
        opened = [(open_key(txn, st.tid), st.tid) for st in tids for txn in st.open_txns()]
        expected = dict(opened)
        assert len({key[:2] for key in expected}) == len(opened), f"transactions sharing an id: {opened}"
        assert dict(self.open) == expected, (dict(self.open), expected)
        assert len(self.outcomes) <= self.keep
