"""The storage contract and its backends (PROTOCOL.md section "Storage"), and overlapping independent
requests (``parallel``).

The lowest layer: may import only ``errors``, ``clock`` and ``logs``."""

from txn_core.storage.base import Storage, create_resolving
from txn_core.storage.factory import open_storage, self_test_storage
from txn_core.storage.local import LocalStorage
from txn_core.storage.memory import MemoryStorage
from txn_core.storage.objectstore import ObjectStoreStorage
from txn_core.storage.urls import redact_url

__all__ = [
    "LocalStorage",
    "MemoryStorage",
    "ObjectStoreStorage",
    "Storage",
    "create_resolving",
    "open_storage",
    "redact_url",
    "self_test_storage",
]
