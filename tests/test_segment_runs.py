"""Runs: a rolled partition's entries read by columns deliver exactly what entry by entry delivers.

A read_committed reader takes consecutive entries of a segment as one run (``txn_core.partition.runs``):
classified from the index's columns, decoded in one Arrow read, handed out as a few batches. Every test
reads the same rolled log twice, with runs and with runs switched off (``MIN_RUN`` past any segment), and
asks for the same records at the same offsets, the same errors after the same records, under any
``max_records``: with aborted and committed transactions, multi-row and multi-batch entries, staged
references, plain sends, a duplicate retry and a zombie write (skip ranges), a sequence gap, and a
payload damaged inside the segment. Each also checks that runs were used, so it cannot pass by never
taking one.
"""

from __future__ import annotations

import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from raw_entries import append_data, staged_rows

import txn_core
from txn_core.errors import CorruptDataError, OutOfOrderSequenceError, TxnLogError
from txn_core.format import paths
from txn_core.format.entry import EntryKind
from txn_core.ops.rolling import Roller, RollPolicy
from txn_core.partition import ranges, runs
from txn_core.partition import reader as reader_module
from txn_core.partition.ranges import available_end, plan_range, read_range, split_range
from txn_core.storage import MemoryStorage, Storage, open_storage

SCHEMA = pa.schema([("id", pa.int64())])
PATH = paths.partition_log_path("t", 0)
ALL = RollPolicy(entries=1, max_entries=100_000)


