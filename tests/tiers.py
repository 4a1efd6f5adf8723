"""Test tiers: the default run samples the exhaustive matrices (README, Development, "Test tiers"), and
every run starts its longest tests first.

A test marked ``@pytest.mark.matrix(keep=N)`` is an exhaustive parametrised matrix (a crash at every storage
operation, a model run per seed, a type for every time zone). The default run keeps ``N`` of its cases,
drawn afresh each run from a seed that the run's header prints; ``TXNLOG_TEST_SEED=S`` draws the same
cases again. ``--all-cases`` runs every case: CI's ``exhaustive`` step (``pytest -m matrix --all-cases``).

The draw is per test function and depends only on the seed and the case ids, so every pytest-xdist worker
keeps the same cases (xdist requires every worker to collect the same tests): the controller picks the seed
and hands it to its workers.
"""

from __future__ import annotations

import os
import random
import re
from collections import defaultdict
from typing import Any

import jvm_archive
import pytest

SEED_ENV = "TXNLOG_TEST_SEED"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--all-cases",
        action="store_true",
        default=False,
        help="run every case of the tests marked matrix (default: a seeded sample of each)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "matrix(keep): an exhaustive parametrised matrix; the default run keeps a seeded sample of `keep` cases "
        "(--all-cases runs them all)",
    )
    worker = getattr(config, "workerinput", None)
    if worker is not None and SEED_ENV in worker:
        seed = int(worker[SEED_ENV])
    else:
        seed = int(os.environ.get(SEED_ENV) or random.SystemRandom().randrange(1, 1_000_000))
    config.stash[_SEED] = seed
    os.environ[SEED_ENV] = str(seed)  # workers started from here inherit it too
    if not re.search(r"(?<!not )\bbench\b", config.option.markexpr or ""):  # no benchmark selected
        # Every JVM the tests start (Spark sessions, drivers, executors, Spark Connect) lives for seconds to
        # minutes: the quick compiler alone and the serial collector spend less CPU on them than the defaults
        # (a CPU-bound CI run on two cores). Benchmarks keep the JVM's defaults, as users run it.
        # With the class-data-sharing archive of Spark's classes a JVM starts in about half the time
        # (tests/jvm_archive.py; `make jvm-archive` writes it).
        os.environ.setdefault("JAVA_TOOL_OPTIONS", f"{jvm_archive.QUICK_JVM} {jvm_archive.use_options()}".strip())


_SEED = pytest.StashKey[int]()


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """pytest-xdist: hand the controller's seed to each worker."""
    node.workerinput[SEED_ENV] = str(node.config.stash[_SEED])


def pytest_report_header(config: pytest.Config) -> str:
    if config.getoption("--all-cases"):
        return "matrices: every case (--all-cases)"
    return f"matrices: a sample of each ({SEED_ENV}={config.stash[_SEED]} draws it again; --all-cases: every case)"


#: Markers of tests that run for minutes (a Spark driver killed and restarted, a notebook, a cluster):
#: collected first, so that workers start them early and the short tests fill the time around them.
LONG = ("chaos", "cluster", "slow", "soak")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: not any(item.get_closest_marker(m) for m in LONG))  # stable: long ones first
    if config.getoption("--all-cases"):
        return
    seed = config.stash[_SEED]
    groups: dict[str, list[pytest.Item]] = defaultdict(list)
    keep_of: dict[str, int] = {}
    for item in items:
        marker = item.get_closest_marker("matrix")
        if marker is None:
            continue
        base = item.nodeid.split("[", 1)[0]
        groups[base].append(item)
        keep_of[base] = int(marker.kwargs.get("keep", marker.args[0] if marker.args else 8))
    if not groups:
        return
    dropped: set[str] = set()
    for base, cases in groups.items():
        keep = keep_of[base]
        if len(cases) <= keep:
            continue
        ids = sorted(c.nodeid for c in cases)
        kept = set(random.Random(f"{seed}:{base}").sample(ids, keep))
        dropped.update(i for i in ids if i not in kept)
    if dropped:
        config.hook.pytest_deselected(items=[i for i in items if i.nodeid in dropped])
        items[:] = [i for i in items if i.nodeid not in dropped]


@pytest.fixture
def matrix_sample(request: pytest.FixtureRequest) -> Any:
    """For a ``matrix`` test that walks its cases in a loop (each case needs the one before, or one setup):
    ``matrix_sample(cases)`` is every case with ``--all-cases``, else a seeded sample of ``keep`` of them in
    their order."""
    marker = request.node.get_closest_marker("matrix")
    keep = int(marker.kwargs.get("keep", marker.args[0] if marker.args else 8)) if marker else 8
    every = bool(request.config.getoption("--all-cases"))
    seed = request.config.stash[_SEED]

    def pick(cases: Any) -> list[Any]:
        population = list(cases)
        if every or len(population) <= keep:
            return population
        chosen = set(random.Random(f"{seed}:{request.node.nodeid}").sample(range(len(population)), keep))
        return [case for i, case in enumerate(population) if i in chosen]

    return pick
