"""Setting a log up on S3 wrong gets an error naming the mistake and its fix (txn_core.storage.hints).

A missing bucket, wrong credentials and an endpoint where nothing answers, through both S3 clients (obstore,
the default, and s3fs with ``client='fsspec'``): moto in-process for the bucket, no server at all for the
endpoint, SeaweedFS (which checks signatures; moto does not) for the credentials.
"""

from __future__ import annotations

import socket
import uuid
from typing import Any

import pyarrow as pa
import pytest

import txn_core
from txn_core.errors import ConfigurationError, StorageError, StoragePermissionError
from txn_core.format.paths import has_log
from txn_core.storage import open_storage
from txn_core.storage.hints import hint

SCHEMA = pa.schema([("id", pa.int64())])
CLIENTS = ["auto", "fsspec"]

pytestmark = pytest.mark.s3


def _set_up(url: str, options: dict[str, Any]) -> None:
    """What a new user does first: open a log and create a topic."""
    txn_core.open_log(url, options).create_topic("t", 1, SCHEMA)


def _with_endpoint(options: dict[str, Any], endpoint: str) -> dict[str, Any]:
    return {**options, "client_kwargs": {**options["client_kwargs"], "endpoint_url": endpoint}}


@pytest.mark.parametrize("client", CLIENTS)
def test_a_missing_bucket_is_named_with_the_fix(moto_s3: Any, client: str) -> None:
    bucket = f"typo-{uuid.uuid4().hex[:8]}"
    with pytest.raises(StorageError) as info:
        _set_up(f"s3://{bucket}/log", {**moto_s3.storage_options(), "client": client})
    message = str(info.value)
    assert f"bucket {bucket!r} does not exist at {moto_s3.endpoint}" in message, message
    assert "create it, or correct the bucket name" in message


def test_a_reader_told_of_no_log_hears_of_a_missing_bucket_instead(moto_s3: Any) -> None:
    """A reader (Spark, the CLI) checks the log exists before reading: a lookup of one object cannot tell a
    missing bucket from a missing log, so a missing one is confirmed by listing, which can."""
    bucket = f"typo-{uuid.uuid4().hex[:8]}"
    for client in CLIENTS:  # s3fs lists a missing bucket as "not found", like an empty prefix
        options = {**moto_s3.storage_options(), "client": client}
        storage = open_storage(f"s3://{bucket}/log", options, self_test=False)
        with pytest.raises(StorageError, match=f"bucket {bucket!r} does not exist"):
            has_log(storage)
        empty = open_storage(f"s3://{moto_s3.new_bucket()}/log", options, self_test=False)
        assert not has_log(empty)


def test_a_misspelt_client_kwargs_option_is_refused_naming_the_right_one(moto_s3: Any) -> None:
    options = {**moto_s3.storage_options(), "client_kwargs": {"endpoint": moto_s3.endpoint}}
    with pytest.raises(ConfigurationError, match=r"client_kwargs\.'endpoint' \(did you mean 'endpoint_url'\?\)"):
        txn_core.open_log(f"s3://{moto_s3.new_bucket()}/log", options)


@pytest.mark.parametrize("client", CLIENTS)
def test_an_endpoint_where_nothing_answers_is_named_with_the_fix(moto_s3: Any, client: str) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    options = {**_with_endpoint(moto_s3.storage_options(), dead), "client": client}
    with pytest.raises(StorageError) as info:
        _set_up(f"s3://{moto_s3.new_bucket()}/log", options)
    message = str(info.value)
    assert f"nothing answered at {dead}: check the endpoint" in message, message


@pytest.mark.seaweedfs
@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("wrong", [{"secret": "not-the-secret"}, {"key": "nobody"}])
def test_wrong_credentials_are_refused_with_a_hint(seaweed_s3: Any, client: str, wrong: dict[str, str]) -> None:
    options = {**seaweed_s3.storage_options(), **wrong, "client": client}
    with pytest.raises(StorageError) as info:
        _set_up(f"s3://{seaweed_s3.new_bucket()}/log-{uuid.uuid4().hex[:8]}", options)
    message = str(info.value)
    if client == "auto":  # obstore quotes S3's error code; s3fs's refused HEAD carries no body to tell by
        assert isinstance(info.value, StoragePermissionError)
        assert "the credentials were rejected" in message, message
    else:  # s3fs raises PermissionError for other 403s too (archived object, skewed clock): not a permission error
        assert "refused (HTTP 403): check the credentials" in message, message


