"""``txn_core``'s public names load lazily (PEP 562): every one resolves, and a reading process (the Spark
source's driver process, a task) does not import the writing side."""

from __future__ import annotations

import json
import subprocess
import sys

import txn_core


def test_every_public_name_resolves_to_what_its_module_defines() -> None:
    assert set(txn_core._EXPORTS) == set(txn_core.__all__)
    for name in txn_core.__all__:
        module = sys.modules.get(txn_core._EXPORTS[name]) or __import__(txn_core._EXPORTS[name], fromlist=[name])
        assert getattr(txn_core, name) is getattr(module, name), name
    assert set(txn_core.__all__) <= set(dir(txn_core))


def test_an_unknown_name_is_an_attribute_error() -> None:
    try:
        txn_core.NoSuchThing  # noqa: B018
    except AttributeError as exc:
        assert "NoSuchThing" in str(exc)
    else:  # pragma: no cover
        raise AssertionError("no AttributeError")


def test_the_spark_source_imports_no_writer_admin_or_subscription_code() -> None:
    """What the stream source's driver process imports to plan reads (each query starts a fresh one)."""
    code = (
        "import json, sys\n"
        "import spark_txn_source.datasource, spark_txn_source.reader, spark_txn_source.stream\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('txn_core'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    loaded = set(json.loads(out.stdout))
    assert {"txn_core.partition.reader", "txn_core.partition.ranges"} <= loaded  # the check sees what it should
    writing = {
        "txn_core.clients.producer",
        "txn_core.ops.admin",
        "txn_core.clients.consumer",
        "txn_core.clients.subscriptions",
        "txn_core.clients.apptxn",
    }
    assert not loaded & writing, sorted(loaded & writing)


def test_the_read_path_loads_the_crc32c_function_without_the_package_init() -> None:
    """The crc32c package's ``__init__`` imports ``importlib.metadata``, ``argparse`` and ``email`` (~30 ms in
    every fresh process: each Spark worker, each query's driver process, each CLI command)."""
    code = (
        "import json, sys\n"
        "import spark_txn_source.reader, txn_core.format.entry\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('crc32c', 'argparse', 'email'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert json.loads(out.stdout) == ["crc32c._crc32c"]
