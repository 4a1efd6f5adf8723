"""GCS and Azure Blob as a new user meets them: the options fsspec documents, on each cloud's emulator.

* a reader reads every committed row and writes only snapshots; with a SAS token that may only read and list
  (Azure), it writes nothing and writing is refused;
* the mistakes users make are errors naming the problem and the fix, within seconds: a missing bucket or
  container, rejected credentials, an endpoint where nothing answers, a misspelled option;
* which client serves which options (the translation of adlfs's options for obstore), without a server.

GCS's emulator checks no credentials (fake-gcs-server accepts any token), so rejected credentials are shown
on Azure only.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
import pytest
from emulators import AZURITE_ACCOUNT, AZURITE_KEY, AzuriteBlob, Emulator, FakeGcs
from latency_proxy import LatencyProxy
from test_read_only import make_log, read_everything

import txn_core
from txn_core.errors import ConfigurationError, StorageError, StoragePermissionError
from txn_core.storage import ObjectStoreStorage, open_storage
from txn_core.storage.obstore_azure import ObstoreAzureStorage, azure_obstore_config

SCHEMA = pa.schema([("id", pa.int64())])


def _dead_endpoint() -> str:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def _names(emulator: Emulator, bucket: str, prefix: str) -> list[str]:
    """Every object name under ``prefix``, asked of the emulator itself (not through txnlog)."""
    if isinstance(emulator, AzuriteBlob):
        container = emulator.service().get_container_client(bucket)
        return sorted(b.name for b in container.list_blobs(name_starts_with=prefix))
    import gcsfs.core

    fs = gcsfs.core.GCSFileSystem(**emulator.storage_options(), skip_instance_cache=True, use_listings_cache=False)
    return sorted(fs.find(f"{bucket}/{prefix}"))


@pytest.fixture(params=[pytest.param("gcs", marks=pytest.mark.gcs), pytest.param("azure", marks=pytest.mark.azure)])
def emulator(request: pytest.FixtureRequest) -> Emulator:
    server: Emulator = request.getfixturevalue({"gcs": "fake_gcs", "azure": "azurite"}[request.param])
    if server.shared_bucket is None:
        server.shared_bucket = server.new_bucket()
    return server


def test_a_reader_reads_every_committed_row_and_writes_only_snapshots(emulator: Emulator) -> None:
    """A reader that may write leaves snapshots for later readers (PROTOCOL.md "Reading never writes"), nothing
    else; a mistyped prefix opened for reading is an error that creates nothing."""
    bucket = emulator.shared_bucket
    assert bucket is not None
    prefix = f"ro-{uuid.uuid4().hex[:8]}"
    url = f"{emulator.scheme}://{bucket}/{prefix}"
    make_log(url, emulator.storage_options())
    before = _names(emulator, bucket, prefix)
    assert read_everything(url, emulator.storage_options()) == list(range(11)), "committed only, every one"
    added = sorted(set(_names(emulator, bucket, prefix)) - set(before))
    assert all("/snapshots/" in name for name in added), added
    typo = txn_core.open_log(f"{url}-typo", emulator.storage_options(), create=False)  # the format is read behind
    with pytest.raises(ConfigurationError, match="no txnlog at"):
        typo.consumer().assign([("t", 0)])
    assert _names(emulator, bucket, f"{prefix}-typo") == []


@pytest.mark.azure
@pytest.mark.parametrize("client", ["auto", "fsspec"])
def test_a_read_only_sas_token_reads_fully_and_writing_is_refused(azurite: AzuriteBlob, client: str) -> None:
    from azure.storage.blob import ContainerSasPermissions, generate_container_sas

    bucket = azurite.new_bucket()
    url = f"abfs://{bucket}/ro"
    make_log(url, azurite.storage_options())
    sas = generate_container_sas(
        AZURITE_ACCOUNT,
        bucket,
        account_key=AZURITE_KEY,
        permission=ContainerSasPermissions(read=True, list=True),
        expiry=datetime.now(UTC) + timedelta(hours=1),
    )
    reader = {
        "connection_string": f"BlobEndpoint={azurite.endpoint}/{AZURITE_ACCOUNT};SharedAccessSignature={sas}",
        "client": client,
    }
    before = _names(azurite, bucket, "ro")
    assert read_everything(url, reader) == list(range(11))
    assert _names(azurite, bucket, "ro") == before, "reading wrote nothing"
    with txn_core.open_log(url, reader, create=False) as log, pytest.raises(StoragePermissionError):
        producer = log.producer()
        producer.send("t", pa.table({"id": [1]}, schema=SCHEMA), partition=0)
        producer.flush()


def _set_up(url: str, options: dict[str, Any]) -> None:
    """What a new user does first: open a log and create a topic."""
    txn_core.open_log(url, options).create_topic("t", 1, SCHEMA)


def test_a_fresh_consumer_learns_each_partitions_tail_from_one_listing(
    emulator: Emulator, caplog: pytest.LogCaptureFixture
) -> None:
    """ISSUE 34 item 1 on GCS and Azure as on S3: a fresh consumer lists each partition's entries with one
    request of one page, reads every listed entry at once and checks only the slot past them; it never
    probes slots further on (which a store that cannot list one page would make it do: 19 reads past the end
    of an 18-entry partition)."""
    bucket = emulator.shared_bucket
    assert bucket is not None
    _reads_the_tail_from_one_listing(f"{emulator.scheme}://{bucket}", emulator.storage_options(), caplog)


@pytest.mark.azure
def test_through_adlfs_a_fresh_consumer_learns_each_partitions_tail_from_one_listing(
    azurite: AzuriteBlob, caplog: pytest.LogCaptureFixture
) -> None:
    """The same through adlfs (credentials from the environment take it): its ``ls`` reads every page and walks
    every sub-prefix, so the store lists one page through the Azure SDK beneath it."""
    bucket = azurite.new_bucket()
    _reads_the_tail_from_one_listing(f"abfs://{bucket}", {**azurite.storage_options(), "client": "fsspec"}, caplog)


def _reads_the_tail_from_one_listing(root: str, options: dict[str, Any], caplog: pytest.LogCaptureFixture) -> None:
    url = f"{root}/tail-{uuid.uuid4().hex[:8]}"
    with txn_core.open_log(url, options) as log:
        log.create_topic("t", 1, SCHEMA)
        producer = log.producer("writer", marker_linger_ms=0)  # markers alone: 18 entries, as counted below
        producer.init_transactions()
        for i in range(9):  # 18 entries: a data entry and a marker each
            producer.begin_transaction()
            producer.send("t", pa.table({"id": [i]}, schema=SCHEMA), partition=0)
            producer.commit_transaction()
        producer.close()
    caplog.set_level(logging.DEBUG, logger="txnlog.storage.requests")
    with txn_core.open_log(url, options, create=False) as log:
        consumer = log.consumer()
        consumer.assign([("t", 0)])
        ids: list[int] = []
        while (batch := consumer.poll()).num_rows:
            ids.extend(batch.column("id").to_pylist())
    assert ids == list(range(9))
    requests = [r.getMessage().split() for r in caplog.records if r.name == "txnlog.storage.requests"]
    lists = [words[1] for words in requests if words[0] == "list" and words[1].endswith("/00000/log/")]
    assert len(lists) == 1, requests
    slots = sorted(
        {int(words[1].rsplit("/", 1)[1]) for words in requests if words[0] == "read" and "/log/" in words[1]}
    )
    assert slots == list(range(19)), f"slots read: {slots} (18 entries and the slot past them)"


def test_a_missing_bucket_is_named_with_the_fix(emulator: Emulator) -> None:
    bucket = f"typo-{uuid.uuid4().hex[:8]}"
    word = "container" if emulator.scheme == "abfs" else "bucket"
    with pytest.raises(StorageError) as info:
        _set_up(f"{emulator.scheme}://{bucket}/log", emulator.storage_options())
    message = str(info.value)
    assert f"{word} {bucket!r} does not exist" in message, message
    assert f"create it, or correct the {word} name in the log URL ({emulator.scheme}://" in message, message
    storage = open_storage(f"{emulator.scheme}://{bucket}/log", emulator.storage_options(), self_test=False)
    with pytest.raises(StorageError, match=f"{word} {bucket!r} does not exist"):  # a reader's first listing
        storage.list("_txnlog/")


@pytest.mark.azure
@pytest.mark.parametrize("client", ["auto", "fsspec"])
def test_a_wrong_account_key_is_named_with_the_fix(azurite: AzuriteBlob, client: str) -> None:
    wrong = azurite.connection_string.replace(AZURITE_KEY, "A" * 86 + "==")
    with pytest.raises(StorageError) as info:
        _set_up(f"abfs://{azurite.new_bucket()}/log", {"connection_string": wrong, "client": client})
    message = str(info.value)
    assert "the credentials were rejected" in message, message
    assert "account_key or sas_token, or connection_string" in message, message


#: How long a user waits to learn that nothing answers at the endpoint: Azure through obstore gives up after
#: 3 retries (about 2 s); gcsfs, whose 6 retries with backoff (about 35 s) cannot be configured, is stopped at
#: the first failed connection to an endpoint that never answered (ObjectStoreStorage._unanswered_trace).
ANSWER_WITHIN_S = {"abfs": 15.0, "gs": 15.0}


def test_an_endpoint_where_nothing_answers_is_named_with_the_fix(emulator: Emulator) -> None:
    dead = _dead_endpoint()
    if isinstance(emulator, FakeGcs):
        options = {**emulator.storage_options(), "endpoint_url": dead}
        where = "storage option endpoint_url"
    else:
        options = {
            "connection_string": emulator.storage_options()["connection_string"].replace(emulator.endpoint, dead)
        }
        where = "the connection string's BlobEndpoint"
    started = time.monotonic()
    with pytest.raises(StorageError) as info:
        _set_up(f"{emulator.scheme}://{emulator.shared_bucket}/log", options)
    took = time.monotonic() - started
    message = str(info.value)
    assert "nothing answered at" in message and where in message, message
    assert took < ANSWER_WITHIN_S[emulator.scheme], f"{took:.1f}s of silent retries"


class _ProxyAt(LatencyProxy):
    """A proxy with no delay, listening on a given port (0: any free one)."""

    def __init__(self, target_port: int, port: int = 0) -> None:
        super().__init__("127.0.0.1", target_port, 0.0)
        self.port = port

    async def _serve(self) -> int:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)
        return int(self._server.sockets[0].getsockname()[1])


def test_an_adls_gen2_directory_blob_lists_as_the_sub_prefix_it_stands_for() -> None:
    """On a hierarchical namespace, List Blobs gives a directory as a prefix and as an empty blob marked
    ``hdi_isfolder`` (some accounts capitalise it; adlfs also writes ``is_directory``): each is ``name/``."""
    from types import SimpleNamespace

    from txn_core.storage.objectstore import _azure_name

    assert _azure_name(SimpleNamespace(name="p/topics/")) == "p/topics/"  # a BlobPrefix
    for key in ("hdi_isfolder", "Hdi_isfolder", "is_directory"):
        assert _azure_name(SimpleNamespace(name="p/topics", metadata={key: "true"})) == "p/topics/"
    assert _azure_name(SimpleNamespace(name="p/format", metadata={"is_directory": "false"})) == "p/format"
    assert _azure_name(SimpleNamespace(name="p/format", metadata=None)) == "p/format"


@pytest.mark.gcs
def test_a_gcs_endpoint_that_answered_once_is_retried_when_it_drops(fake_gcs: FakeGcs) -> None:
    """Only an endpoint that never answered fails at its first refused connection; once it has answered, a
    refused connection is a blip that gcsfs's retries ride out (here: the store is gone for half a second)."""
    bucket = fake_gcs.new_bucket()
    first = _ProxyAt(fake_gcs.port).start()
    options = {**fake_gcs.storage_options(), "endpoint_url": first.endpoint}
    storage = open_storage(f"gs://{bucket}/blip", options, self_test=False)
    storage.create("k", [b"v"])
    first.stop()
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(storage.read("k")), daemon=True)
    reader.start()  # its first connection is refused; gcsfs retries after 1-2 s
    time.sleep(0.5)
    second = _ProxyAt(fake_gcs.port, first.port).start()  # on this thread: a failure to bind fails the test
    try:
        reader.join(30)
        assert got == [b"v"]
    finally:
        second.stop()


