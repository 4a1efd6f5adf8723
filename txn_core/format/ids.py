"""Identifiers: topic-partitions, transaction ids, producer identities (PROTOCOL.md "Identifiers")."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TypeGuard

from txn_core.errors import InvalidNameError

_NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,200}$")


def validate_name(kind: str, name: object, *, allow_internal: bool = False) -> str:
    """Validate a topic / group / transactional id / subscription name and return it.

    Names are 1-200 characters of letters, digits, ``.``, ``_`` and ``-``; ``.`` and ``..`` are refused
    and names starting with ``__`` are reserved for internal use.
    """
    if not isinstance(name, str) or not _NAME_RE.match(name) or name in (".", ".."):
        raise InvalidNameError(
            f"invalid {kind} name {name!r}: use 1-200 letters, digits, '.', '_' or '-' "
            "(no '/', spaces or path tricks such as '..')"
        )
    if name.startswith("__") and not allow_internal:
        raise InvalidNameError(f"invalid {kind} name {name!r}: names starting with '__' are reserved")
    return name


def is_int(value: object) -> TypeGuard[int]:
    """An int that is not a bool: ``True`` is an int to Python, not an offset, partition or count to a user."""
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True, order=True)
class TopicPartition:
    """One partition of one topic."""

    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


#: Begins one transaction-log record may hold (group commit): a transaction's index in its record is below it.
MAX_BEGINS_PER_RECORD = 16


@dataclass(frozen=True, slots=True, order=True)
class TxnId:
    """A 128-bit transaction id: the coordinator partition and the transaction's index in its begin record in
    the high 64 bits (``coordinator | index << 32``), its sequence in the low 64 (PROTOCOL.md "Identifiers").

    The sequence is the slot of the transaction's BEGIN record in its coordinator partition, and the index
    its place among the begins of that record (0 for the first; group commit puts several producers' begins
    into one record), so ids are unique, and ordered per coordinator (which the low watermark relies on).
    Printed ``c:sequence``, or ``c:sequence.index`` when the index is not 0.
    """

    coordinator: int
    sequence: int
    index: int = 0

    @property
    def header_hi(self) -> int:
        """The high 64 bits, as entry headers and segment indexes store them."""
        return self.coordinator | self.index << 32

    @classmethod
    def from_header(cls, hi: int, lo: int) -> TxnId:
        """The id whose high 64 bits are ``hi`` (:attr:`header_hi`) and low 64 ``lo``."""
        return cls(hi & 0xFFFFFFFF, lo, hi >> 32)

    @property
    def value(self) -> int:
        return (self.header_hi << 64) | self.sequence

    def __str__(self) -> str:
        return f"{self.coordinator}:{self.sequence}" + (f".{self.index}" if self.index else "")

    @classmethod
    def parse(cls, text: str) -> TxnId:
        try:
            hi, lo = text.split(":")
            seq, dot, index = lo.partition(".")
            txn = cls(int(hi), int(seq), int(index) if dot else 0)
        except ValueError as exc:
            raise InvalidNameError(
                f"invalid transaction id {text!r}: expected COORDINATOR:SEQUENCE or COORDINATOR:SEQUENCE.INDEX"
            ) from exc
        if (
            min(txn.coordinator, txn.sequence, txn.index) < 0
            or txn.index >= MAX_BEGINS_PER_RECORD
            or (dot and txn.index == 0)  # index 0 is printed without one: one id, one spelling
        ):
            raise InvalidNameError(f"invalid transaction id {text!r}: a part is out of range")
        return txn


NO_PRODUCER = -1
NO_SEQUENCE = -1