class _ClientError(Exception):
    """botocore's ClientError in outline: the S3 error code in ``response``, not in the message."""

    def __init__(self, code: str) -> None:
        super().__init__("An error occurred")
        self.response = {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": 403}}


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (_ClientError("SignatureDoesNotMatch"), "the credentials were rejected"),
        (_ClientError("InvalidAccessKeyId"), "the credentials were rejected"),
        (_ClientError("AccessDenied"), ""),  # a real want of permission: the caller's own words
        (OSError("<Error><Code>NoSuchBucket</Code></Error>"), "bucket 'b' does not exist at http://e"),
        (OSError("HTTP error: error sending request ... HttpError { kind: Connect, source"), "nothing answered at"),
        (OSError("HTTP error: error sending request ... HttpError { kind: Request, source"), ""),  # reset, timeout
        (OSError("Error performing PUT http://169.254.169.254/latest/api/token"), "no credentials were found"),
        (OSError("slot 00000000000000000404 is broken"), ""),
    ],
)
def test_hints_read_codes_and_messages_along_the_cause_chain(exc: BaseException, expected: str) -> None:
    try:
        try:
            raise exc
        except Exception as inner:
            raise StorageError("wrapped") from inner
    except StorageError as outer:
        got = hint(outer, "b", "http://e")
    assert got.startswith(expected) if expected else got == ""


def test_a_hint_never_repeats_credentials_of_an_endpoint_url() -> None:
    got = hint(OSError("ConnectError(tcp connect error)"), "b", "http://user:hunter2@127.0.0.1:9")
    assert got.startswith("nothing answered at http://127.0.0.1:9:") and "hunter2" not in got


def test_botocore_timeouts_bound_a_stalled_store_and_keep_the_one_round_trip_client() -> None:
    """s3fs's ``config_kwargs`` timeouts and retries map to obstore's: a store that accepts connections and
    never answers fails a request after the read timeout instead of holding it for minutes, and the option
    no longer makes the default client give way to s3fs (two round trips per create)."""
    from txn_core.storage.obstore_s3 import ObstoreS3Storage, obstore_config

    options = {
        "key": "k",
        "secret": "s",
        "client_kwargs": {"endpoint_url": "http://127.0.0.1:1"},
        "config_kwargs": {"connect_timeout": "2", "read_timeout": 1.5, "retries": {"max_attempts": "0"}},
    }
    kwargs = obstore_config(options)
    assert kwargs is not None
    assert kwargs["client_options"]["read_timeout"].total_seconds() == 1.5
    assert kwargs["client_options"]["connect_timeout"].total_seconds() == 2
    assert kwargs["retry_config"] == {"max_retries": 0}
    assert obstore_config({**options, "config_kwargs": {"read_timeout": "soon"}}) is None  # s3fs decides then
    assert obstore_config({**options, "config_kwargs": {"signature_version": "s3v4"}}) is None

    with socket.socket() as server:  # accepts connections, never answers
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        endpoint = f"http://127.0.0.1:{server.getsockname()[1]}"
        stalled = {**options, "client_kwargs": {"endpoint_url": endpoint}}
        storage = open_storage("s3://bucket/log", stalled, self_test=False)
        assert isinstance(storage, ObstoreS3Storage)
        with pytest.raises(StorageError, match=r"timed out|timeout|Timeout"):
            storage.read("_txnlog/format")


def test_config_kwargs_given_as_text_reach_either_client_as_numbers(moto_s3: Any) -> None:
    """Spark options and the CLI's -o give every value as text; botocore compared them with numbers and
    failed with a TypeError at the first request whenever s3fs served the URL."""
    from txn_core.storage.objectstore import ObjectStoreStorage
    from txn_core.storage.obstore_s3 import obstore_config

    text = {"connect_timeout": "2", "read_timeout": "5", "retries": {"max_attempts": "9", "total_max_attempts": "3"}}
    options = {**moto_s3.storage_options(), "config_kwargs": text, "client": "fsspec"}
    storage = open_storage(f"s3://{moto_s3.new_bucket()}/log", options, self_test=False)
    assert isinstance(storage, ObjectStoreStorage)
    typed = storage._options["config_kwargs"]
    assert typed == {
        "connect_timeout": 2.0,
        "read_timeout": 5.0,
        "retries": {"max_attempts": 9, "total_max_attempts": 3},
    }
    assert not has_log(storage)  # requests go out with them (was: TypeError from botocore)
    kwargs = obstore_config({**moto_s3.storage_options(), "config_kwargs": typed})
    assert kwargs is not None and kwargs["retry_config"] == {
        "max_retries": 2
    }  # total_max_attempts wins, as in botocore
    for bad in ({"read_timeout": "soon"}, {"read_timeout": "inf"}, {"connect_timeout": "0"}, {"read_timeout": True}):
        with pytest.raises(ConfigurationError, match=r"config_kwargs\.\w+_timeout"):
            open_storage("s3://b/log", {**moto_s3.storage_options(), "config_kwargs": bad}, self_test=False)
    with pytest.raises(ConfigurationError, match=r"client_kwargs\.'config'.*config_kwargs"):
        open_storage("s3://b/log", {**moto_s3.storage_options(), "client_kwargs": {"config": {}}}, self_test=False)
