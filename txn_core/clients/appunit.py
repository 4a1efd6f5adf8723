"""The unit of an application transaction and the rules its progress follows (PROTOCOL.md "Application
transactions"): what a unit is (:class:`AppVersion`), its scope (one topic: :func:`scoped_transactional_id`),
and what the progress of its transactional id says of it: committed (a replay), new, or not to be committed
(out of scope, or the id taken over by another run). Committing a unit is :mod:`txn_core.clients.apptxn`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from typing import Any

from txn_core.clients.progress import PROGRESS_VERSION, Progress
from txn_core.errors import AppScopeError, ConfigurationError, TransactionalIdTakenOverError
from txn_core.partition.staging import StagedRef, staging_prefix

#: The progress mark of applications that use the core API directly.
APP_MARK = "txnlog-app"
#: Runs a transactional id's progress remembers (:meth:`AppVersion.taken_over`): an earlier run beyond them
#: counts as a new one again.
RUN_HISTORY = 16


def scoped_transactional_id(app_id: str, topic: str) -> str:
    """The transactional id under which application ``app_id`` commits its units to ``topic`` (PROTOCOL.md
    "Application transactions", scope): ``<app_id>.<topic>``; when that is longer than a name may be (200),
    the first 150 characters of ``app_id``, ``.h-`` and 40 hex digits of SHA-256 over ``app_id``, a NUL byte
    and ``topic``. Two (application, topic) pairs may meet on one id only through names built to collide
    (``a.b`` + ``c``, ``a`` + ``b.c``): the progress names its topic, so they are refused, never confused."""
    scoped = f"{app_id}.{topic}"
    if len(scoped) <= 200:
        return scoped
    digest = hashlib.sha256(f"{app_id}\0{topic}".encode()).hexdigest()[:40]
    return f"{app_id[:150]}.h-{digest}"


@dataclass(frozen=True, slots=True)
class AppVersion:
    """One unit of an application's work: its transactional id, the application mark its progress carries,
    and either a ``(run_id, version)`` (a replayable stream of units) or a one-shot ``write_id``.

    **Scope.** As Delta scopes ``(appId, version)`` to each table, a unit is scoped to the topic it writes
    (PROTOCOL.md "Application transactions", scope): an application that writes version ``N`` to two topics
    commits it once to each. A unit built without a ``topic`` names the *application*: the commit to a
    topic uses :meth:`for_topic`, whose transactional id is :func:`scoped_transactional_id` of the two. A
    unit built with a ``topic`` commits under exactly its ``transactional_id`` (a Spark query's id, or one
    a user chose); such an id named for a second topic by the same run is refused (:class:`AppScopeError`)
    instead of a version of the other topic being taken for this one's.

    Versions of one run must only grow; a new run (a new ``run_id``) starts its versions afresh, and its
    first unit takes the id over: the runs that committed under the id before (the last
    :data:`RUN_HISTORY`, named in the progress) may not commit under it from then on (:meth:`taken_over`),
    since the replay check reads the last run's version only and their replays would go unseen.
    """

    transactional_id: str
    app: str = APP_MARK
    run_id: str | None = None
    version: int | None = None
    write_id: str | None = None
    #: The topic the unit writes; None: not bound yet (the unit names an application, see :meth:`for_topic`).
    topic: str | None = None
    #: The application id :meth:`for_topic` scoped ``transactional_id`` from: its progress is read once, when
    #: the scoped id has none, for units committed before units were scoped (``_progress``).
    scoped_from: str | None = None

    def for_topic(self, topic: str) -> AppVersion:
        """This unit as it commits to ``topic``: itself when bound to ``topic`` already, else a unit under the
        transactional id scoped to ``topic``. A unit bound to another topic is refused (a caller's mistake)."""
        if self.topic is not None:
            if self.topic != topic:
                raise ConfigurationError(
                    f"unit {self.staging_batch} of transactional id {self.transactional_id!r} is bound to topic "
                    f"{self.topic!r} and cannot commit to {topic!r}: build it without a topic (AppVersion(app_id, "
                    "...)) to commit the same version to several topics, once to each"
                )
            return self
        return AppVersion(
            scoped_transactional_id(self.transactional_id, topic),
            self.app,
            self.run_id,
            self.version,
            self.write_id,
            topic=topic,
            scoped_from=self.transactional_id,
        )

    @property
    def staging_batch(self) -> str:
        """The unit's staging batch name: unique per (run, version) or per one-shot write."""
        if self.write_id is not None:
            return self.write_id
        return f"{self.run_id}.{self.version}"

    @property
    def prefix(self) -> str:
        """Where the unit's staged objects (and its manifest) live: under its transactional id, so a unit bound
        to no topic has none yet (stage under ``unit.for_topic(topic).prefix``)."""
        if self.topic is None:
            raise ConfigurationError(
                f"unit {self.staging_batch} of application {self.transactional_id!r} is bound to no topic, and "
                "its staged objects live under the transactional id of the topic it writes: use "
                "unit.for_topic(topic).prefix"
            )
        return staging_prefix(self.transactional_id, self.staging_batch)

    def read_progress(self, metadata: dict[str, Any] | None, transactional_id: str | None = None) -> Progress | None:
        """This application's progress in ``metadata``, the last committed metadata of ``transactional_id``
        (default: the unit's); None when it is another application's or none (:meth:`Progress.of`)."""
        return Progress.of(metadata, self.app, transactional_id=transactional_id or self.transactional_id)

    def committed_by(self, progress: Progress | None) -> bool:
        """Whether ``progress`` (this application's, of the unit's transactional id) shows this unit committed.
        Progress of another topic never does (:meth:`out_of_scope` refuses the cases it cannot tell)."""
        if progress is None or progress.app != self.app:
            return False
        if self.topic is not None and progress.topic != self.topic:
            return False
        if self.write_id is not None:
            return progress.write_id == self.write_id
        if progress.run != self.run_id:
            return False  # another run used this transactional id last: its versions are not ours
        return progress.last_run_version() >= int(self.version or 0)

    def out_of_scope(self, progress: Progress | None, source: str | None = None) -> AppScopeError | None:
        """The error for a unit whose fate ``progress`` cannot tell: the same run's version at or above this
        one committed to *another* topic. Whether this unit was committed to its own topic before that
        commit is unknown (the progress keeps the last commit only), so committing might commit it twice and
        skipping it might lose it. None when the unit is new or a replay. ``source``: the transactional id
        the progress is of, when not this unit's (the application id a scoped id fell back to)."""
        if self.topic is None or self.write_id is not None or progress is None or progress.app != self.app:
            return None
        other = progress.topic
        if other == self.topic or progress.run != self.run_id:
            return None
        last = progress.last_run_version()
        if last < int(self.version or 0):
            return None  # a version the run has not reached: new, whatever topic it writes
        if source is not None and source != self.transactional_id:
            holder = (
                f"application id {source!r}, under which versions were committed before they were counted per "
                f"topic, last committed version {last} of this run to topic {other!r}"
            )
            fix = (
                f"If version {self.version} never reached {self.topic!r} (an earlier txnlog skipped the second "
                "topic of a fan-out as a replay of the first), commit it under a new application id"
            )
        else:
            holder = f"the id's last commit is version {last} of this run to topic {other!r}"
            fix = (
                "Give each topic its own transactional id: leave the id to txnlog (a Spark write without the "
                "transactionalId option, AppVersion without a topic), which scopes an application id per topic. "
                f"If the topic changed while version {last} was in flight, write to {other!r} until it is past, "
                "then switch"
            )
        return AppScopeError(
            f"transactional id {self.transactional_id!r}: version {self.version} of run {self.run_id!r} writes "
            f"topic {self.topic!r}, but {holder}. Versions are counted per topic, and this one cannot be told "
            f"committed to {self.topic!r} or not. Nothing was committed. {fix}",
            transactional_id=self.transactional_id,
            topic=self.topic,
            other_topic=str(other),
            version=last,
        )

    def taken_over(self, progress: Progress | None) -> TransactionalIdTakenOverError | None:
        """The error for a unit that may not commit under its transactional id: ``progress`` (the id's last
        committed metadata, this application's) is not this run's, and this run committed under the id
        before (the ``runs`` history names it). Another run, or a one-shot write, then took the id over
        since this run's last commit, and this run's replays could no longer be told from new units (the
        replay check reads the last commit only): committing might commit a unit twice. A run the history
        does not name may take an id over (sequential reuse)."""
        if self.write_id is not None or progress is None or progress.app != self.app:
            return None
        other = progress.run
        if other == self.run_id or str(self.run_id) not in dict(progress.runs):
            return None
        last = f"run {other!r}'s version {progress.version}" if other is not None else "a one-shot write"
        return TransactionalIdTakenOverError(
            f"transactional id {self.transactional_id!r}: run {self.run_id!r} may not commit its version "
            f"{self.version}: the id's last commit is {last}. The id was taken over since this run's last "
            "commit, and this run's replays could no longer be recognised. A transactional id belongs to one "
            "run at a time: stop the other run, or give each its own id. This attempt committed nothing "
            "(whether the version was committed before cannot be told).",
            transactional_id=self.transactional_id,
            other_run=str(other) if other is not None else "a one-shot write",
            other_version=progress.last_run_version(),
        )

    def progress(
        self, topic: str, refs: list[StagedRef], manifest: str | None, previous: Progress | None = None
    ) -> Progress:
        """The progress committed with this unit (PROTOCOL.md "Application transactions", progress table);
        ``previous``, the id's progress before it, hands on the history of runs (a one-shot write hands it
        on unchanged)."""
        history = previous.runs if previous is not None and previous.app == self.app else ()
        unit = Progress(self.app, PROGRESS_VERSION, topic, rows=sum(r.rows for r in refs), objects=len(refs))
        if self.write_id is not None:
            # a one-shot write is never replayed: its id may expire
            return replace(unit, write_id=self.write_id, ephemeral=True, runs=history)
        earlier = [(r, v) for r, v in history if r != str(self.run_id)]
        runs = (*earlier[-(RUN_HISTORY - 1) :], (str(self.run_id), self.version))
        return replace(unit, run=self.run_id, version=self.version, manifest=manifest, runs=runs)
