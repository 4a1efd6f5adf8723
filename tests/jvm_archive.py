"""A class-data-sharing archive of the Spark driver's classes for the JVMs the tests start.

Every Spark JVM the tests start (the shared session, each chaos test's drivers, Spark Connect, the README's
and notebooks' jobs) loads the same ten thousand classes from Spark's jars, and parsing and verifying them
is about half of a session's start (measured idle: 9.6 s to a session without the archive, 4.7 s with it;
twice that on a loaded machine). Java's dynamic CDS archive (JDK 13+) keeps those classes mapped from one
file instead.

- **Dump.** ``python tests/jvm_archive.py`` (``make jvm-archive``; ``.ci/run`` runs it beside ``make lint``)
  starts a Spark session whose driver JVM writes the archive when it exits (``-XX:ArchiveClassesAtExit``,
  given to that JVM only: :func:`dump_options`), after a write and a read through the txnlog format
  (:func:`warm_up`), then ends that JVM and moves the file into place atomically (:func:`finish_dump`): a
  dump killed midway leaves only a temporary file, never a truncated archive under the final name. The
  test run itself never dumps: a dump costs a JVM about 40 s at its exit, more than a run's JVMs gain.
- **Use.** Later runs put ``-XX:SharedArchiveFile`` in ``JAVA_TOOL_OPTIONS`` (:func:`use_options`), which
  every JVM started below the test process inherits. A JVM whose class path does not start with the
  dumping driver's (Spark's launcher) ignores the archive; its warnings are switched off.
- **Key.** The archive's name carries the PySpark version and the Java binary's path and size: an upgrade
  of either dumps a new one (a mismatched archive would only be ignored).

The archive lives in ``.cache/jvm/`` of the checkout (ignored by git); it only changes how fast JVMs
start, never what they do.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CACHE = Path(__file__).resolve().parent.parent / ".cache" / "jvm"
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"
#: The JVM options of every JVM the tests start (tests/tiers.py), and of the dumping one: the quick compiler
#: only and the serial collector spend less CPU on JVMs that live for seconds to minutes.
QUICK_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def _java() -> Path | None:
    home = os.environ.get("JAVA_HOME")
    found = Path(home) / "bin" / "java" if home else None
    if found is None or not found.exists():
        which = shutil.which("java")
        found = Path(which) if which else None
    return found.resolve() if found is not None else None


def archive_path() -> Path | None:
    """Where this machine's archive is (or will be); None when no Java is found."""
    import pyspark

    java = _java()
    if java is None:
        return None
    key = hashlib.sha256(f"{java}:{java.stat().st_size}:{pyspark.__version__}".encode()).hexdigest()[:16]
    return CACHE / f"spark-{pyspark.__version__}-{key}.jsa"


def use_options() -> str:
    """``JAVA_TOOL_OPTIONS`` additions that map the archive, or "" when there is none yet."""
    if not any(CACHE.glob("*.jsa")):  # no archive: do not import pyspark at every test run's start
        return ""
    path = archive_path()
    if path is None or not path.exists():
        return ""
    return f"-XX:SharedArchiveFile={path} {QUIET}"


def dump_options() -> tuple[str, Path] | None:
    """``spark.driver.extraJavaOptions`` that make the driver JVM dump the archive at its exit, with the
    temporary file it writes; None when an archive exists or no Java is found."""
    path = archive_path()
    if path is None or path.exists() or "SharedArchiveFile" in os.environ.get("JAVA_TOOL_OPTIONS", ""):
        return None
    CACHE.mkdir(parents=True, exist_ok=True)
    for stale in [*CACHE.glob("*.tmp"), *CACHE.glob("*.lock")]:  # left by a run killed before its JVM ended
        with contextlib.suppress(OSError):
            if time.time() - stale.stat().st_mtime > 3600:
                stale.unlink()
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:  # one dumping JVM at a time
        fd = os.open(path.with_name(f"{path.name}.lock"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return None
    os.close(fd)
    return f"-XX:ArchiveClassesAtExit={tmp} {QUIET}", tmp


def finish_dump(gateway: object, tmp: Path) -> None:
    """End the driver JVM behind ``gateway`` (PySpark's gateway exits when its stdin closes), wait for its
    dump, and move the archive into place; a failed or missing dump is simply not used."""
    proc = getattr(gateway, "proc", None)
    if proc is None:
        return
    try:
        if proc.stdin is not None:
            proc.stdin.close()
        proc.wait(timeout=120)
    except Exception:
        return
    path = archive_path()
    if path is not None and proc.returncode == 0 and tmp.exists() and tmp.stat().st_size > 0:
        os.replace(tmp, path)
    else:
        tmp.unlink(missing_ok=True)
    if path is not None:
        path.with_name(f"{path.name}.lock").unlink(missing_ok=True)


def warm_up(session: Any) -> None:
    """A first write and read through the txnlog format: the session's one-time costs (its first Python
    workers, the data source's first planning) are paid, and the classes of that path loaded."""
    with tempfile.TemporaryDirectory(prefix="txnlog-warm-up-") as root:
        url = f"file://{root}/log"
        frame = session.createDataFrame([(1, "a")], "id long, k string")
        frame.write.format("txnlog").option("topic", "w").option("partitions", "1").mode("append").save(url)
        assert session.read.format("txnlog").option("topic", "w").load(url).count() == 1


def main() -> int:
    """Write this machine's archive if it has none (about a minute, mostly on one core)."""
    os.environ["JAVA_TOOL_OPTIONS"] = QUICK_JVM  # the options of the JVMs that will map it
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    dump = dump_options()
    if dump is None:
        print(f"JVM class archive: {archive_path() or 'no Java found'} (present, or being written)")
        return 0
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    import spark_txn_source

    session = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.extraJavaOptions", dump[0])
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    spark_txn_source.register(session)
    warm_up(session)
    session.stop()
    finish_dump(SparkContext._gateway, dump[1])
    print(f"JVM class archive: {archive_path()} written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
