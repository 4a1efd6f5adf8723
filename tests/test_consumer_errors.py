"""A consumer never advances past a record it did not return (PROTOCOL.md "Reading").

An error met while polling (a sequence gap, a missing staged object, a corrupt entry) is raised only by a
poll that has nothing before it to deliver; the position stays on the first record not returned, and
polling again raises again (never a silent skip). Property-tested: for any sequence of polls with random
``max_records`` and an error injected at any entry, the records returned plus the position equal an
error-free read up to the damaged entry. Once the damaged entry is marked lost (PROTOCOL.md "Damage"), the
same consumer goes on and delivers every other record exactly once.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import txn_core
from txn_core import TopicPartition
from txn_core.clock import system_clock
from txn_core.errors import TxnLogError
from txn_core.format.entry import EntryKind, crc32, encode_arrow
from txn_core.partition.partition import PartitionLog
from txn_core.partition.staging import reference_payload, staging_prefix, write_staged

SCHEMA = pa.schema([("x", pa.int64())])
FAULTS = ["gap", "missing_staged", "corrupt", "header"]
#: faults that are damage an operator may mark lost (a sequence gap is not: nothing is damaged)
DAMAGE = ["missing_staged", "corrupt", "header"]


def build(url: str, sizes: list[int], bad: int, fault: str, partition: int = 0, partitions: int = 1) -> list[int]:
    """Entries of ``sizes`` rows into ``t``/``partition``, entry ``bad`` damaged by ``fault``; returns the
    base offset of every entry. Rows hold their own offset, so a read's rows are checkable."""
    log = txn_core.open_log(url)
    if "t" not in log.list_topics():
        log.create_topic("t", partitions, SCHEMA)
    plog = log.partition_log(f"topics/t/{partition:05d}")
    bases, offset, sequence = [], 0, 0
    for i, n in enumerate(sizes):
        rows = pa.record_batch([pa.array(range(offset, offset + n), pa.int64())], schema=SCHEMA)
        if fault == "missing_staged" and i == bad:
            ref = write_staged(
                log.storage,
                staging_prefix("test", uuid.uuid4().hex),
                "t",
                partition,
                [rows],
                SCHEMA,
                clock=system_clock,
            )
            assert ref is not None
            payload = reference_payload(ref)
            result = plog.append(
                EntryKind.DATA_REF, payload, len(payload), crc32(payload), n, producer_id=7, base_sequence=sequence
            )
            log.storage.delete(ref.key)
        else:
            if fault == "gap" and i == bad:
                sequence += 5  # a batch of this producer is missing before this entry
            payload = encode_arrow([rows], SCHEMA).to_pybytes()
            result = plog.append(
                EntryKind.DATA, payload, len(payload), crc32(payload), n, producer_id=7, base_sequence=sequence
            )
            if fault in ("corrupt", "header") and i == bad:
                path = Path(url.removeprefix("file://")) / result_key(plog, result.slot)
                data = bytearray(path.read_bytes())
                if fault == "corrupt":
                    data[-3] ^= 0xFF  # payload damage: the checksum no longer matches
                else:
                    data[20] ^= 0x01  # header damage: neither its offsets nor its kind can be trusted
                path.write_bytes(bytes(data))
        bases.append(result.base_offset)
        offset += n
        sequence += n
    log.close()
    return bases


def result_key(plog: PartitionLog, slot: int) -> str:
    return f"{plog.path}/log/{slot:020d}"


def read_until_error(consumer: txn_core.Consumer, budgets: list[int]) -> tuple[list[int], TxnLogError | None]:
    got: list[int] = []
    i = 0
    while True:
        try:
            table = consumer.poll(budgets[i % len(budgets)])
        except TxnLogError as exc:
            return got, exc
        i += 1
        if table.num_rows == 0:
            return got, None
        got.extend(table.column("x").to_pylist())


SIZES = st.lists(st.integers(1, 5), min_size=2, max_size=7)
BUDGETS = st.lists(st.integers(1, 9), min_size=1, max_size=4)


