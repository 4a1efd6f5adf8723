"""The ``txnlog`` logger hierarchy: off unless asked, switched on by TXNLOG_LOG_LEVEL in every process
(Spark's Python workers included), commit decisions at INFO, storage requests at DEBUG."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from txn_core.logs import get_logger, parse_levels

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
    assert get_logger("txn_core.snapshots").name == "txnlog.snapshots"
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
