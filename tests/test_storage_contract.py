"""The storage contract, proven the same way on every backend (local disk, memory, moto, SeaweedFS; S3 through
obstore and through s3fs; GCS on fake-gcs-server through gcsfs; Azure Blob on Azurite through obstore and
through adlfs)."""

from __future__ import annotations

import logging
import multiprocessing as mp
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import workers

from conftest import make_location
from txn_core.errors import (
    ObjectExistsError,
    ObjectNotFoundError,
    RetryableStorageError,
    StorageContractError,
    UnknownOutcomeError,
)
from txn_core.storage import MemoryStorage, Storage, create_resolving, open_storage, redact_url, self_test_storage
from txn_core.storage.base import Chunks, DelegatingStorage
from txn_core.storage.local import LocalStorage
from txn_core.storage.objectstore import ObjectStoreStorage, classify_write_error


@pytest.fixture(
    params=[
        "local",
        "local-named",
        "memory",
        "moto",
        "moto-fsspec",
        pytest.param("seaweedfs", marks=pytest.mark.seaweedfs),
        pytest.param("seaweedfs-fsspec", marks=pytest.mark.seaweedfs),
        pytest.param("gcs", marks=pytest.mark.gcs),
        pytest.param("azure", marks=pytest.mark.azure),
        pytest.param("azure-fsspec", marks=pytest.mark.azure),
    ]
)
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Storage:
    """Every backend; S3 and Azure through both clients (obstore by default, s3fs or adlfs with
    ``client='fsspec'``); local disk also through named temporary files (filesystems without ``O_TMPFILE``)."""
    backend, _, client = str(request.param).partition("-")
    location = make_location(backend, request, tmp_path)
    if client == "named":
        storage = LocalStorage(str(tmp_path / "log"))
        storage._unnamed = False
        return storage
    options = location.storage_options
    if client:
        assert options is not None  # a server's endpoint and keys
        options = {**options, "client": client}
    return open_storage(location.url, options)


def test_create_is_exclusive_and_keeps_the_first_content(storage: Storage) -> None:
    storage.create("a/b/one", [b"first-", b"content"])
    with pytest.raises(ObjectExistsError):
        storage.create("a/b/one", [b"second"])
    assert storage.read("a/b/one") == b"first-content"
    assert storage.exists("a/b/one")
    assert not storage.exists("a/b/two")


def test_read_ranges_and_missing_objects(storage: Storage) -> None:
    storage.create("r/x", [bytes(range(100))])
    assert storage.read("r/x", 10, 20) == bytes(range(10, 20))
    assert storage.read("r/x", 0, 1000) == bytes(range(100))
    with pytest.raises(ObjectNotFoundError):
        storage.read("r/missing")
    with pytest.raises(ObjectNotFoundError):
        storage.read("r/missing", 0, 10)


def test_list_returns_sorted_children_with_prefixes_marked(storage: Storage) -> None:
    for key in ("l/b", "l/a", "l/sub/c", "l/sub/d", "other/e"):
        storage.create(key, [b"x"])
    assert storage.list("l/") == ["a", "b", "sub/"]
    assert storage.list("l/sub/") == ["c", "d"]
    assert storage.list("nothing/here/") == []


def test_a_listing_page_is_the_first_names_and_says_whether_more_follow(storage: Storage) -> None:
    for i in range(5):
        storage.create(f"p/{i:020d}", [b"x"])
    names = [f"{i:020d}" for i in range(5)]
    first = storage.list_page("p/", 2)
    if first is None:  # s3fs lists every page: the caller lists everything instead (gcsfs and adlfs do not)
        inner = storage.inner if isinstance(storage, DelegatingStorage) else storage
        assert isinstance(inner, ObjectStoreStorage) and inner.protocol == "s3"
        return
    assert first == (names[:2], False)
    assert storage.list_page("p/", 5) == (names, True) or storage.list_page("p/", 5) == (names, False)
    assert storage.list_page("p/", 6) == (names, True)
    assert storage.list_page("nothing/here/", 3) == ([], True)
    storage.create("p/00000000000000000002x/inner", [b"x"])  # a sub-prefix counts as one name, in order
    assert storage.list_page("p/", 4) == ([*names[:3], "00000000000000000002x/"], False)


