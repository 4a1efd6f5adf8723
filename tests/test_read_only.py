"""Reading never writes: a log on a read-only bind mount, or behind S3 credentials that may only read and
list, opens, describes, consumes and dumps; a mistyped path is a clear error that creates nothing; a log is
not created beside someone else's files unless asked."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from servers import READ_ONLY_KEY, READ_ONLY_SECRET

import txn_core
from txn_core.errors import ConfigurationError, StoragePermissionError

SCHEMA = pa.schema([("id", pa.int64())])


def make_log(url: str, storage_options: dict[str, Any] | None = None) -> None:
    """Topic ``t`` with committed ids 0..9, aborted ids 100..104, and snapshots not yet written."""
    with txn_core.open_log(url, storage_options) as log:
        log.create_topic("t", 2, SCHEMA)
        producer = log.producer("writer")
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("t", pa.table({"id": list(range(10))}, schema=SCHEMA), key_column="id")
        producer.commit_transaction()
        producer.begin_transaction()
        producer.send("t", pa.table({"id": list(range(100, 105))}, schema=SCHEMA), key_column="id")
        producer.flush()
        producer.abort_transaction()
        producer.close()
        with log.producer() as plain:
            plain.send("t", pa.table({"id": [10]}, schema=SCHEMA), partition=0)


def listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@contextlib.contextmanager
def read_only_bind_mount(source: Path, target: Path) -> Iterator[Path]:
    target.mkdir()
    subprocess.run(["mount", "--bind", str(source), str(target)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(target)], check=True)
        yield target
    finally:
        subprocess.run(["umount", str(target)], check=True)


def read_everything(url: str, storage_options: dict[str, Any] | None = None, *, settled: bool = True) -> list[int]:
    with txn_core.open_log(url, storage_options, create=False) as log:
        desc = log.describe_topic("t")
        assert all(p.log_end_offset > 0 for p in desc.partitions)
        if settled:
            assert all(p.last_stable_offset == p.log_end_offset for p in desc.partitions)
        consumer = log.consumer(group_id="analysts")
        consumer.assign([("t", 0), ("t", 1)])
        ids: list[int] = []
        while (batch := consumer.poll()).num_rows:
            ids.extend(batch.column("id").to_pylist())
        return sorted(ids)


def test_a_log_on_a_read_only_mount_reads_fully(tmp_path: Path) -> None:
    source = tmp_path / "log"
    make_log(f"file://{source}")
    before = listing(source)
    with read_only_bind_mount(source, tmp_path / "ro") as ro:
        assert read_everything(f"file://{ro}") == list(range(11)), "committed only, every one"
        cli = subprocess.run(
            [sys.executable, "-m", "txn_core.cli", "topics", "describe", str(ro), "t"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert cli.returncode == 0, cli.stderr
        dump = subprocess.run(
            [sys.executable, "-m", "txn_core.cli", "dump", str(ro), "t", "--json"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert dump.returncode == 0, dump.stderr
        assert "probably a bug" not in dump.stderr
        with (
            txn_core.open_log(f"file://{ro}", create=False) as log,
            pytest.raises(StoragePermissionError, match="refuses writes for want of permission"),
        ):
            producer = log.producer()
            producer.send("t", pa.table({"id": [1]}, schema=SCHEMA), partition=0)
            producer.flush()
    assert listing(source) == before, "reading wrote nothing"


def test_the_cli_group_and_transaction_verbs_read_a_read_only_mount(tmp_path: Path) -> None:
    source = tmp_path / "log"
    make_log(f"file://{source}")
    with txn_core.open_log(f"file://{source}") as log:  # a group with committed offsets to describe
        consumer = log.consumer(group_id="analysts")
        consumer.assign([("t", 0), ("t", 1)])
        while consumer.poll().num_rows:
            pass
        consumer.commit()
        consumer.close()  # the snapshots it writes behind its records are written once it is closed
    before = listing(source)
    with read_only_bind_mount(source, tmp_path / "ro") as ro:
        for verb in (
            ["groups", "list", str(ro)],
            ["groups", "describe", str(ro), "analysts"],
            ["transactions", "list", str(ro), "--all"],
            ["transactions", "describe", str(ro), "writer"],
            ["transactions", "find-hanging", str(ro)],
        ):
            cli = subprocess.run(
                [sys.executable, "-m", "txn_core.cli", *verb, "--json"], capture_output=True, text=True, check=False
            )
            assert cli.returncode == 0 and "probably a bug" not in cli.stderr, (verb, cli.stderr)
            assert cli.stdout.strip(), verb
    assert listing(source) == before, "reading wrote nothing"


def test_a_mistyped_path_is_a_clear_error_that_creates_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-log"
    with pytest.raises(ConfigurationError, match="no txnlog at"):
        txn_core.open_log(f"file://{missing}", create=False)
    assert not missing.exists()
    cli = subprocess.run(
        [sys.executable, "-m", "txn_core.cli", "topics", "list", str(missing)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert cli.returncode != 0 and "no txnlog at" in cli.stderr
    assert not missing.exists()


def test_a_log_is_not_created_beside_other_files_unless_asked(tmp_path: Path) -> None:
    data = tmp_path / "tables"
    data.mkdir()
    (data / "part-0000.parquet").write_bytes(b"PAR1")
    with pytest.raises(ConfigurationError, match=r"holds other files \(part-0000\.parquet\)"):
        txn_core.open_log(f"file://{data}")
    assert listing(data) == ["part-0000.parquet"], "nothing was written"
    with txn_core.open_log(f"file://{data}", allow_non_empty=True) as log:
        log.create_topic("t", 1, SCHEMA)
    with txn_core.open_log(f"file://{data}") as log:  # a log now: opens as one
        assert log.list_topics() == ["t"]


@pytest.mark.seaweedfs
def test_read_only_s3_credentials_read_fully(seaweed_s3: Any) -> None:
    bucket = getattr(seaweed_s3, "shared_bucket", None) or seaweed_s3.new_bucket()
    seaweed_s3.shared_bucket = bucket
    url = f"s3://{bucket}/ro-{uuid.uuid4().hex[:8]}"
    make_log(url, seaweed_s3.storage_options())
    reader = {
        "key": READ_ONLY_KEY,
        "secret": READ_ONLY_SECRET,
        "client_kwargs": {"endpoint_url": seaweed_s3.endpoint, "region_name": "us-east-1"},
    }
    client = seaweed_s3.client()
    keys = sorted(o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix=url.split("/", 3)[3])["Contents"])
    assert read_everything(url, reader) == list(range(11))
    after = sorted(o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix=url.split("/", 3)[3])["Contents"])
    assert after == keys, "reading wrote nothing"
    with txn_core.open_log(url, reader, create=False) as log, pytest.raises(StoragePermissionError):
        producer = log.producer()
        producer.send("t", pa.table({"id": [1]}, schema=SCHEMA), partition=0)
        producer.flush()


def test_a_read_only_reader_waits_out_an_expired_transaction_it_cannot_abort(tmp_path: Path) -> None:
    """A reader aborts a transaction past its timeout, through the protocol, when it can write; a reader
    that cannot leaves it to a writer and keeps the read bound where it is (never a wrong read)."""
    import time

    source = tmp_path / "log"
    make_log(f"file://{source}")
    with txn_core.open_log(f"file://{source}") as log:
        stuck = log.producer("stuck", transaction_timeout_ms=200)
        stuck.init_transactions()
        stuck.begin_transaction()
        stuck.send("t", pa.table({"id": [500]}, schema=SCHEMA), partition=0)
        stuck.flush()
    time.sleep(0.4)
    with read_only_bind_mount(source, tmp_path / "ro") as ro:
        with txn_core.open_log(f"file://{ro}", create=False) as log:
            bound = log.describe_topic("t").partitions[0].last_stable_offset
            assert bound < log.describe_topic("t").partitions[0].log_end_offset, "held by the open transaction"
        assert read_everything(f"file://{ro}", settled=False) == list(range(11))
    assert read_everything(f"file://{source}", settled=False) == list(range(11))  # a writable reader aborts it
    with txn_core.open_log(f"file://{source}") as log:
        assert log.describe_transaction("stuck").state == "CompleteAbort"


@pytest.mark.spark
def test_the_spark_source_reads_a_read_only_log(spark: Any, tmp_path: Path) -> None:
    source = tmp_path / "log"
    make_log(f"file://{source}")
    before = listing(source)
    with read_only_bind_mount(source, tmp_path / "ro") as ro:
        rows = spark.read.format("txnlog").option("topic", "t").load(str(ro)).collect()
        assert sorted(r.id for r in rows) == list(range(11))
    assert listing(source) == before


@pytest.mark.spark
def test_the_spark_sink_writes_beside_other_files_only_when_allowed(spark: Any, tmp_path: Path) -> None:
    data = tmp_path / "tables"
    data.mkdir()
    (data / "part-0000.parquet").write_bytes(b"PAR1")
    frame = spark.createDataFrame([(1,), (2,)], "id long")
    writer = frame.write.format("txnlog").option("topic", "t").option("partitions", "1").mode("append")
    with pytest.raises(Exception, match=r"holds other files \(part-0000\.parquet\).*allowNonEmptyPath=true"):
        writer.save(str(data))
    assert listing(data) == ["part-0000.parquet"], "nothing was written"
    writer.option("allowNonEmptyPath", "true").save(str(data))
    assert sorted(r.id for r in spark.read.format("txnlog").option("topic", "t").load(str(data)).collect()) == [1, 2]
    assert (data / "part-0000.parquet").read_bytes() == b"PAR1"
