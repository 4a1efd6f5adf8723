"""Checksums of txnlog objects: CRC-32C (Castagnoli), as Kafka uses for record batches.

Hardware-accelerated through the ``crc32c`` package (about 30 GB/s here, 4-5x zlib's CRC-32), because
every read verifies every payload byte. Accepts any buffer-protocol object without copying.
"""

from __future__ import annotations

from typing import Any

from crc32c import crc32c as _crc32c


def crc32c(data: Any, value: int = 0) -> int:
    """CRC-32C of ``data`` (bytes, memoryview, pyarrow.Buffer...), continuing from ``value``."""
    return int(_crc32c(data, value))
