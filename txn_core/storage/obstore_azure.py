"""Azure Blob through ``obstore`` (the Rust ``object_store`` crate), from adlfs's options (PROTOCOL.md "Storage").

Why this client for Azure: the conditional create is one request either way (``If-None-Match: *``; Azure answers
a lost race with 409 ``BlobAlreadyExists``), but adlfs (through azure-storage-blob) retries a store that does
not answer for over a minute before it reports anything, with no option to bound it, while object_store's
retries are bounded and configurable; and the round trips of every operation are measured in
``tests/bench_round_trips.py`` (README, "Which client, and why").

The user-facing interface does not change: ``abfs://container/prefix`` URLs and adlfs's ``storage.*`` options.
Translated: ``connection_string`` (its ``AccountName``, ``AccountKey``, ``SharedAccessSignature``,
``BlobEndpoint``, ``DefaultEndpointsProtocol``, ``EndpointSuffix``), ``account_name`` with ``account_key`` or
``sas_token``, ``client_id``/``client_secret``/``tenant_id``, ``anon=true``, ``account_host``, and the
``connection_timeout``/``read_timeout``/``timeout`` seconds. Any other adlfs option, and credentials from the
environment or the machine (no credential among the options, or ``anon=false`` for ``DefaultAzureCredential``),
keep adlfs, which reads them as it always has (:func:`azure_obstore_config` returns None).

The operations and their error classification are :mod:`txn_core.storage.obstore_store`'s.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

from txn_core.errors import ConfigurationError
from txn_core.storage.obstore_store import FSSPEC_ONLY, ObstoreStorage

#: adlfs's timeouts (seconds) and obstore's client options of the same meaning.
_TIMEOUTS = {"connection_timeout": "connect_timeout", "read_timeout": "read_timeout", "timeout": "timeout"}
#: Retries of one request (object_store retries 5xx, throttling and connection errors with backoff): a store
#: that does not answer is reported within seconds, not minutes.
_RETRY = {"max_retries": 3, "retry_timeout": timedelta(seconds=30)}


def azure_obstore_config(options: dict[str, Any]) -> dict[str, Any] | None:
    """The ``AzureStore`` keyword arguments equivalent to adlfs ``options``, or None when some option has no
    obstore equivalent or the credentials would come from the environment (then adlfs serves the URL)."""
    config: dict[str, Any] = {}
    client: dict[str, Any] = {}
    credentials = False
    for name, value in options.items():
        if name in FSSPEC_ONLY:
            continue
        if name == "connection_string":
            config.update(_connection_string(str(value)))
            credentials = True
        elif name in ("account_name", "account_key", "client_id", "client_secret", "tenant_id"):
            config[name] = value
            credentials = credentials or name != "account_name"
        elif name == "sas_token":
            config["sas_key"] = str(value).removeprefix("?")
            credentials = True
        elif name == "anon":
            if not value:
                return None  # DefaultAzureCredential: adlfs's chain
            config["skip_signature"] = True
            credentials = True
        elif name == "account_host":
            config["endpoint"] = f"https://{value}"
        elif name in _TIMEOUTS:
            seconds = _seconds(value, name)
            client[_TIMEOUTS[name]] = timedelta(seconds=seconds)
        else:
            return None
    if not credentials or ("account_name" not in config and not config.get("use_emulator")):
        return None
    if str(config.get("endpoint", "")).startswith("http://"):
        client["allow_http"] = True
    return {"config": config, "client_options": client, "retry_config": dict(_RETRY)}


def _connection_string(text: str) -> dict[str, Any]:
    """AzureStore settings from an Azure Storage connection string (``Key=Value;...``)."""
    fields = {}
    for part in text.split(";"):
        key, sep, value = part.strip().partition("=")
        if sep:
            fields[key.strip().lower()] = value.strip()
    config: dict[str, Any] = {}
    if fields.get("usedevelopmentstorage", "").lower() == "true":
        config["use_emulator"] = True
    if "accountname" in fields:
        config["account_name"] = fields["accountname"]
    if "accountkey" in fields:
        config["account_key"] = fields["accountkey"]
    if "sharedaccesssignature" in fields:
        config["sas_key"] = fields["sharedaccesssignature"].removeprefix("?")
    if "blobendpoint" in fields:
        config["endpoint"] = fields["blobendpoint"].rstrip("/")
    elif "endpointsuffix" in fields and "accountname" in fields:
        protocol = fields.get("defaultendpointsprotocol", "https")
        config["endpoint"] = f"{protocol}://{fields['accountname']}.blob.{fields['endpointsuffix']}"
    if "account_name" not in config and "endpoint" in config:
        # a BlobEndpoint of an emulator names the account in its path: http://127.0.0.1:10000/devstoreaccount1
        path = urlsplit(config["endpoint"]).path.strip("/")
        if path:
            config["account_name"] = path.split("/")[0]
    return config


def _seconds(value: object, name: str) -> float:
    try:
        seconds = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        seconds = -1.0
    if isinstance(value, bool) or not 0 < seconds < 1e9:
        raise ConfigurationError(f"storage option {name} must be a positive number of seconds, got {value!r}")
    return seconds


class ObstoreAzureStorage(ObstoreStorage):
    """A log rooted at ``container/prefix`` of an Azure Blob account (or Azurite), through obstore."""

    scheme = "abfs"

    def describe(self) -> str:
        return f"Azure Blob via obstore ({self.url})"

    def _endpoint(self) -> str | None:
        endpoint = self._kwargs["config"].get("endpoint")
        return str(endpoint) if endpoint else None

    def _build_store(self) -> Any:
        from obstore.store import AzureStore

        kwargs = {**self._kwargs, "config": dict(self._kwargs["config"])}
        return AzureStore(self.bucket, **kwargs)
