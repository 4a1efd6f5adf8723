"""An application's progress: the record its committed units leave in their transactional id's metadata
(PROTOCOL.md "Application transactions", the progress table).

Delta's ``txn`` action is ``(appId, version, lastUpdated)``; txnlog's progress says the same and what a
replay needs besides: the application's mark, the run and the version it reached, the topic it wrote, the
manifest of the unit's staged objects, and the history of runs that committed under the id. It rides on
the PrepareCommit record of the unit's transaction, so the unit's output and its progress are one decision.

The stored names are the protocol's and stay (``sink``, ``query_id``, ``batch_id``, and ``version`` for the
record's format): :class:`Progress` reads and writes them under neutral names (``app``, ``run``,
``version``, ``format``), so the unit's version is never confused with the record's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from txn_core.errors import CorruptDataError
from txn_core.format.declared import FLAG, INT, STR, Codec, Declared, jfield

#: The format of the progress record (stored as ``version``).
PROGRESS_VERSION = 1


def _load_runs(value: Any) -> tuple[tuple[str, int | None], ...]:
    return tuple((str(run), None if version is None else int(version)) for run, version in value)


#: The history of runs, stored as ``[[run, version], ...]`` oldest first (a list: stored JSON sorts the keys
#: of objects), always written, absent from progress written before the history existed.
RUNS = Codec(lambda v: [list(pair) for pair in v], _load_runs)


@dataclass(frozen=True, slots=True)
class Progress(Declared):
    """The progress an application's unit committed under a transactional id (module doc). A unit of a run
    has ``run`` and ``version`` (and ``manifest``); a one-shot write has ``write_id`` and is ``ephemeral``."""

    #: the application's mark: progress with another mark is never taken for this application's
    app: str = jfield(STR, key="sink")
    #: the record's format
    format: int = jfield(INT, PROGRESS_VERSION, key="version")
    #: the topic the unit wrote (every progress ever written names one)
    topic: str | None = jfield(STR, None)
    rows: int = jfield(INT, 0)
    objects: int = jfield(INT, 0)
    #: the run (a Spark query's id) and the version (batch) it reached
    run: str | None = jfield(STR, None, key="query_id")
    version: int | None = jfield(INT, None, key="batch_id")
    #: the unit's manifest: the staged keys it committed, deleted once its cleanup is done
    manifest: str | None = jfield(STR, None)
    write_id: str | None = jfield(STR, None)
    #: a one-shot write's progress: its transactional id may expire
    ephemeral: bool | None = jfield(FLAG, None)
    runs: tuple[tuple[str, int | None], ...] = jfield(RUNS, ())

    @classmethod
    def of(cls, metadata: dict[str, Any] | None, app: str, *, transactional_id: str) -> Progress | None:
        """The progress of application ``app`` in ``metadata`` (a transactional id's last committed
        metadata), or None when the metadata is another application's or none. Metadata with ``app``'s mark
        that does not read as progress is damage: :class:`CorruptDataError` naming the id."""
        if not isinstance(metadata, dict) or metadata.get("sink") != app:
            return None
        try:
            return cls.from_json(metadata)
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptDataError(
                f"transactional id {transactional_id!r}: its last committed metadata carries the mark {app!r} but "
                f"is not that application's progress ({exc}); it was written by something else under the id. "
                "Commit this application under a transactional id of its own"
            ) from exc

    def last_run_version(self) -> int:
        """The version the last run reached (-1: none, a one-shot write)."""
        return -1 if self.version is None else self.version
