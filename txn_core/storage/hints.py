"""What a failed object-store request tells the user: the likely mistake and its fix.

Setting a log up on S3 fails in a few ways, each answered by the client with an error that names neither the
mistake nor the fix (a 404 on a listing, a 403 on a read, "error sending request" after ten retries):

* the bucket does not exist (a typo in the URL, or not created yet): S3 code ``NoSuchBucket``;
* the credentials are wrong: ``SignatureDoesNotMatch`` (secret), ``InvalidAccessKeyId`` (key),
  ``InvalidToken``/``ExpiredToken`` (session token);
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

#: S3 error codes meaning the credentials themselves were refused (not a missing permission).
_BAD_CREDENTIALS = ("SignatureDoesNotMatch", "InvalidAccessKeyId", "InvalidToken", "ExpiredToken")
#: What the clients say when they found no credentials (botocore; object_store falls back to the cloud's
#: instance metadata address, whose refusal is then all its error shows).
_NO_CREDENTIALS = ("NoCredentialsError", "Unable to locate credentials", "169.254.169.254")
#: What the clients say when no connection could be made (botocore; object_store/reqwest, whose generic
#: "error sending request" also covers timeouts and connections reset mid-request, which are not this).
_NO_CONNECTION = ("EndpointConnectionError", "ConnectTimeoutError", "kind: Connect,", "ConnectError(")


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
    """Type names and messages of ``exc`` and its causes, and botocore's response error codes."""
    parts: list[str] = []
    for cur in causes(exc):
        parts.append(f"{type(cur).__name__}: {cur}")
        response = getattr(cur, "response", None)
        if isinstance(response, dict):
            parts.append(str(response.get("Error", {}).get("Code", "")))
    return "\n".join(parts)


def hint(exc: BaseException, bucket: str, endpoint: str | None) -> str:
    """A sentence (ending in ": ") naming the likely cause of ``exc`` and its fix, or "" when none is known.

    ``bucket`` is the URL's bucket; ``endpoint`` the configured endpoint URL (None: the provider's)."""

    text = _text(exc)
    where = f"at {redact_url(endpoint)}" if endpoint else "at the store"
    if "NoSuchBucket" in text:
        return (
            f"bucket {bucket!r} does not exist {where}: create it, or correct the bucket name in the log URL "
            "(s3://BUCKET/PREFIX): "
        )
    if any(code in text for code in _BAD_CREDENTIALS):
        return (
            "the credentials were rejected (a wrong key or secret, or an expired token): check the key, secret "
            "and token passed as storage options, or the environment's AWS credentials: "
        )
    if any(sign in text for sign in _NO_CREDENTIALS):
        return (
            "no credentials were found: pass key and secret as storage options, set AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY, run where the cloud provides instance credentials, or pass anon=true for a "
            "public bucket: "
        )
    if any(sign in text for sign in _NO_CONNECTION):
        return (
            f"nothing answered {where}: check the endpoint (storage option endpoint_url or "
            "client_kwargs.endpoint_url) and that the store is running and reachable: "
        )
    return ""
