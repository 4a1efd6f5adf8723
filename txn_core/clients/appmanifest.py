"""Application transactions' manifests and the cleanup of staged objects (PROTOCOL.md "Application
transactions", steps 3 and 5, and "Staged data").

A unit's **manifest** lists the staged keys its transaction is about to commit. It is written under the
unit's staging prefix before the commit point, and its key rides in the committed progress, so a manifest
named by committed progress lists exactly the committed keys of that unit.

Cleanup never decides anything: the unit is committed (or known uncommitted, after fencing) before any of
these functions runs. A crash at any point leaves unreferenced staged objects (garbage a replay, the next
committer's heal or a sweep removes) and possibly the manifest; it never removes a committed object,
because every deletion keeps the keys the committed manifest lists. Storage failures are logged, not
raised.
"""

from __future__ import annotations

import json
import uuid
from concurrent.futures import Future

from txn_core.clients.appunit import AppVersion
from txn_core.clients.progress import Progress
from txn_core.errors import ObjectNotFoundError, StorageError
from txn_core.logs import get_logger
from txn_core.partition.staging import StagedRef, delete_keys, delete_unreferenced
from txn_core.storage.base import Storage, create_resolving
from txn_core.storage.parallel import parallel_map

logger = get_logger("txnlog.apptxn")

#: staged objects of a unit whose names start with this are its manifests, never data
MANIFEST_PREFIX = "_manifest-"


def manifest_key(unit: AppVersion) -> str:
    return f"{unit.prefix}{MANIFEST_PREFIX}{uuid.uuid4().hex}.json"


def write_manifest(storage: Storage, unit: AppVersion, refs: list[StagedRef], key: str) -> str:
    """Record the keys this unit is about to commit, so that a replay can finish an interrupted cleanup.

    Written before the commit point; its key is part of the committed progress, so a manifest named by
    committed progress lists exactly the committed keys of that unit.
    """
    body = json.dumps(
        {
            "transactional_id": unit.transactional_id,
            "query_id": unit.run_id,
            "batch_id": unit.version,
            "keys": [r.key for r in refs],
        }
    ).encode()
    create_resolving(storage, key, [body], body)
    return key


def manifests(storage: Storage, unit: AppVersion) -> list[str]:
    """Manifests under the unit's prefix. Called only once the unit is known uncommitted (after fencing):
    such a manifest names nothing committed; deleting one at worst leaves garbage for a later cleanup."""
    try:
        return [unit.prefix + n for n in storage.list(unit.prefix) if n.startswith(MANIFEST_PREFIX)]
    except StorageError:
        return []


def read_manifest(storage: Storage, key: str) -> list[str] | None:
    try:
        value = json.loads(storage.read(key))
    except ObjectNotFoundError:
        return None
    return [str(k) for k in value["keys"]]


def cleanup_committed(
    storage: Storage,
    unit: AppVersion,
    refs: list[StagedRef],
    manifest: str | None,
    listing: Future[list[str]] | None = None,
) -> int:
    """After this process's commit of the unit: delete every unreferenced object of its prefix.

    ``listing`` is the prefix's listing taken after the commit point (overlapping the markers); the
    objects it shows that the unit did not commit are failed or duplicate attempts, deleted in parallel,
    then the manifest. Without it the prefix is listed here.
    """
    keep = {r.key for r in refs}
    if manifest is not None:
        keep.add(manifest)
    try:
        if listing is None:
            n = delete_unreferenced(storage, unit.prefix, keep)
        else:
            names = [unit.prefix + name for name in listing.result() if not name.endswith("/")]
            n = len(parallel_map(storage.delete, [k for k in names if k not in keep]))
        if manifest is not None:
            storage.delete(manifest)
        return n
    except StorageError as exc:  # the unit is committed; leftovers are garbage a replay or sweep removes
        logger.warning("cleanup of %s failed after commit: %s", unit.prefix, exc)
        return 0


def cleanup_replay(storage: Storage, unit: AppVersion, progress: Progress | None, refs: list[StagedRef]) -> int:
    """A replayed unit that is already committed: delete this attempt's objects (never committed); if the
    committed attempt's cleanup was interrupted (its manifest still exists), finish it from the manifest."""
    own = [r.key for r in refs]
    manifest = progress.manifest if progress is not None and progress.version == unit.version else None
    if isinstance(manifest, str) and manifest.startswith(unit.prefix):
        try:
            n = finish_from_manifest(storage, manifest)
            if n is not None:
                return n
        except StorageError as exc:
            logger.warning("cleanup of replayed unit %s failed: %s", unit.prefix, exc)
            return 0
    return quiet_delete(storage, own)


def finish_from_manifest(storage: Storage, manifest: str) -> int | None:
    """Finish the interrupted cleanup of the committed unit whose manifest is ``manifest`` (named by the
    id's committed progress): delete every object of its prefix the manifest does not list, then the
    manifest. Objects deleted; None when the manifest is gone (the cleanup had finished)."""
    committed = read_manifest(storage, manifest)
    if committed is None:
        return None
    n = delete_unreferenced(storage, manifest[: manifest.rindex("/") + 1], {*committed, manifest})
    storage.delete(manifest)
    return n


def heal_previous(storage: Storage, previous: Progress | None) -> None:
    """A committer starting from storage (a new process, or after a failure) finishes the cleanup of the
    id's last committed unit if that unit's process died before it: run behind this unit, its failures
    logged."""
    manifest = previous.manifest if previous is not None else None
    if not isinstance(manifest, str):
        return
    try:
        n = finish_from_manifest(storage, manifest)
    except StorageError as exc:
        logger.warning("cleanup of the committed unit of %s failed: %s", manifest, exc)
        return
    if n is not None:
        logger.info("finished the interrupted cleanup of the committed unit of %s (%d objects)", manifest, n)


def quiet_delete(storage: Storage, keys: list[str]) -> int:
    try:
        return delete_keys(storage, keys)
    except StorageError as exc:
        logger.warning("could not delete %d uncommitted staged objects: %s", len(keys), exc)
        return 0