@pytest.mark.parametrize(
    ("url", "options", "meant"),
    [
        ("gs://b/p", {"endpoint": "http://127.0.0.1:1"}, "endpoint_url"),
        ("gs://b/p", {"tokn": "anon"}, "token"),
        ("abfs://c/p", {"conection_string": "AccountName=a"}, "connection_string"),
        ("abfs://c/p", {"account_nme": "a", "account_key": "k"}, "account_name"),
    ],
)
def test_a_misspelled_option_is_refused_naming_the_right_one(url: str, options: dict[str, Any], meant: str) -> None:
    """gcsfs and adlfs accept any keyword and drop what they do not know: unchecked, a misspelled endpoint sent
    the requests to the cloud's own endpoint."""
    with pytest.raises(ConfigurationError, match=rf"did you mean '{meant}'\?"):
        open_storage(url, options, self_test=False)


def test_azure_options_with_credentials_go_to_obstore_and_the_environment_to_adlfs() -> None:
    emulator = (
        f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
        f"BlobEndpoint=http://127.0.0.1:10000/{AZURITE_ACCOUNT};"
    )
    config = azure_obstore_config({"connection_string": emulator})
    assert config is not None
    assert config["config"] == {
        "account_name": AZURITE_ACCOUNT,
        "account_key": AZURITE_KEY,
        "endpoint": f"http://127.0.0.1:10000/{AZURITE_ACCOUNT}",
    }
    assert config["client_options"] == {"allow_http": True}
    cloud = azure_obstore_config(
        {"connection_string": "AccountName=acct;AccountKey=k;EndpointSuffix=core.chinacloudapi.cn"}
    )
    assert cloud is not None and cloud["config"]["endpoint"] == "https://acct.blob.core.chinacloudapi.cn"
    sas = azure_obstore_config({"account_name": "acct", "sas_token": "?sv=1&sig=x"})
    assert sas is not None and sas["config"] == {"account_name": "acct", "sas_key": "sv=1&sig=x"}
    assert azure_obstore_config({"account_name": "acct"}) is None, "credentials from the environment: adlfs"
    assert azure_obstore_config({"account_name": "acct", "anon": False}) is None, "DefaultAzureCredential: adlfs"
    assert azure_obstore_config({"account_name": "acct", "account_key": "k", "location_mode": "secondary"}) is None
    assert isinstance(open_storage("abfs://c/p", {"connection_string": emulator}, self_test=False), ObstoreAzureStorage)
    assert isinstance(open_storage("abfs://c/p", {"account_name": "acct"}, self_test=False), ObjectStoreStorage)
    fsspec = open_storage("abfs://c/p", {"connection_string": emulator, "client": "fsspec"}, self_test=False)
    assert isinstance(fsspec, ObjectStoreStorage)
    with pytest.raises(ConfigurationError, match="must be a positive number of seconds"):
        azure_obstore_config({"connection_string": emulator, "read_timeout": "soon"})


