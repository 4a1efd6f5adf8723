"""CRC-32C as txnlog computes it: known answers, continuation, zero-copy inputs, and the package's own function."""

from __future__ import annotations

import pyarrow as pa
import pytest

from txn_core.format import checksum
from txn_core.format.checksum import crc32c


def test_known_answers() -> None:
    assert crc32c(b"") == 0
    assert crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value (RFC 3720, appendix B.4)
    assert crc32c(bytes(32)) == 0x8A9136AA  # RFC 3720 B.4: 32 bytes of zeros


def test_continues_from_a_value_and_takes_buffers_without_copying() -> None:
    data = bytes(range(256)) * 64
    assert crc32c(data[1000:], crc32c(data[:1000])) == crc32c(data)
    assert crc32c(memoryview(data)[10:20]) == crc32c(data[10:20])
    assert crc32c(pa.py_buffer(data)) == crc32c(data)


def test_is_the_packages_function() -> None:
    import crc32c as package

    assert checksum._crc32c is package.crc32c


def test_falls_back_to_the_package_import_when_its_layout_differs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checksum, "_EXTENSION", "crc32c._no_such_module")
    import crc32c as package

    assert checksum._load() is package.crc32c
