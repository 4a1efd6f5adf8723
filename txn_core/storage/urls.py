"""Log URLs as they may be shown: without credentials."""

from __future__ import annotations

from urllib.parse import urlsplit

__all__ = ["redact_url"]


def redact_url(url: str) -> str:
    """``url`` without any user-info part (credentials are never logged)."""
    parts = urlsplit(url)
    if parts.username or parts.password:
        host = parts.hostname or ""
        if parts.port:
            host += f":{parts.port}"
        return parts._replace(netloc=host).geturl()
    return url