def _drop_the_condition(monkeypatch: pytest.MonkeyPatch, emulator: Emulator, client: str) -> None:
    """Make the client send a create-if-absent as a plain upload, as a client library that drops the condition
    does (gcsfs before 2025.7 ignored ``mode='create'``): the emulator then overwrites, as it should."""
    if isinstance(emulator, FakeGcs):
        import gcsfs.core

        pipe = gcsfs.core.GCSFileSystem._pipe_file

        async def gcs_overwrite(self: Any, path: str, data: bytes, **kwargs: Any) -> Any:
            return await pipe(self, path, data, **{**kwargs, "mode": "overwrite"})

        monkeypatch.setattr(gcsfs.core.GCSFileSystem, "_pipe_file", gcs_overwrite)
    elif client == "fsspec":
        import adlfs

        pipe = adlfs.AzureBlobFileSystem.pipe_file  # adlfs declares its own sync wrapper

        def adlfs_overwrite(self: Any, path: str, data: bytes, **kwargs: Any) -> Any:
            return pipe(self, path, data, **{**kwargs, "mode": "overwrite"})

        monkeypatch.setattr(adlfs.AzureBlobFileSystem, "pipe_file", adlfs_overwrite)
    else:
        import obstore

        put = obstore.put
        monkeypatch.setattr(obstore, "put", lambda store, path, data, **kwargs: put(store, path, data))