def faulty_log(
    tmp_path_factory: pytest.TempPathFactory, sizes: list[int], data: st.DataObject, fault: str
) -> tuple[str, int, list[int]]:
    """A log built by :func:`build` with a drawn entry damaged: its URL, the damaged entry, the bases."""
    bad = data.draw(st.integers(1 if fault == "gap" else 0, len(sizes) - 1))
    url = f"file://{tmp_path_factory.mktemp('log')}/log"
    return url, bad, build(url, sizes, bad, fault)


def drawn_consumer(log: txn_core.Log, data: st.DataObject) -> txn_core.Consumer:
    """A consumer of ``t``/0 under a drawn isolation level."""
    consumer = log.consumer(isolation_level=data.draw(st.sampled_from(["read_committed", "read_uncommitted"])))
    consumer.assign([("t", 0)])
    return consumer


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=SIZES, data=st.data(), fault=st.sampled_from(FAULTS), budgets=BUDGETS)
def test_polls_return_everything_before_an_error_and_stop_on_it(
    tmp_path_factory: pytest.TempPathFactory, sizes: list[int], data: st.DataObject, fault: str, budgets: list[int]
) -> None:
    url, bad, bases = faulty_log(tmp_path_factory, sizes, data, fault)
    with txn_core.open_log(url) as log:
        consumer = drawn_consumer(log, data)
        got, error = read_until_error(consumer, budgets)
        assert error is not None, "the damaged entry is never skipped silently"
        assert got == list(range(bases[bad])), "every record before the damaged entry, once, in order"
        assert consumer.position(TopicPartition("t", 0)) == bases[bad]
        with pytest.raises(type(error)):
            consumer.poll(budgets[0])  # and it keeps failing there
        assert consumer.position(TopicPartition("t", 0)) == bases[bad]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=SIZES, data=st.data(), fault=st.sampled_from(DAMAGE), budgets=BUDGETS)
def test_once_the_damaged_entry_is_marked_lost_the_same_consumer_delivers_everything_else_once(
    tmp_path_factory: pytest.TempPathFactory, sizes: list[int], data: st.DataObject, fault: str, budgets: list[int]
) -> None:
    url, bad, bases = faulty_log(tmp_path_factory, sizes, data, fault)
    with txn_core.open_log(url) as log:
        consumer = drawn_consumer(log, data)
        before, error = read_until_error(consumer, budgets)
        assert error is not None and before == list(range(bases[bad]))
        last_header = fault == "header" and bad == len(sizes) - 1  # nothing after it tells its size
        log.mark_lost("t", 0, bad, reason="damaged in a test", records=sizes[bad] if last_header else None)
        after, error = read_until_error(consumer, budgets)
        assert error is None, "the consumer that stopped at it goes on once it is marked lost"
        lost = range(bases[bad], bases[bad] + sizes[bad])
        assert before + after == [x for x in range(sum(sizes)) if x not in lost], "every other record, once"


@pytest.mark.parametrize("fault", FAULTS)
def test_an_error_in_one_partition_loses_no_record_of_another(tmp_path: Path, fault: str) -> None:
    url = f"file://{tmp_path}/log"
    build(url, [3, 3], -1, fault, partition=0, partitions=2)
    bases = build(url, [2, 2, 2], 2, fault, partition=1)
    with txn_core.open_log(url) as log:
        consumer = log.consumer()
        consumer.assign([("t", 0), ("t", 1)])
        got: dict[int, list[int]] = {0: [], 1: []}
        error = None
        for _ in range(10):
            try:
                table = consumer.poll()
            except TxnLogError as exc:
                error = exc
                break
            for p, x in zip(table.column("_partition").to_pylist(), table.column("x").to_pylist(), strict=True):
                got[p].append(x)
        assert error is not None
        assert got == {0: list(range(6)), 1: list(range(bases[2]))}
        assert consumer.position(TopicPartition("t", 1)) == bases[2]
