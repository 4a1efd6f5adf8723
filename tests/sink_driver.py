"""A streaming query run as its own Spark driver process, for tests that hard-kill drivers.

Usage: ``python tests/sink_driver.py '<json config>'``. Run it with ``start_new_session=True``: the
process then leads its own session, sets ``TXNLOG_SINK_TEST_SESSION`` (which arms the sink's ``kill``
faults) and everything Spark starts (the JVM, Python workers) stays in that session, so
:func:`kill_driver` can SIGKILL all of it at once, like a machine losing power.

Config keys: ``log`` (URL), ``checkpoint``, ``source`` (``counter`` or ``txnlog``), ``topic`` (output),
``master`` (default ``local[2]``), ``sink`` (extra sink options), ``read`` (extra source options),
``input`` (source topic), ``trigger`` (``availableNow``, default, or seconds between batches), ``probe``
(true: before the query, print ``PROBE <json>`` with the driver's and the executors' JVM process ids and
working directories, to prove executors run in processes of their own; see :func:`probe_executors`).
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

    spark = (
        SparkSession.builder.master(config.get("master", "local[2]"))
        .appName("txnlog-sink-driver")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.python.filterPushdown.enabled", "true")
        .config("spark.python.worker.reuse", "true")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark_txn_source.register(spark)
    if config.get("probe"):
        print("PROBE " + json.dumps(probe_executors(spark)), flush=True)
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
    writer = (
        df.writeStream.format("txnlog")
        .option("checkpointLocation", config["checkpoint"])
        .option("topic", config["topic"])
    )
    for k, v in config.get("sink", {}).items():
        writer = writer.option(k, str(v))
    trigger = config.get("trigger", "availableNow")
    writer = (
        writer.trigger(availableNow=True)
        if trigger == "availableNow"
        else writer.trigger(processingTime=f"{float(trigger)} seconds")
    )
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


def _jvm_ancestor(pid: int) -> int | None:
    """The nearest ``java`` process among ``pid`` and its ancestors (a Python worker's JVM)."""
    while pid > 1:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
                stat = f.read()
        except OSError:
            return None
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        if comm == "java":
            return pid
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return None


def probe_executors(spark: Any, executors: int | None = None, timeout: float = 120) -> dict[str, Any]:
    """Where Spark runs tasks: the driver's JVM and working directory, and for each task of a small job its
    JVM's process id (the executor's), its Python worker's process id and working directory.

    With ``local-cluster[N,...]`` it first waits until ``N`` executors have registered, then runs enough
    short tasks that every executor gets some.
    """
    if __name__ != "__main__":  # imported by a test: executors cannot import this module, pickle it by value
        from pyspark import cloudpickle

        cloudpickle.register_pickle_by_value(sys.modules[__name__])  # type: ignore[no-untyped-call]
    sc = spark.sparkContext
    master = sc.master
    if executors is None and master.startswith("local-cluster["):
        executors = int(master[len("local-cluster[") :].split(",")[0])
    deadline = time.monotonic() + timeout
    while executors and sc._jsc.sc().getExecutorMemoryStatus().size() < executors + 1:  # + the driver
        if time.monotonic() > deadline:
            raise TimeoutError(f"{executors} executors did not register in {timeout}s")
        time.sleep(0.2)

    def where(_: Any) -> tuple[int | None, int, str]:
        time.sleep(0.3)  # keep every executor busy long enough to get tasks
        return (_jvm_ancestor(os.getpid()), os.getpid(), os.getcwd())

    tasks = max(4, 4 * (executors or 1))
    seen = sorted(set(sc.parallelize(range(tasks), tasks).map(where).collect()), key=str)
    return {
        "master": master,
        "driver_jvm": int(sc._jvm.java.lang.ProcessHandle.current().pid()),
        "driver_cwd": os.getcwd(),
        "tasks": [list(t) for t in seen],
    }


# --- used by tests ---------------------------------------------------------------------------------


def start_driver(
    config: dict[str, Any], log_file: Path, env_overrides: dict[str, str | None] | None = None
) -> subprocess.Popen[bytes]:
    """Start a driver process in a new session; its output goes to ``log_file``. ``env_overrides``: variables
    to set in the driver's environment (which its JVM, executors and Python workers inherit), None to unset."""
    env = dict(os.environ)
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # every Spark listener on loopback (local-cluster included)
    for name, value in (env_overrides or {}).items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(HERE), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["PYSPARK_PYTHON"] = sys.executable
    out = open(log_file, "ab")  # noqa: SIM115 - handed to the child
    try:
        return subprocess.Popen(
            [sys.executable, str(HERE / "sink_driver.py"), json.dumps(config)],
            cwd=str(ROOT),
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
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