@pytest.mark.parametrize(
    ("store", "client"),
    [
        pytest.param("gcs", "auto", marks=pytest.mark.gcs),  # gcsfs, GCS's one client
        pytest.param("azure", "auto", marks=pytest.mark.azure),  # obstore
        pytest.param("azure", "fsspec", marks=pytest.mark.azure),  # adlfs
    ],
)
def test_the_self_test_refuses_a_store_that_overwrites_and_names_the_setting(
    request: pytest.FixtureRequest, store: str, client: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The emulators honour the condition (the storage contract suite proves it); with the condition dropped on
    the way, they overwrite, and the self-test refuses the store before anything of txnlog's is written, saying
    which condition and which client setting to use."""
    from txn_core.errors import StorageContractError

    emulator: Emulator = request.getfixturevalue({"gcs": "fake_gcs", "azure": "azurite"}[store])
    if emulator.shared_bucket is None:
        emulator.shared_bucket = emulator.new_bucket()
    _drop_the_condition(monkeypatch, emulator, client)
    url = f"{emulator.scheme}://{emulator.shared_bucket}/overwrite-{uuid.uuid4().hex[:8]}"
    with pytest.raises(StorageContractError, match="silently overwrote") as info:
        _set_up(url, {**emulator.storage_options(), "client": client})
    message = str(info.value)
    if isinstance(emulator, FakeGcs):
        assert "(ifGenerationMatch=0)" in message and "gcsfs >= 2025.7.0" in message, message
    else:
        assert "(If-None-Match: *)" in message and "adlfs >= 2025.7.0" in message and "obstore" in message, message
    assert _names(emulator, str(emulator.shared_bucket), url.split("/", 3)[3]) == [], "nothing was left"
