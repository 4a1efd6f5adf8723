"""S3 through ``obstore`` (the Rust ``object_store`` crate): one round trip per request (PROTOCOL.md "Storage").

Why this client for S3: measured through a proxy that adds 25 ms per round trip in front of SeaweedFS, a
create-if-absent of 200 bytes costs 1 round trip with obstore and 2 with boto3/s3fs (botocore waits for
``100 Continue`` before sending a body), a whole-object read 1 against 2 (s3fs's ``cat_file``), and every
txnlog operation is a chain of such requests. s3fs stays the client for options obstore cannot express
(:func:`obstore_config` returns None), and for ``gs://`` and ``abfs://``.

The user-facing interface does not change: ``s3://bucket/prefix`` URLs and s3fs-style ``storage.*``
options (``key``, ``secret``, ``token``, ``anon``, ``endpoint_url``, ``client_kwargs.endpoint_url``,
``client_kwargs.region_name``, and ``config_kwargs.connect_timeout``/``read_timeout``/``retries``, the
botocore settings that bound a stalled store); ``client`` picks the library (``auto``, ``obstore``,
``fsspec``). Credentials from an AWS config profile (``AWS_PROFILE``, ``~/.aws/credentials``), which
object_store does not read, keep s3fs unless keys are given. Options win over the environment, as with
s3fs: an endpoint given as an option is used whatever ``AWS_ENDPOINT_URL_S3`` says, and keys given as
options are used alone (no session token or other credential from the environment is mixed in).

The operations and their error classification are :mod:`txn_core.storage.obstore_store`'s.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

from txn_core.storage.obstore_store import FSSPEC_ONLY, ObstoreStorage


def obstore_config(options: dict[str, Any]) -> dict[str, Any] | None:
    """The ``S3Store`` keyword arguments equivalent to s3fs ``options``, or None when some option has no
    obstore equivalent (then s3fs serves the URL, and every option keeps its s3fs meaning)."""
    config: dict[str, Any] = {}
    client: dict[str, Any] = {}
    retry: dict[str, Any] = {}
    for name, value in options.items():
        if name in FSSPEC_ONLY:
            continue
        if name == "key":
            config["access_key_id"] = value
        elif name == "secret":
            config["secret_access_key"] = value
        elif name == "token":
            config["session_token"] = value
        elif name == "anon":
            if value:
                config["skip_signature"] = True
        elif name == "endpoint_url":
            config["endpoint"] = value
        elif name == "client_kwargs" and isinstance(value, dict):
            for k, v in value.items():
                if k == "endpoint_url":
                    config["endpoint"] = v
                elif k == "region_name":
                    config["region"] = v
                else:
                    return None
        elif name == "config_kwargs" and isinstance(value, dict):
            if not _botocore_timeouts(value, client, retry):
                return None
        else:
            return None
    if "access_key_id" not in config and not config.get("skip_signature") and _profile_credentials():
        return None  # credentials from an AWS profile: botocore reads those, object_store does not
    endpoint = str(config.get("endpoint", ""))
    if endpoint.startswith("http://"):
        client["allow_http"] = True
    if endpoint and "region" not in config:
        config["region"] = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    kwargs: dict[str, Any] = {"config": config, "client_options": client}
    if retry:
        kwargs["retry_config"] = retry
    return kwargs


def _botocore_timeouts(config_kwargs: dict[str, Any], client: dict[str, Any], retry: dict[str, Any]) -> bool:
    """Put s3fs's ``config_kwargs`` (botocore's ``Config``) timeouts and retries into obstore's client and retry
    options; False if any key has no equivalent. ``connect_timeout`` and ``read_timeout`` (seconds; a read
    timeout bounds each read of a response, as in botocore) keep a stalled store from holding a request for
    long; ``retries.max_attempts`` (retries after the first attempt) or ``retries.total_max_attempts`` bound
    how often a timed-out request is tried again (obstore's default: 10 times within 3 minutes)."""
    for key, value in config_kwargs.items():
        if key in ("connect_timeout", "read_timeout"):
            seconds = _seconds(value)
            if seconds is None:
                return False
            client[key] = timedelta(seconds=seconds)
        elif key == "retries" and isinstance(value, dict):
            if set(value) - {"max_attempts", "total_max_attempts", "mode"}:  # mode: obstore has one, with backoff
                return False
            total, retries = _count(value.get("total_max_attempts")), _count(value.get("max_attempts"))
            if total is not None and total >= 1:  # botocore: it wins over max_attempts
                retry["max_retries"] = total - 1
            elif retries is not None:
                retry["max_retries"] = retries
            elif "total_max_attempts" in value or "max_attempts" in value:
                return False
        else:
            return False
    return True


def _seconds(value: object) -> float | None:
    """A positive, finite number of seconds (Spark and the CLI pass option values as text), else None."""
    try:
        seconds = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return seconds if 0 < seconds < 1e9 and not isinstance(value, bool) else None


def _count(value: object) -> int | None:
    """A whole number >= 0 (or its text), else None (None too)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        n = int(str(value))
    except ValueError:
        return None
    return n if n >= 0 else None


def _static_credentials(config: dict[str, Any]) -> dict[str, Any] | None:
    """Keys given as options, taken out of ``config`` as a static credential (or None without keys).

    Passed as a credential provider, they are used alone, as s3fs uses explicit keys: a session token or
    other credentials in the environment (``AWS_SESSION_TOKEN``, a web identity) are not mixed in, which
    object_store's own configuration would do."""
    if "access_key_id" not in config:
        return None
    return {
        "access_key_id": config.pop("access_key_id"),
        "secret_access_key": config.pop("secret_access_key", ""),
        "token": config.pop("session_token", None),
        "expires_at": None,
    }


def _profile_credentials() -> bool:
    """Whether this process would take S3 credentials from an AWS config profile (``AWS_PROFILE``, or
    ``~/.aws/credentials`` / ``~/.aws/config`` with no ``AWS_ACCESS_KEY_ID`` in the environment)."""
    if os.environ.get("AWS_PROFILE") or os.environ.get("AWS_DEFAULT_PROFILE"):
        return True
    if os.environ.get("AWS_ACCESS_KEY_ID"):
        return False
    files = [
        os.environ.get("AWS_SHARED_CREDENTIALS_FILE") or os.path.expanduser("~/.aws/credentials"),
        os.environ.get("AWS_CONFIG_FILE") or os.path.expanduser("~/.aws/config"),
    ]
    return any(os.path.exists(f) for f in files)


def obstore_available() -> bool:
    try:
        import obstore  # noqa: F401
    except ImportError:  # pragma: no cover - a dependency; absent only in a broken install
        return False
    return True


class ObstoreS3Storage(ObstoreStorage):
    """A log rooted at ``bucket/prefix`` on S3 (or an S3-compatible server), through obstore."""

    scheme = "s3"

    def describe(self) -> str:
        return f"S3 via obstore ({self.url})"

    def _endpoint(self) -> str | None:
        endpoint = self._kwargs["config"].get("endpoint")
        return str(endpoint) if endpoint else None

    def _build_store(self) -> Any:
        from obstore.store import S3Store

        kwargs = {**self._kwargs, "config": dict(self._kwargs["config"])}
        if "endpoint" in kwargs["config"]:
            # object_store lets AWS_ENDPOINT_URL_S3 from the environment override a configured endpoint
            # (obstore 0.12): set it under that name too, so the option wins
            kwargs["config"]["aws_endpoint_url_s3"] = kwargs["config"]["endpoint"]
        credential = _static_credentials(kwargs["config"])
        if credential is not None:
            kwargs["credential_provider"] = lambda: credential
        return S3Store(self.bucket, **kwargs)
