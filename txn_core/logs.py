"""The ``txnlog`` logger hierarchy, and switching it on in every process (driver and Spark executors).

Loggers (all under ``txnlog``, so one setting controls them all):

==============================  =====================================================================
``txnlog.coordinator``          INFO: commit and abort decisions, fencing (epoch bumps), timeouts
``txnlog.producer``             WARNING: a producer fenced or failed fatally; INFO: a transaction to abort
``txnlog.snapshots``            INFO: buffer and coordinator snapshots written
``txnlog.damage``               WARNING: offsets passed over as lost (marked lost, or damage a reader
                                chose to skip), and entries marked lost (PROTOCOL.md "Damage")
``txnlog.storage``              INFO: retried and unresolved writes
``txnlog.storage.requests``     DEBUG: every storage request (operation, key, bytes, milliseconds)
``txnlog.spark.sink``           INFO: each micro-batch's commit (committed or replayed, rows, objects)
``txnlog.spark.source``         INFO: each planned micro-batch (offsets, partitions)
==============================  =====================================================================

txnlog never configures logging unless asked: set ``TXNLOG_LOG_LEVEL`` (``INFO``, ``DEBUG``, or per
logger: ``INFO,txnlog.storage.requests=DEBUG``) and every process that imports txnlog, Spark's Python
workers on executors included, writes txnlog's records to standard error with the process id. On a
cluster, pass it to executors with ``--conf spark.executorEnv.TXNLOG_LOG_LEVEL=INFO``; in local mode the
workers inherit the driver's environment. An application that configures ``logging`` itself needs
nothing of this: the loggers propagate to the root logger as usual.
"""

from __future__ import annotations

import logging
import os
import sys

ROOT = "txnlog"
ENV_VAR = "TXNLOG_LOG_LEVEL"
FORMAT = "%(asctime)s %(levelname)s %(name)s [pid %(process)d] %(message)s"
_PACKAGES = {"txn_core": ROOT, "spark_txn_sink": f"{ROOT}.spark.sink", "spark_txn_source": f"{ROOT}.spark.source"}
#: Layer packages of txn_core that loggers do not name: a module's logger is named for what it is
#: (``txnlog.reader``), wherever the layout puts it.
_UNNAMED_LAYERS = ("format.", "partition.", "clients.", "ops.")
_configured: str | None = None


def get_logger(module: str) -> logging.Logger:
    """The txnlog logger for a module name (``txn_core.partition.snapshots`` -> ``txnlog.snapshots``,
    ``txn_core.coordinator.txnlog`` -> ``txnlog.coordinator.txnlog``) or an area name already under
    ``txnlog``."""
    if module == ROOT or module.startswith(ROOT + "."):
        return logging.getLogger(module)
    package, _, rest = module.partition(".")
    base = _PACKAGES.get(package)
    if base is None:
        return logging.getLogger(f"{ROOT}.{module}")
    if package != "txn_core":
        return logging.getLogger(base)  # one logger per connector side
    rest = next((rest[len(layer) :] for layer in _UNNAMED_LAYERS if rest.startswith(layer)), rest)
    return logging.getLogger(f"{base}.{rest}" if rest else base)


def parse_levels(spec: str) -> dict[str, int]:
    """``"INFO,txnlog.storage.requests=DEBUG"`` -> ``{"txnlog": 20, "txnlog.storage.requests": 10}``.

    Raises ``ValueError`` naming a bad part.
    """
    levels: dict[str, int] = {}
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        name, _, level = part.rpartition("=")
        value = logging.getLevelName(level.strip().upper())
        if not isinstance(value, int):
            raise ValueError(f"{ENV_VAR}: {level.strip()!r} is not a log level (DEBUG, INFO, WARNING, ERROR)")
        levels[name.strip() or ROOT] = value
    return levels


def configure_from_env() -> None:
    """Apply ``TXNLOG_LOG_LEVEL`` if set (idempotent; a changed value is applied again)."""
    global _configured
    spec = os.environ.get(ENV_VAR, "").strip()
    if not spec or spec == _configured:
        return
    try:
        levels = parse_levels(spec)
    except ValueError as exc:
        print(f"txnlog: ignoring {exc}", file=sys.stderr)
        return
    root = logging.getLogger(ROOT)
    if not any(getattr(h, "_txnlog", False) for h in root.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(FORMAT))
        handler._txnlog = True  # type: ignore[attr-defined]
        root.addHandler(handler)
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)
    _configured = spec
