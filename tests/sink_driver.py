"""A streaming query run as its own Spark driver process, for tests that hard-kill drivers.

Usage: ``python tests/sink_driver.py '<json config>'``. Run it with ``start_new_session=True``: the
process then leads its own session, sets ``TXNLOG_SINK_TEST_SESSION`` (which arms the sink's ``kill``
faults) and everything Spark starts (the JVM, Python workers) stays in that session, so
:func:`kill_driver` can SIGKILL all of it at once, like a machine losing power.

Config keys: ``log`` (URL), ``checkpoint``, ``source`` (``counter`` or ``txnlog``), ``topic`` (output),
``master`` (default ``local[2]``), ``sink`` (extra sink options), ``read`` (extra source options),
``input`` (source topic), ``trigger`` (``availableNow``, default, or seconds between batches).
Exit code 0: the query drained its input and stopped; 1: it failed (the error is printed).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def main(config: dict[str, Any]) -> int:
    sys.path.insert(0, str(HERE))
    if os.getsid(0) == os.getpid():
        os.environ["TXNLOG_SINK_TEST_SESSION"] = str(os.getpid())
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    import spark_txn_source

    spark = (SparkSession.builder.master(config.get("master", "local[2]")).appName("txnlog-sink-driver")
             .config("spark.sql.shuffle.partitions", "2").config("spark.ui.enabled", "false")
             .config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.host", "127.0.0.1")
             .config("spark.sql.python.filterPushdown.enabled", "true")
             .config("spark.python.worker.reuse", "true").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark_txn_source.register(spark)
    if config.get("source") == "counter":
        import sink_sources

        sink_sources.register(spark)
        reader = spark.readStream.format("sinktest_counter")
    else:
        reader = spark.readStream.format("txnlog").option("topic", config["input"])
    for k, v in config.get("read", {}).items():
        reader = reader.option(k, str(v))
    df = reader.load(config["log"]) if config.get("source") != "counter" else reader.load()
    if config.get("select"):
        df = df.selectExpr(*config["select"])
    writer = (df.writeStream.format("txnlog").option("checkpointLocation", config["checkpoint"])
              .option("topic", config["topic"]))
    for k, v in config.get("sink", {}).items():
        writer = writer.option(k, str(v))
    trigger = config.get("trigger", "availableNow")
    writer = writer.trigger(availableNow=True) if trigger == "availableNow" else \
        writer.trigger(processingTime=f"{float(trigger)} seconds")
    query = writer.start(config["log"])
    try:
        query.awaitTermination()
    except Exception as exc:  # the test reads this
        print(f"QUERY FAILED: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        spark.stop()
    print("QUERY DONE", flush=True)
    return 0


# --- used by tests ---------------------------------------------------------------------------------


def start_driver(config: dict[str, Any], log_file: Path) -> subprocess.Popen[bytes]:
    """Start a driver process in a new session; its output goes to ``log_file``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(HERE), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["PYSPARK_PYTHON"] = sys.executable
    out = open(log_file, "ab")  # noqa: SIM115 - handed to the child
    try:
        return subprocess.Popen([sys.executable, str(HERE / "sink_driver.py"), json.dumps(config)],
                                cwd=str(ROOT), env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    finally:
        out.close()


def kill_driver(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL every process of the driver's session (driver, JVM, Python workers), then reap."""
    from spark_txn_sink.faults import session_pids

    for _ in range(3):
        pids = session_pids(proc.pid)
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
    proc.wait(timeout=60)


def wait_driver(proc: subprocess.Popen[bytes], timeout: float) -> int:
    """Wait for the driver; on timeout kill it (and everything it started) and fail."""
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_driver(proc)
        raise
    kill_driver(proc)  # leftovers of a killed session (the JVM outlives a SIGKILLed Python driver)
    return code


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
