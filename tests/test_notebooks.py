"""The notebooks execute top to bottom (their own ``assert`` cells included) and print what they teach.

Each notebook is copied into a temporary directory and run there with nbclient on this interpreter's
ipykernel; the committed files carry no outputs.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = pytest.mark.notebooks

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
CELL_TIMEOUT_S = 600  # a cell that starts a Spark driver on a loaded CI machine


def execute(name: str, tmp_path: Path) -> tuple[str, list[str]]:
    """Run a copy of ``notebooks/<name>`` in ``tmp_path``; returns its printed text and output mime types."""
    copy = tmp_path / name
    shutil.copy(NOTEBOOKS / name, copy)
    nb = nbformat.read(copy, as_version=4)  # type: ignore[no-untyped-call]
    NotebookClient(
        nb, timeout=CELL_TIMEOUT_S, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    texts, kinds = [], []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.output_type == "stream":
                texts.append(out.text)
            elif "data" in out:
                kinds.extend(out.data)
                texts.append(out.data.get("text/plain", ""))
    return "".join(texts), kinds


@pytest.mark.parametrize(
    "name",
    [
        "01_transactions.ipynb",
        "02_spark_exactly_once.ipynb",
        "03_operations.ipynb",
        "04_spark_sql_and_aggregations.ipynb",
    ],
)
def test_notebooks_are_committed_without_outputs(name: str) -> None:
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)  # type: ignore[no-untyped-call]
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(not c.outputs and c.execution_count is None for c in code)


def test_01_transactions(tmp_path: Path) -> None:
    printed, kinds = execute("01_transactions.ipynb", tmp_path)
    # producing and consuming
    assert "read_committed sees 3 records" in printed
    # a committed transaction
    assert "'payments-app': CompleteCommit" in printed and "read_committed sees 7 records" in printed
    # an aborted one, both isolation levels side by side
    assert "read_uncommitted sees 10 records, read_committed sees 7" in printed
    assert "aborted ids, never visible to read_committed: [20, 21, 22]" in printed
    assert "ABORT   3:2 (payments-app)" in printed  # txnlog dump --show-control lists the marker
    # the last stable offset held by an open transaction, then released by its commit
    assert "2 record(s) held back" in printed
    assert "read_committed sees id 31? False" in printed and "read_uncommitted sees id 31? True" in printed
    assert "read_committed sees ids 30 and 31? True" in printed
    # the scripted sequence and its chart
    assert re.search(r"4\s+A commits\s+8\s+5\s+3\s+1\n", printed)  # A's commit: the LSO stops at B's first record
    assert "the LSO never passes the log end" in printed
    assert "image/png" in kinds
    # an application transaction: committed once, the retry a no-op
    assert "first run: committed, 3 rows" in printed and "retry after a crash: replayed, 0 rows" in printed
    assert "loads holds 3 records" in printed


@pytest.mark.slow
@pytest.mark.spark
def test_02_spark_exactly_once(tmp_path: Path) -> None:
    printed, kinds = execute("02_spark_exactly_once.ipynb", tmp_path)
    assert "orders: 2,250 committed rows, 750 aborted rows" in printed
    # run 1: the driver process is SIGKILLed in batch 2's commit, before the commit point
    assert "run 1: the driver was killed by SIGKILL" in printed
    assert "batches planned [0, 1, 2], done [0, 1]" in printed
    assert re.search(r"spark-sink-group-enricher: last transaction 0:\d+ (Prepare|Complete)Commit \(batch 1\)", printed)
    assert re.search(r"spark-sink-group-enricher: open transaction 0:\d+, begun ahead by that commit", printed)
    assert re.search(r"0:\d+\s+open\s+2\s+\d+\n", printed)  # the dead driver's transaction holds batch 2
    # run 2: the restart aborts it and redoes batch 2; batch 4's commit fails after its commit point
    assert "run 2: the query failed: injected fault 'after_prepare' in batch 4" in printed
    assert "run 2 completed batches [2, 3]; Spark's checkpoint: planned [0, 1, 2, 3, 4], done [0, 1, 2, 3]" in printed
    assert "the sink's last committed transaction: batch 4" in printed
    # run 3: Spark replays batch 4, the sink commits nothing
    assert "planned [0, 1, 2, 3, 4, 5, 6], done [0, 1, 2, 3, 4, 5, 6]" in printed
    # the proof
    assert "committed input rows: 2,250; output rows: 2,250" in printed
    assert "duplicates: 0\n" in printed
    assert "aborted input rows in the output: 0\n" in printed
    assert "committed input rows missing from the output: 0\n" in printed
    assert re.search(r"0:\d+\s+ABORT\s+<NA>\s+0\n", printed)
    assert "every micro-batch committed once, with exactly its committed input rows" in printed
    assert "Spark batch read: 2,250 rows, 2,250 distinct orders" in printed
    assert "image/png" in kinds


def test_03_operations(tmp_path: Path) -> None:
    printed, _ = execute("03_operations.ipynb", tmp_path)
    # a producer dies mid-transaction; the read bound stalls while the log end grows
    assert "orders-importer exited with code 1" in printed
    assert "billing polled 0 new orders" in printed
    assert "orders-importer (Ongoing, open 20 s)" in printed
    # finding it: API and command line
    assert "open for 20000 ms (more than 10000 ms)" in printed
    assert "orders-importer: Ongoing, open 20 s of its 120 s timeout" in printed
    assert "to release them: txnlog transactions abort" in printed
    # released by an operator abort, then (second incident) by the timeout
    assert "aborted transaction 13:1 of 'orders-importer'" in printed
    assert "billing polled 8 new orders; importer's orders among them: False" in printed
    assert "orders-importer (Ongoing, open 60 s)" in printed
    assert "orders-importer: CompleteAbort (reason: timeout)" in printed
    assert "billing polled 4 new orders; importer's orders among them: False" in printed
    # consumer-group lag against the last stable offset
    assert "total lag: 0" in printed


@pytest.mark.slow
@pytest.mark.spark
def test_04_spark_sql_and_aggregations(tmp_path: Path) -> None:
    printed, kinds = execute("04_spark_sql_and_aggregations.ipynb", tmp_path)
    assert re.search(r"\d+ committed clicks in minutes 0-5 \(minute 3 aborted\)", printed)
    assert re.search(r"run 2: \d+ micro-batches so far", printed)
    assert re.search(r"windows written: \d+, each once; counts equal the committed clicks: True", printed)
    assert "minute 3 (aborted) counted: False" in printed
    assert "minute 20 (still open) written: False" in printed
    assert "image/png" in kinds
