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


@dataclass(frozen=True, slots=True, order=True)
class TxnId:
    """A 128-bit transaction id: coordinator id in the high 64 bits, its sequence in the low 64.

    The sequence is the slot of the transaction's BEGIN record in its coordinator partition, so ids are
    unique, and ordered per coordinator (which the low watermark relies on).
    """

    coordinator: int
    sequence: int

    @property
    def value(self) -> int:
        return (self.coordinator << 64) | self.sequence

    def __str__(self) -> str:
        return f"{self.coordinator}:{self.sequence}"

    @classmethod
    def parse(cls, text: str) -> TxnId:
        try:
            hi, lo = text.split(":")
            return cls(int(hi), int(lo))
        except ValueError as exc:
            raise InvalidNameError(f"invalid transaction id {text!r}: expected COORDINATOR:SEQUENCE") from exc


NO_PRODUCER = -1
NO_SEQUENCE = -1