@pytest.fixture(params=["memory", "local"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Storage:
    if request.param == "memory":
        return MemoryStorage(uuid.uuid4().hex)
    return open_storage(f"file://{tmp_path}/log")


def _raw(log: txn_core.Log, ids: list[int], *, producer_id: int, epoch: int, seq: int, txn: Any = None) -> None:
    batch = pa.record_batch({"id": ids}, schema=SCHEMA)
    append_data(log, "t", 0, batch, SCHEMA, producer_id=producer_id, epoch=epoch, txn=txn, base_sequence=seq)


def _history(log: txn_core.Log, txns: int = 120) -> None:
    """One-row and multi-row transactions (every fifth aborted), a two-batch entry, staged references, plain
    sends, a duplicate retry and a zombie write after an abort marker."""
    p = log.producer("writer", transaction_timeout_ms=60_000)
    p.init_transactions()
    plain = log.producer()
    for i in range(txns):
        p.begin_transaction()
        rows = [i] if i % 7 else [i, i + 10_000, i + 20_000]
        p.send("t", pa.table({"id": rows}, schema=SCHEMA), partition=0)
        if i % 23 == 4:
            two = pa.concat_tables([pa.table({"id": [i + 30_000]}, schema=SCHEMA)] * 2)
            p.send("t", two, partition=0)
        if i % 31 == 9:
            p.send_staged([staged_rows(log, "writer", i, "t", [i + 40_000], SCHEMA)])
        p.flush()
        if i % 5 == 2:
            p.abort_transaction()
        else:
            p.commit_transaction()
        if i % 11 == 3:
            plain.send("t", pa.table({"id": [i + 50_000]}, schema=SCHEMA), partition=0)
            plain.flush()
        if i == 60:
            _raw(log, [-1, -2], producer_id=777, epoch=0, seq=0)
            _raw(log, [-1, -2], producer_id=777, epoch=0, seq=0)  # a retry that landed twice
    zombie = log.producer("z")
    zombie.init_transactions()
    zombie.begin_transaction()
    zombie.send("t", pa.table({"id": [-10]}, schema=SCHEMA), partition=0)
    zombie.flush()
    txn_core.Log(log.storage).producer("z").init_transactions()  # aborts it: the marker lands
    _raw(log, [-11], producer_id=zombie.producer_id, epoch=zombie.epoch, seq=7, txn=zombie.transaction_id)
    for i in range(30):
        plain.send("t", pa.table({"id": [i + 60_000]}, schema=SCHEMA), partition=0)
        plain.flush()
    p.close()
    plain.close()


def _rolled(storage: Storage, history: Any = _history) -> None:
    log = txn_core.Log(storage)
    log.create_topic("t", 1, SCHEMA)
    history(log)
    result = Roller(txn_core.Log(storage), PATH, ALL).roll(min_age_ms=0)
    assert result.entries >= 80 and not storage.list(paths.entries(PATH))  # all of it rolled


def _read(storage: Storage, budgets: list[int | None]) -> tuple[list[tuple[int, int]], str | None]:
    """(offset, id) of every record a fresh consumer delivers, polling with ``budgets`` in turn, and the
    error that ended the read (type and message), if any."""
    c = txn_core.Log(storage).consumer()
    c.assign([("t", 0)])
    out: list[tuple[int, int]] = []
    n = 0
    try:
        while True:
            got = c.poll(max_records=budgets[n % len(budgets)])
            n += 1
            if not got.num_rows:
                return out, None
            out += zip(got.column("_offset").to_pylist(), got.column("id").to_pylist(), strict=True)
    except TxnLogError as exc:
        return out, f"{type(exc).__name__}: {exc}"


def _both(storage: Storage, budgets: list[int | None], monkeypatch: pytest.MonkeyPatch) -> Any:
    """The read with runs (checking some were planned) and without."""
    planned = []

    def counting(*a: Any, **k: Any) -> runs.Delivery:
        planned.append(1)
        return runs.plan_delivery(*a, **k)

    with monkeypatch.context() as m:
        m.setattr(reader_module, "plan_delivery", counting)
        with_runs = _read(storage, budgets)
    assert planned, "no run was taken"
    with monkeypatch.context() as m:
        m.setattr(runs, "MIN_RUN", 1 << 40)
        alone = _read(storage, budgets)
    return with_runs, alone


@pytest.mark.parametrize("budgets", [[None], [1], [3, 1, 7], [2, 50, None]], ids=str)
def test_runs_deliver_what_entry_by_entry_delivers(
    storage: Storage, budgets: list[int | None], monkeypatch: pytest.MonkeyPatch
) -> None:
    _rolled(storage)
    with_runs, alone = _both(storage, budgets, monkeypatch)
    assert with_runs == alone
    records, error = with_runs
    assert error is None
    ids = [i for _o, i in records]
    twice = {i + 30_000 for i in range(120) if i % 23 == 4 and i % 5 != 2}  # the two-batch entries
    counts = Counter(ids)
    assert {i for i, n in counts.items() if n != 1} == twice and {counts[i] for i in twice} == {2}
    assert counts[-1] == counts[-2] == 1  # the duplicate retry, once
    assert not {-10, -11} & set(ids)  # the zombie's write and its aborted transaction
    assert not {i for i in ids if 0 <= i < 10_000 and i % 5 == 2}  # aborted transactions
    assert [o for o, _ in records] == sorted(o for o, _ in records)


def test_a_run_hands_out_few_large_batches(storage: Storage) -> None:
    _rolled(storage)
    state = txn_core.Log(storage).partition_state(PATH, shared=False)
    reader = reader_module.PartitionReader(state, "t", 0, reader_module.READ_COMMITTED)
    reader.seek(0)
    batches = reader.poll()
    rows = sum(b.num_rows for b in batches)
    assert rows > 100 and len(batches) <= 8  # entry by entry: one batch per entry


def _with_gap(log: txn_core.Log) -> None:
    plain = log.producer()
    for i in range(40):
        plain.send("t", pa.table({"id": [i]}, schema=SCHEMA), partition=0)
        plain.flush()
    _raw(log, [100, 101], producer_id=888, epoch=0, seq=0)
    _raw(log, [105], producer_id=888, epoch=0, seq=4)  # sequences 2 and 3 are missing
    for i in range(40):
        plain.send("t", pa.table({"id": [200 + i]}, schema=SCHEMA), partition=0)
        plain.flush()
    plain.close()


@pytest.mark.parametrize("budgets", [[None], [3]], ids=str)
def test_a_sequence_gap_inside_a_run_raises_after_the_same_records(
    storage: Storage, budgets: list[int | None], monkeypatch: pytest.MonkeyPatch
) -> None:
    _rolled(storage, _with_gap)
    with_runs, alone = _both(storage, budgets, monkeypatch)
    assert with_runs == alone
    records, error = with_runs
    assert [i for _o, i in records] == [*range(40), 100, 101]
    assert error is not None and error.startswith(OutOfOrderSequenceError.__name__)


def test_a_payload_damaged_inside_a_segment_raises_after_the_same_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = open_storage(f"file://{tmp_path}/log")
    _rolled(storage)
    [segment] = storage.list(paths.segments(PATH))
    log = txn_core.Log(storage)
    offset = 0
    plog = log.partition_log(PATH)
    while True:  # the 60th data entry's payload
        header = plog.read_header(offset)
        if header.kind == EntryKind.DATA and offset >= 60:
            break
        offset += 1
    index = plog.segments.read_span(offset, 1, 0)
    assert index is not None
    at = int(index.rows["position"][0]) + 128 + int(index.rows["payload_len"][0]) // 2
    file = tmp_path / "log" / paths.segments(PATH) / segment
    data = bytearray(file.read_bytes())
    data[at] ^= 0xFF
    file.write_bytes(bytes(data))
    patterns: list[list[int | None]] = [[None], [4]]
    for budgets in patterns:
        with_runs, alone = _both(storage, budgets, monkeypatch)
        assert with_runs == alone
        records, error = with_runs
        assert records and error is not None and error.startswith(CorruptDataError.__name__), error
        assert "checksum" in error
    with monkeypatch.context() as m:  # a planned range read: the same records, then the same error
        ranged = _ranges(storage, 2, "read_committed", (None, None))
        m.setattr(runs, "MIN_RUN", 1 << 40)
        assert ranged == _ranges(storage, 2, "read_committed", (None, None))
    assert any(isinstance(x, str) and "checksum" in x for x in ranged), ranged


def _ranges(storage: Storage, pieces: int, isolation: str, ts: tuple[int | None, int | None]) -> list[Any]:
    """Every record (offset, id) of the planned range [0, bound) read in ``pieces`` tasks, metadata on and
    off; or the error that ended a piece."""
    log = txn_core.Log(storage)
    state = log.partition_state(PATH, shared=False)
    bound = available_end(state, isolation)
    rng = plan_range(state, "t", 0, 0, bound, isolation, min_timestamp_ms=ts[0], max_timestamp_ms=ts[1])
    out: list[Any] = []
    for piece in split_range(log.partition_log(PATH), rng, pieces):
        for metadata in (True, False):
            try:
                got = list(read_range(log.partition_log(PATH), piece, metadata=metadata, max_batch_rows=50))
            except TxnLogError as exc:
                out.append(f"{type(exc).__name__}: {exc}")
                continue
            assert all(b.num_rows <= 50 for b in got)
            ids = [i for b in got for i in b.column("id").to_pylist()]
            offsets = [o for b in got for o in b.column("_offset").to_pylist()] if metadata else None
            out.append((ids, offsets))
    return out


@pytest.mark.parametrize("pieces", [1, 3])
@pytest.mark.parametrize("isolation", ["read_committed", "read_uncommitted"])
def test_range_reads_by_runs_deliver_what_entry_by_entry_delivers(
    storage: Storage, pieces: int, isolation: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _rolled(storage)
    stamps = sorted({h.timestamp_ms for h in _headers(storage)})
    taken: list[bool] = []

    def counting(*a: Any, **k: Any) -> Any:
        got = runs.range_run(*a, **k)
        taken.append(got is not None)
        return got

    for ts in ((None, None), (stamps[len(stamps) // 3], stamps[2 * len(stamps) // 3])):
        taken.clear()

        with monkeypatch.context() as m:
            m.setattr(ranges, "range_run", counting)
            with_runs = _ranges(storage, pieces, isolation, ts)
        assert any(taken), "no run was taken"
        with monkeypatch.context() as m:
            m.setattr(runs, "MIN_RUN", 1 << 40)
            alone = _ranges(storage, pieces, isolation, ts)
        assert with_runs == alone
        assert all(not isinstance(x, str) for x in with_runs)
        assert sum(len(ids) for ids, _ in with_runs) > 100 * 2 // (1 if ts == (None, None) else 4)


def _headers(storage: Storage) -> list[Any]:
    plog = txn_core.Log(storage).partition_log(PATH)
    tail, _ = plog.tail(refresh=True)
    return [plog.read_header(s) for s in range(tail)]
