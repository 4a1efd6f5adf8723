"""The ``txnlog`` logger hierarchy: off unless asked, switched on by TXNLOG_LOG_LEVEL in every process
(Spark's Python workers included), commit decisions at INFO, storage requests at DEBUG."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from fakeclock import FakeClock
from faults import FaultyStorage

import txn_core
from txn_core import ProducerFencedError, TxnLogError
from txn_core.errors import RetryableStorageError
from txn_core.format import paths
from txn_core.logs import get_logger, parse_levels
from txn_core.ops.maintenance import compact_transaction_log, take_snapshots
from txn_core.storage.base import create_resolving
from txn_core.storage.memory import MemoryStorage

PRODUCE = textwrap.dedent("""
    import sys
    import pyarrow as pa
    import txn_core
    with txn_core.open_log(sys.argv[1]) as log:
        log.create_topic("t", 1, pa.schema([("x", pa.int64())]))
        with log.producer("copier") as producer:
            producer.init_transactions()
            producer.begin_transaction()
            producer.send("t", pa.table({"x": [1, 2]}))
            producer.commit_transaction()
""")


def run(script: str, *args: str, level: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TXNLOG_LOG_LEVEL"}
    if level is not None:
        env["TXNLOG_LOG_LEVEL"] = level
    return subprocess.run(
        [sys.executable, "-c", script, *args], env=env, capture_output=True, text=True, timeout=300, check=True
    )


def test_module_loggers_live_under_txnlog() -> None:
    assert get_logger("txn_core.partition.snapshots").name == "txnlog.snapshots"
    assert get_logger("spark_txn_sink.commit").name == "txnlog.spark.sink"
    assert get_logger("spark_txn_source.planning").name == "txnlog.spark.source"
    assert get_logger("txnlog.coordinator").name == "txnlog.coordinator"


def test_levels_parse_per_logger_and_bad_levels_are_named() -> None:
    assert parse_levels("INFO,txnlog.storage.requests=debug") == {
        "txnlog": logging.INFO,
        "txnlog.storage.requests": logging.DEBUG,
    }
    with pytest.raises(ValueError, match="'LOUD' is not a log level"):
        parse_levels("LOUD")


def test_silent_by_default_and_commit_decisions_at_info(tmp_path: Path) -> None:
    quiet = run(PRODUCE, f"file://{tmp_path}/a", level=None)
    assert "txnlog" not in quiet.stderr

    info = run(PRODUCE, f"file://{tmp_path}/b", level="INFO")
    assert "INFO txnlog.coordinator" in info.stderr
    assert "init copier: producer id" in info.stderr
    assert "commit copier: transaction" in info.stderr and "PREPARE_COMMIT" in info.stderr
    assert "txnlog.storage.requests" not in info.stderr


def test_storage_requests_at_debug(tmp_path: Path) -> None:
    debug = run(PRODUCE, f"file://{tmp_path}/c", level="WARNING,txnlog.storage.requests=DEBUG")
    lines = [line for line in debug.stderr.splitlines() if "DEBUG txnlog.storage.requests" in line]
    assert any(" create topics/t/00000/log/00000000000000000000 " in line for line in lines)
    assert all("ms" in line for line in lines)
    assert "txnlog.coordinator" not in debug.stderr, "the coordinator stays at WARNING"


@pytest.mark.slow
@pytest.mark.spark
def test_spark_workers_honour_the_environment_variable(tmp_path: Path) -> None:
    """Commit worker and executor workers log too (local mode: they inherit the driver's environment)."""
    script = textwrap.dedent("""
        import os, sys
        from pyspark.sql import SparkSession
        import spark_txn_source
        os.environ["PYSPARK_PYTHON"] = sys.executable
        spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
                 .config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.host", "127.0.0.1")
                 .getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        spark_txn_source.register(spark)
        df = spark.range(10).selectExpr("id")
        df.write.format("txnlog").option("topic", "t").option("partitions", "2").mode("append").save(sys.argv[1])
        assert spark.read.format("txnlog").option("topic", "t").load(sys.argv[1]).count() == 10
        spark.stop()
    """)
    out = run(script, f"file://{tmp_path}/log", level="INFO,txnlog.storage.requests=DEBUG")
    assert "INFO txnlog.spark.sink" in out.stderr and "committed: 10 rows" in out.stderr
    # staged objects are written by executor tasks: their requests are logged by the workers
    assert "DEBUG txnlog.storage.requests" in out.stderr and " create staging/" in out.stderr


# --- what each area logs at INFO (in-process: records reach the root logger, pytest's caplog) ------------


@pytest.fixture
def info(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger="txnlog")
    return caplog


def lines(caplog: pytest.LogCaptureFixture, logger: str) -> list[str]:
    return [f"{r.levelname} {r.getMessage()}" for r in caplog.records if r.name == logger]


@pytest.fixture
def clocked() -> tuple[txn_core.Log, FakeClock]:
    clock = FakeClock()
    log = txn_core.Log(MemoryStorage(uuid.uuid4().hex), clock=clock)
    log.create_topic("t", 2, pa.schema([("x", pa.int64())]))
    return log, clock


def test_a_timeout_abort_is_logged_by_the_coordinator(
    clocked: tuple[txn_core.Log, FakeClock], info: pytest.LogCaptureFixture
) -> None:
    log, clock = clocked
    producer = log.producer("slow", transaction_timeout_ms=1_000)
    producer.init_transactions()
    producer.begin_transaction()
    producer.send("t", pa.table({"x": [1]}), partition=0)
    producer.flush()
    clock.now += 2_000
    assert log.expire_transactions() == 1
    aborted = [line for line in lines(info, "txnlog.coordinator") if line.startswith("INFO abort slow: ")]
    assert len(aborted) == 1 and "aborted (timeout); epoch 0 fenced" in aborted[0], aborted


def test_retried_and_read_back_storage_writes_are_logged(info: pytest.LogCaptureFixture) -> None:
    class AskingToRetry(MemoryStorage):
        """Answers the first create with "please retry" (a 503 / SlowDown)."""

        asked = False

        def create(self, key: str, chunks: Any) -> None:
            if not self.asked:
                self.asked = True
                raise RetryableStorageError(f"injected: slow down on {key}")
            super().create(key, chunks)

    create_resolving(AskingToRetry(uuid.uuid4().hex), "a/key", [b"mine:data"], b"mine:")
    create_resolving(FaultyStorage(MemoryStorage(uuid.uuid4().hex), ambiguous_at=0), "b/key", [b"mine:data"], b"mine:")
    assert lines(info, "txnlog.storage") == [
        "INFO create of a/key: the store asked to retry (attempt 1 of 8)",
        "INFO create of b/key: outcome unknown, reading it back (attempt 1 of 8)",
    ]


def test_buffer_and_coordinator_snapshots_are_logged(
    clocked: tuple[txn_core.Log, FakeClock], info: pytest.LogCaptureFixture
) -> None:
    log, _ = clocked
    with log.producer("w") as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("t", pa.table({"x": [1, 2]}), partition=1)
        producer.commit_transaction()
    take_snapshots(log, "t")
    compact_transaction_log(log, min_age_ms=0, check_min_age=False)
    written = lines(info, "txnlog.snapshots")
    # one line per snapshot written: partition 1's was due when its transaction ended, and take_snapshots
    # found it there (a snapshot already written is not written again)
    assert sorted(line for line in written if line.startswith("INFO snapshot ")) == [
        "INFO snapshot topics/t/00000/snapshots/00000000000000000000 written",
        "INFO snapshot topics/t/00001/snapshots/00000000000000000003 written",
    ]
    assert any(line.startswith("INFO coordinator snapshot _txnlog/coordinators/") for line in written), written


def test_the_source_logs_each_planned_batch(info: pytest.LogCaptureFixture) -> None:
    from spark_txn_source.reader import make_batch_reader, source_schema

    url = f"memory://{uuid.uuid4().hex}"
    log = txn_core.open_log(url)
    log.create_topic("t", 2, pa.schema([("x", pa.int64())]))
    with log.producer() as producer:
        producer.send("t", pa.table({"x": [1, 2, 3]}), partition=0)
        producer.send("t", pa.table({"x": [4]}), partition=1)
    options = {"path": url, "topic": "t", "minPartitions": "3"}
    partitions = make_batch_reader(options, source_schema(options)).partitions()
    assert lines(info, "txnlog.spark.source") == [f"INFO planned 4 offsets of 2 partitions as {len(partitions)} tasks"]


def test_the_producer_logs_being_fenced_and_a_failed_transaction(
    clocked: tuple[txn_core.Log, FakeClock], info: pytest.LogCaptureFixture
) -> None:
    log, _ = clocked
    zombie = log.producer("copier")
    zombie.init_transactions()
    zombie.begin_transaction()
    zombie.send("t", pa.table({"x": [1]}), partition=0)
    zombie.flush()
    log.producer("copier").init_transactions()  # a new instance fences the zombie
    with pytest.raises(ProducerFencedError):
        zombie.commit_transaction()

    failing = log.producer("acker")
    failing.init_transactions()
    failing.begin_transaction()

    def refuse(txn: Any, result: Any) -> None:
        raise TxnLogError("injected: the acknowledged message was taken over")

    with pytest.raises(TxnLogError, match="taken over"):
        failing.append_to_transaction(paths.partition_log_path("t", 1), b"ack", check=refuse)
    failing.abort_transaction()

    logged = lines(info, "txnlog.producer")
    assert len(logged) == 2, logged
    assert logged[0].startswith("WARNING producer copier: fatal error, close it: ") and "fenced" in logged[0]
    assert logged[1].startswith("INFO producer acker: transaction ") and "must be aborted: " in logged[1]
    assert "taken over" in logged[1]