def test_delete_is_idempotent(storage: Storage) -> None:
    storage.create("d/x", [b"x"])
    storage.delete("d/x")
    storage.delete("d/x")
    assert not storage.exists("d/x")
    storage.create("d/x", [b"again"])  # a deleted key can be created again
    assert storage.read("d/x") == b"again"


def test_empty_object_is_complete(storage: Storage) -> None:
    storage.create("e/empty", [b""])
    assert storage.read("e/empty") == b""
    assert storage.exists("e/empty")


def test_thread_race_has_exactly_one_winner_per_key(storage: Storage) -> None:
    keys = [f"race/{i}" for i in range(20)]
    wins: dict[str, list[int]] = {k: [] for k in keys}
    lock = threading.Lock()

    def run(worker: int) -> None:
        for k in keys:
            try:
                storage.create(k, [f"w{worker}".encode() * 100])
            except ObjectExistsError:
                continue
            with lock:
                wins[k].append(worker)

    threads = [threading.Thread(target=run, args=(w,)) for w in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k, w in wins.items():
        assert len(w) == 1, f"{k} won by {w}"
        assert storage.read(k) == f"w{w[0]}".encode() * 100


def test_two_creates_in_flight_together_on_the_s3_test_server_have_one_winner(
    moto_s3: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race the thread test above meets only by chance, forced: the first create is held inside the
    server's store step while the second arrives. moto checks absence and stores without a lock between, so
    both won and the second replaced the first (tests/servers.py makes its creates atomic); exactly one of two
    creates in flight together may succeed, on any server the suite trusts."""
    from moto.s3.models import S3Backend

    store = S3Backend.put_object
    entered = threading.Event()

    def held(self: Any, bucket: str, key: str, value: Any, *args: Any, **kwargs: Any) -> Any:
        if key.endswith("held/k") and not entered.is_set():
            entered.set()
            time.sleep(0.3)
        return store(self, bucket, key, value, *args, **kwargs)

    monkeypatch.setattr(S3Backend, "put_object", held)
    storage = open_storage(f"s3://{moto_s3.new_bucket()}/c", moto_s3.storage_options())
    outcome: dict[str, str] = {}

    def create(name: str) -> None:
        try:
            storage.create("held/k", [name.encode()])
            outcome[name] = "won"
        except ObjectExistsError:
            outcome[name] = "lost"

    first = threading.Thread(target=create, args=("first",))
    first.start()
    assert entered.wait(10)
    create("second")
    first.join()
    assert sorted(outcome.values()) == ["lost", "won"], outcome
    winner = next(n for n, o in outcome.items() if o == "won")
    assert storage.read("held/k") == winner.encode()


def test_multiprocess_race_has_exactly_one_winner_per_key(shared_location: Any) -> None:
    """Many processes create the same keys: exactly one winner each, contents intact."""
    keys = [f"mp/{i:03d}" for i in range(40)]
    ctx = mp.get_context("spawn")
    start_at = time.time() + 3.0
    with ctx.Pool(6) as pool:
        results = pool.starmap(
            workers.race_creates,
            [(shared_location.url, shared_location.storage_options, w, keys, start_at) for w in range(6)],
        )
    storage = open_storage(shared_location.url, shared_location.storage_options)
    for key in keys:
        winners = [w for w, won in enumerate(results) if key in won]
        assert len(winners) == 1, f"{key}: winners {winners}"
        expected = f"worker={winners[0]};key={key};".encode() * 200
        assert storage.read(key) == expected


# --- resolving unknown outcomes -----------------------------------------------------------------


class Flaky(DelegatingStorage):
    """Wraps a storage; the n-th create fails in a chosen way (landed or not)."""

    def __init__(self, inner: Storage, fail: list[tuple[str, bool]]) -> None:
        super().__init__(inner)
        self.fail = list(fail)

    def create(self, key: str, chunks: Chunks) -> None:
        if self.fail:
            kind, landed = self.fail.pop(0)
            if landed:
                self.inner.create(key, chunks)
            raise {"unknown": UnknownOutcomeError, "retry": RetryableStorageError}[kind](f"injected {kind}")
        self.inner.create(key, chunks)


def test_unknown_outcome_that_landed_is_recognised_as_ours() -> None:
    inner = MemoryStorage("resolve-landed")
    s = Flaky(inner, [("unknown", True)])
    create_resolving(s, "k", [b"ID-1234", b"payload"], b"ID-1234")
    assert inner.read("k") == b"ID-1234payload"


def test_unknown_outcome_that_did_not_land_is_retried() -> None:
    inner = MemoryStorage("resolve-not-landed")
    s = Flaky(inner, [("unknown", False), ("retry", False)])
    create_resolving(s, "k", [b"ID-9", b"x"], b"ID-9")
    assert inner.read("k") == b"ID-9x"


def test_unknown_outcome_where_another_writer_won_reports_lost_race() -> None:
    inner = MemoryStorage("resolve-other")
    inner.create("k", [b"ID-other"])
    s = Flaky(inner, [("unknown", False)])
    with pytest.raises(ObjectExistsError):
        create_resolving(s, "k", [b"ID-mine"], b"ID-mine")
    assert inner.read("k") == b"ID-other"


def test_unresolvable_outcome_raises_unknown_and_deletes_nothing() -> None:
    inner = MemoryStorage("resolve-never")
    s = Flaky(inner, [("unknown", False)] * 10)
    with pytest.raises(UnknownOutcomeError, match="could not learn whether"):
        create_resolving(s, "k", [b"ID"], b"ID", attempts=3)


# --- the start-up self-test and error normalisation -----------------------------------------


class Overwriting(MemoryStorage):
    def create(self, key: str, chunks: Chunks) -> None:
        self.delete(key)
        super().create(key, chunks)


def test_self_test_refuses_a_backend_that_silently_overwrites() -> None:
    with pytest.raises(StorageContractError, match="silently overwrote"):
        self_test_storage(Overwriting("overwriter"))


def test_self_test_passes_on_a_conforming_backend(storage: Storage) -> None:
    self_test_storage(storage)
    assert storage.list("_txnlog/selftest/") == []


class _BotoLikeError(Exception):
    def __init__(self, status: int, code: str) -> None:
        super().__init__(f"An error occurred ({code})")
        self.response = {"ResponseMetadata": {"HTTPStatusCode": status}, "Error": {"Code": code}}


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (FileExistsError("exists"), ObjectExistsError),
        (_BotoLikeError(412, "PreconditionFailed"), ObjectExistsError),
        (_BotoLikeError(409, "ConditionalRequestConflict"), RetryableStorageError),
        (_BotoLikeError(503, "SlowDown"), RetryableStorageError),
        (TimeoutError("read timed out"), UnknownOutcomeError),
        (ConnectionResetError("reset"), UnknownOutcomeError),
    ],
)
def test_write_errors_are_normalised(exc: BaseException, kind: type) -> None:
    assert classify_write_error(exc) is kind


@pytest.mark.parametrize("slot", ["00000000000000000412", "00000000000000000503", "00000000000000000409"])
def test_a_timeout_on_a_slot_whose_number_looks_like_a_status_stays_unknown(slot: str) -> None:
    """Keys end in zero-padded slot numbers: only a real status makes a lost race or a retry. The status
    comes from the response on the error (or its cause), never from the message text: a message that merely
    mentions a code decides nothing (unknown: the object is read back)."""
    exc = TimeoutError(f"timed out creating log/topics/t/00000/log/{slot}")
    assert classify_write_error(exc) is UnknownOutcomeError
    assert classify_write_error(OSError(5, f"Input/output error: bucket/log/{slot} (412)")) is UnknownOutcomeError
    for status, kind in ((412, ObjectExistsError), (503, RetryableStorageError), (500, RetryableStorageError)):
        wrapped = OSError(5, f"Input/output error: bucket/log/{slot}")
        wrapped.__cause__ = _BotoLikeError(status, f"failed on bucket/log/{slot}")
        assert classify_write_error(wrapped) is kind, (slot, status)


def test_412_wrapped_as_oserror_is_a_lost_race() -> None:
    wrapped = OSError(22, "Invalid argument")
    wrapped.__cause__ = _BotoLikeError(412, "PreconditionFailed")
    assert classify_write_error(wrapped) is ObjectExistsError


def test_credentials_never_appear_in_urls_or_descriptions() -> None:
    assert redact_url("s3://AKIA:SECRET@bucket/prefix") == "s3://bucket/prefix"
    s = open_storage("s3://bucket/prefix", {"key": "AKIA", "secret": "SECRET"}, self_test=False)
    assert "SECRET" not in s.describe() and "SECRET" not in repr(s)


def test_bad_urls_are_refused_with_a_clear_message() -> None:
    from txn_core.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="unsupported scheme 'ftp'"):
        open_storage("ftp://host/x")
    with pytest.raises(ConfigurationError, match="empty"):
        open_storage("")
    with pytest.raises(ConfigurationError, match="no bucket"):
        open_storage("s3:///prefix")


def test_storage_options_of_a_local_log_are_refused_unless_a_dict_and_else_warned_of_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A job written for an object store keeps its options when pointed at a local path (the README's S3 job
    runs so in its test): they are ignored, with one warning naming them, so a misspelled one is not silent."""
    from txn_core.errors import ConfigurationError
    from txn_core.storage import factory

    with pytest.raises(ConfigurationError, match="must be a dict"):
        open_storage(str(tmp_path / "log"), "endpoint_url=http://x")  # type: ignore[arg-type]
    factory._WARNED_LOCAL.clear()
    with caplog.at_level(logging.WARNING, logger="txnlog.storage"):
        for _ in range(2):
            open_storage(str(tmp_path / "log"), {"endpoint_ulr": "http://x", "anon": True})
            open_storage(f"memory://{uuid.uuid4().hex}", {"endpoint_ulr": "http://x", "anon": True})
    warned = [r.getMessage() for r in caplog.records if "do not apply" in r.getMessage()]
    assert len(warned) == 1, warned
    assert "'anon', 'endpoint_ulr'" in warned[0] and "ignored" in warned[0]


#: An environment whose S3 settings do not work: only the storage options can reach the server.
HOSTILE_S3_ENV = {
    "AWS_ACCESS_KEY_ID": "not-the-key",
    "AWS_SECRET_ACCESS_KEY": "not-the-secret",
    "AWS_SESSION_TOKEN": "not-a-token",
    "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
    "AWS_ENDPOINT_URL_S3": "http://127.0.0.1:9",
}


@pytest.mark.parametrize("client", ["obstore", "fsspec"])
def test_storage_options_win_over_the_environment(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, client: str
) -> None:
    """Keys and an endpoint given as options are used alone: an endpoint, keys or a session token in the
    environment (a shell set up for another account or store) change nothing."""
    location = make_location("moto", request, tmp_path)
    for name, value in HOSTILE_S3_ENV.items():
        monkeypatch.setenv(name, value)
    assert location.storage_options is not None
    storage = open_storage(location.url, {**location.storage_options, "client": client}, self_test=False)
    storage.create("env/one", [b"content"])
    assert storage.read("env/one") == b"content"
    assert storage.list("env/") == ["one"]


def test_a_write_the_store_refused_every_time_certainly_did_not_land() -> None:
    """Retries are bounded; when every attempt was refused ("retry": 409, 429, 5xx) the error says the
    write did not land (RetryableStorageError), which is not the unknown outcome of a timeout."""
    inner = MemoryStorage("resolve-refused")
    s = Flaky(inner, [("retry", False)] * 10)
    with pytest.raises(RetryableStorageError, match="did not land") as info:
        create_resolving(s, "k", [b"ID"], b"ID", attempts=3)
    assert not isinstance(info.value, UnknownOutcomeError)
    assert not inner.exists("k")
