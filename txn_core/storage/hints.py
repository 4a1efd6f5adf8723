"""What a failed object-store request tells the user: the likely mistake and its fix.

Setting a log up on an object store fails in a few ways, each answered by the client with an error that names
neither the mistake nor the fix (a 404 on a listing, a 403 on a read, "error sending request" after ten retries):

* the bucket does not exist (a typo in the URL, or not created yet): S3 code ``NoSuchBucket``, Azure's
  ``ContainerNotFound`` (gcsfs names no code: its caller knows from the request);
* the credentials are wrong: ``SignatureDoesNotMatch`` (secret), ``InvalidAccessKeyId`` (key),
  ``InvalidToken``/``ExpiredToken`` (session token); Azure's ``AuthenticationFailed``;
* no credentials at all (object_store then asks the cloud's instance metadata address, and reports its
  refusal);
* nothing answers at the endpoint (a wrong ``endpoint_url``, a store that is down).

:func:`hint` returns a sentence naming the cause and the fix, put before the client's own message. It is a
hint only: whether a write was lost, may be retried or has an unknown outcome is decided by the error's type
and response codes (:mod:`txn_core.storage.obstore_s3`, :mod:`txn_core.storage.objectstore`), never here.
A hint reads the error's text as well as its codes, because obstore reports S3's error code only in the
message (the response body it quotes).
"""

from __future__ import annotations

from collections.abc import Iterator

from txn_core.storage.urls import redact_url

#: Error codes meaning the bucket (container) does not exist: S3's, Azure's.
_NO_BUCKET = ("NoSuchBucket", "ContainerNotFound")
#: Error codes meaning the credentials themselves were refused (not a missing permission): S3's, then Azure's
#: (a wrong account key fails its signature check, a wrong SAS token its authentication).
_BAD_CREDENTIALS = (
    "SignatureDoesNotMatch",
    "InvalidAccessKeyId",
    "InvalidToken",
    "ExpiredToken",
    "AuthenticationFailed",
    "AuthorizationFailure",
    "Server failed to authenticate the request",
)
#: What the clients say when they found no credentials (botocore; object_store falls back to the cloud's
#: instance metadata address, whose refusal is then all its error shows).
_NO_CREDENTIALS = ("NoCredentialsError", "Unable to locate credentials", "169.254.169.254")
#: What the clients say when no connection could be made (botocore; object_store/reqwest, whose generic
#: "error sending request" also covers timeouts and connections reset mid-request, which are not this; aiohttp
#: under gcsfs and adlfs).
_NO_CONNECTION = (
    "EndpointConnectionError",
    "ConnectTimeoutError",
    "kind: Connect,",
    "ConnectError(",
    "ClientConnectorError",
    "Cannot connect to host",
)


def causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the errors it was raised from (``__cause__``, else ``__context__``), each once: clients
    such as s3fs keep the error with the response as the cause of the one they raise."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        yield cur
        cur = cur.__cause__ or cur.__context__


def _text(exc: BaseException) -> str:
    """Type names and messages of ``exc`` and its causes, and the response error codes (botocore's, Azure's)."""
    parts: list[str] = []
    for cur in causes(exc):
        parts.append(f"{type(cur).__name__}: {cur}")
        response = getattr(cur, "response", None)
        if isinstance(response, dict):
            parts.append(str(response.get("Error", {}).get("Code", "")))
        error_code = getattr(cur, "error_code", None)
        if error_code:
            parts.append(str(getattr(error_code, "value", error_code)))
    return "\n".join(parts)


class _Words:
    """How one store's setup is named in a hint: its URL form, where credentials and the endpoint go."""

    def __init__(self, bucket: str, url: str, credentials: str, no_credentials: str, endpoint: str) -> None:
        self.bucket, self.url, self.credentials, self.no_credentials, self.endpoint = (
            bucket,
            url,
            credentials,
            no_credentials,
            endpoint,
        )


_WORDS = {
    "s3": _Words(
        "bucket",
        "s3://BUCKET/PREFIX",
        "check the key, secret and token passed as storage options, or the environment's AWS credentials",
        "pass key and secret as storage options, set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, run where the "
        "cloud provides instance credentials, or pass anon=true for a public bucket",
        "storage option endpoint_url or client_kwargs.endpoint_url",
    ),
    "gs": _Words(
        "bucket",
        "gs://BUCKET/PREFIX",
        "check the token storage option (a service-account JSON file, google_default or cloud) or "
        "GOOGLE_APPLICATION_CREDENTIALS",
        "pass token (a service-account JSON file) as a storage option, or set GOOGLE_APPLICATION_CREDENTIALS",
        "storage option endpoint_url",
    ),
    "abfs": _Words(
        "container",
        "abfs://CONTAINER/PREFIX",
        "check account_name with account_key or sas_token, or connection_string, passed as storage options, or "
        "the AZURE_STORAGE_* environment variables",
        "pass account_name with account_key or sas_token, or connection_string, as storage options",
        "the connection string's BlobEndpoint, or storage option account_host",
    ),
}


def hint(exc: BaseException, bucket: str, endpoint: str | None, scheme: str = "s3", *, no_bucket: bool = False) -> str:
    """A sentence (ending in ": ") naming the likely cause of ``exc`` and its fix, or "" when none is known.

    ``bucket`` is the URL's bucket (container); ``endpoint`` the configured endpoint URL (None: the provider's);
    ``scheme`` the URL's (``s3``, ``gs``, ``abfs``: the words of the store's own settings). ``no_bucket``: the
    caller knows from the request that the bucket is missing (a create answered "not found": gcsfs names no
    code)."""

    text = _text(exc)
    words = _WORDS.get(scheme, _WORDS["s3"])
    where = f"at {redact_url(endpoint)}" if endpoint else "at the store"
    if no_bucket or any(code in text for code in _NO_BUCKET):
        return (
            f"{words.bucket} {bucket!r} does not exist {where}: create it, or correct the {words.bucket} name in "
            f"the log URL ({words.url}): "
        )
    if any(code in text for code in _BAD_CREDENTIALS):
        return f"the credentials were rejected (a wrong key or secret, or an expired token): {words.credentials}: "
    if any(sign in text for sign in _NO_CREDENTIALS):
        return f"no credentials were found: {words.no_credentials}: "
    if any(sign in text for sign in _NO_CONNECTION):
        return (
            f"nothing answered {where}: check the endpoint ({words.endpoint}) and that the store is running and "
            "reachable: "
        )
    return ""
