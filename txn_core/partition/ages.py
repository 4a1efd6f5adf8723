"""How old an object must be before maintenance may delete it (PROTOCOL.md "Stale writers").

A writer in another process keeps its partition's tail in mind for up to ``TAIL_RECHECK_S``; an entry
deleted younger than twice that may be appended to again where readers have passed. Every deletion that
takes a minimum age (retention, the cleanup after a roll, a subscription's trim) refuses one below the safe
floor unless told that no other process writes (:func:`check_min_age_of`).
"""

from __future__ import annotations

from txn_core.errors import ConfigurationError
from txn_core.partition.partition import TAIL_RECHECK_S

#: The least ``min_age_ms`` retention and rolling accept (unless told not to check): twice the age at which
#: a writer re-checks its cached tail (``partition.TAIL_RECHECK_S``). Below it a writer in another process
#: can append into a slot just deleted: the entry is created again where readers have passed, so committed
#: records are skipped and the slot's offsets no longer match (PROTOCOL.md "Stale writers").
SAFE_ENTRY_AGE_MS = 2 * int(TAIL_RECHECK_S * 1000)

#: What a too young minimum age risks, for most maintenance.
_STALE_WRITER_RISK = (
    "a writer in another process may still append at a slot it deletes, and readers would then skip "
    "committed records or see a fenced producer's write"
)


def check_min_age_of(
    what: str,
    min_age_ms: int,
    floor_ms: int,
    flag: str | None = "check_min_age=False",
    risk: str = _STALE_WRITER_RISK,
    when: str = "no other process writes to the log",
) -> None:
    """Refuse a ``min_age_ms`` below ``floor_ms``, naming the risk and the two ways out (Delta Lake's VACUUM
    refuses a retention under its safety bound the same way)."""
    if min_age_ms >= floor_ms:
        return
    way_out = f", or pass {flag} only while {when}" if flag else ""
    raise ConfigurationError(
        f"{what}: a minimum age of {min_age_ms} ms is below the safe {floor_ms} ms "
        f"({floor_ms // 60_000} min): {risk}. Use at least {floor_ms} ms{way_out}"
    )
