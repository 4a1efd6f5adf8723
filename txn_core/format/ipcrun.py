"""Decoding a run of small DATA payloads in one Arrow read.

A DATA payload is an Arrow IPC stream: the schema message, the record batch messages, the end-of-stream
marker (PROTOCOL.md "Entries"). Opening a stream reader costs far more than reading a small batch from it,
so a reader of many small entries (one-row transactions, a rolled segment's thousands of them) would
spend its time opening readers. Payloads whose schema messages are byte-for-byte equal are spliced into
one stream (the first schema message, every payload's batch messages, one end-of-stream marker) and read
once. The IPC stream format keeps no state between record batch messages except dictionaries, so the
batches read are exactly the ones each payload holds; schemas with dictionary-encoded fields are never
spliced.

:func:`decode_run` answers only when the result is certain: each payload must hold exactly one batch of
the row count its header states (the producer's shape). Anything else (several batches, another schema
in the run, damage) returns None, and the caller decodes the payloads one by one, with their own errors.
The payloads' checksums are the caller's to verify first (:func:`txn_core.format.entry.verify_payload`).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

#: The end-of-stream marker: the continuation token and a zero metadata length.
EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"
_PREFIX = struct.Struct("<Ii")
_CONTINUATION = 0xFFFFFFFF

#: Payloads larger than this are decoded alone (zero-copy; splicing copies).
MAX_SPLICED_PAYLOAD = 256 << 10
#: At most this many bytes are spliced into one stream.
MAX_RUN_BYTES = 8 << 20


def byte_view(data: Any) -> memoryview:
    """``data`` as a view of unsigned bytes."""
    view = memoryview(data)
    return view if view.format == "B" else view.cast("B")


def schema_message_end(payload: Any) -> int | None:
    """Where the schema message at the start of ``payload`` ends, or None when it does not begin with one
    in the continuation framing (which :func:`txn_core.format.entry.encode_arrow` always writes)."""
    if len(payload) < 16:
        return None
    continuation, length = _PREFIX.unpack_from(payload, 0)
    if continuation != _CONTINUATION or length <= 0 or 8 + length + 8 > len(payload):
        return None
    return 8 + int(length)


def spliceable(payload: Any) -> bool:
    """Whether ``payload`` is small enough to be decoded in a run."""
    return len(payload) <= MAX_SPLICED_PAYLOAD


def decode_run(payloads: Sequence[memoryview], counts: Sequence[int]) -> list[pa.RecordBatch] | None:
    """The one record batch of each payload (``counts[i]`` rows each), read as one stream; None when the
    run cannot be decoded that way with certainty (see module doc). ``payloads`` are views of unsigned
    bytes (format ``B``, as :func:`byte_view` makes them): a view of a ``pyarrow.Buffer`` has signed
    elements, which never compare equal to bytes."""
    if len(payloads) < 2:
        return None
    first = payloads[0]
    end = schema_message_end(first)
    if end is None:
        return None
    schema_message = bytes(first[:end])
    parts: list[Any] = [schema_message]
    for payload in payloads:
        if len(payload) < end + 8 or payload[:end] != schema_message or payload[-8:] != EOS:
            return None
        parts.append(payload[end : len(payload) - 8])
    parts.append(EOS)
    try:
        reader = pa.ipc.open_stream(pa.py_buffer(b"".join(parts)))
        if _has_dictionary(reader.schema):
            return None
        batches = list(reader)
    except (pa.ArrowInvalid, pa.ArrowException):
        return None
    if len(batches) != len(payloads) or any(b.num_rows != n for b, n in zip(batches, counts, strict=True)):
        return None
    return batches


def _has_dictionary(schema: pa.Schema) -> bool:
    def nested(t: pa.DataType) -> bool:
        if pa.types.is_dictionary(t):
            return True
        return any(nested(t.field(i).type) for i in range(t.num_fields))

    return any(nested(f.type) for f in schema)
