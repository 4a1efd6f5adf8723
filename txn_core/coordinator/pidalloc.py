"""Producer ids, unique across processes (PROTOCOL.md "Producer ids").

Ids are handed out in blocks of :data:`BLOCK_SIZE`: block ``n`` is the object
``_txnlog/producer-ids/<020d n>``, created with create-if-absent, and covers ids
``[n * BLOCK_SIZE, (n + 1) * BLOCK_SIZE)``. A process claims the first free block (found with
:meth:`SlotLog.find_tail`) and serves ids from it until it runs out. Two processes can never claim the
same block, so ids never repeat. Blocks are never deleted.
"""

from __future__ import annotations

import os
import socket
import threading

from txn_core.clock import Clock
from txn_core.errors import ObjectExistsError
from txn_core.format import envelope, paths
from txn_core.format.slotlog import SlotLog
from txn_core.storage.base import Storage, create_resolving

BLOCK_SIZE = 256

_lock = threading.Lock()
_blocks: dict[tuple[str, int], tuple[int, int]] = {}  # (url, os pid) -> (next id, end)
_hint: dict[str, int] = {}


def allocate_producer_id(storage: Storage, *, clock: Clock) -> int:
    """A producer id no other producer of this log has had or will have (``clock`` stamps a new block)."""
    key = (storage.url, os.getpid())
    with _lock:
        nxt, end = _blocks.get(key, (0, 0))
        if nxt < end:
            _blocks[key] = (nxt + 1, end)
            return nxt
        slots = SlotLog(storage, paths.PRODUCER_IDS)
        block = slots.find_tail(_hint.get(storage.url, 0), near=True)
        while True:
            header, payload = envelope.encode_json(
                envelope.ObjectKind.PRODUCER_ID_BLOCK,
                {
                    "block": block,
                    "size": BLOCK_SIZE,
                    "host": socket.gethostname(),
                    "pid": os.getpid(),
                    "time_ms": clock(),
                },
            )
            try:
                create_resolving(storage, slots.key(block), [header, payload], header)
                break
            except ObjectExistsError:
                block += 1
        _hint[storage.url] = block + 1
        first = block * BLOCK_SIZE
        _blocks[key] = (first + 1, first + BLOCK_SIZE)
        return first
