"""The storage round trips of a Spark txnlog -> txnlog streaming copy's micro-batch, without Spark.

Runs the driver's side of each micro-batch exactly as Spark calls it -- the source's ``latestOffset`` and
``partitions`` (:class:`spark_txn_source.stream.TxnLogStreamReader`), then the sink's commit
(:func:`spark_txn_sink.commit.commit_batch`, with the batch's group offsets and start) -- and the tasks
in between (each reads its planned range and stages one object, all tasks at once), on a local log whose
every request goes through :class:`latency_storage.DelayedStorage`. Each phase reports its requests and its
wall time in round trips (wall / rtt: the requests it pays one after another).

Used by ``tests/test_spark_batch_requests.py`` (request counts, no time) and runnable as a report::

    .venv/bin/python tests/spark_batch_rtt.py [--rtt-ms 25] [--batches 6]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import pyarrow as pa

from txn_core.clock import system_clock

sys.path.insert(0, str(Path(__file__).parent))

from latency_storage import DelayedStorage

import txn_core
from txn_core.partition.partition import PartitionLog
from txn_core.partition.ranges import read_range
from txn_core.partition.staging import StagedRef, write_staged
from txn_core.storage import Storage, open_storage
from txn_core.storage.parallel import parallel_map

SCHEMA = pa.schema([("id", pa.int64()), ("key", pa.string())])
#: ``finish``: the commit's markers and cleanup, which run behind the returned commit (counted, off the
#: batch's path: waited for only to count them)
PHASES = ("latestOffset", "partitions", "tasks", "commit", "finish")
#: the phases a micro-batch waits for, one after another
ON_PATH = ("latestOffset", "partitions", "tasks", "commit")


@dataclass
class Phase:
    requests: Counter[str] = field(default_factory=Counter)
    rtt: float = 0.0
    wall_s: float = 0.0

    @property
    def total(self) -> int:
        return sum(self.requests.values())


class Meter:
    """One shared counter over every DelayedStorage the copy opens (source, sink, tasks)."""

    def __init__(self, rtt_s: float, *, simulate: bool = True) -> None:
        self.rtt_s = rtt_s
        self.simulate = simulate  # add rtt_s to each request (local disk), or only count (a real store)
        self.stores: list[DelayedStorage] = []

    def wrap(self, storage: Storage) -> Storage:
        delayed = DelayedStorage(storage, self.rtt_s if self.simulate else 0.0)
        self.stores.append(delayed)
        return delayed

    def counts(self) -> Counter[str]:
        out: Counter[str] = Counter()
        for s in self.stores:
            out.update(s.counts)
        return out

    @contextmanager
    def phase(self, into: Phase) -> Iterator[None]:
        before = self.counts()
        t0 = time.perf_counter()
        yield
        wall = time.perf_counter() - t0
        into.wall_s += wall
        into.rtt += wall / self.rtt_s if self.rtt_s else 0.0
        into.requests.update(self.counts() - before)


def produce(log: txn_core.Log, first: int, rows: int, partitions: int) -> None:
    """One input transaction of ``rows`` rows spread evenly over the partitions."""
    p = log.producer("input-generator")
    p.init_transactions()
    p.begin_transaction()
    per = rows // partitions
    for part in range(partitions):
        ids = list(range(first + part * per, first + (part + 1) * per))
        p.send("in", pa.table({"id": ids, "key": [f"k{i % 7}" for i in ids]}, schema=SCHEMA), partition=part)
    p.commit_transaction()
    p.close()


def _dotted(options: dict[str, Any], prefix: str) -> dict[str, str]:
    """``{"a": {"b": 1}}`` as the connector's dotted options ``{"<prefix>a.b": "1"}``."""
    out: dict[str, str] = {}
    for k, v in options.items():
        if isinstance(v, dict):
            out.update(_dotted(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v if isinstance(v, str) else json.dumps(v)
    return out


def run(
    *,
    rtt_s: float = 0.0,
    batches: int = 6,
    rows: int = 8000,
    partitions: int = 4,
    root: str | None = None,
    url: str | None = None,
    storage_options: dict[str, Any] | None = None,
) -> list[dict[str, Phase]]:
    """Run ``batches`` micro-batches of ``rows`` rows; the phases of each, in order.

    By default on a local log whose requests each sleep ``rtt_s``; with ``url`` (and ``storage_options``)
    on that store as it is, ``rtt_s`` being its measured round trip (``tests/bench_round_trips.py``)."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from spark_txn_sink import commit as commit_module
    from spark_txn_sink.commit import BatchIdentity, GroupPosition, commit_batch
    from spark_txn_sink.options import parse_sink_options
    from spark_txn_source.options import parse_options
    from spark_txn_source.stream import TxnLogStreamReader

    if root is None:  # a directory of our own, removed afterwards
        with tempfile.TemporaryDirectory(prefix="txnlog-batch-rtt-") as tmp:
            return run(
                rtt_s=rtt_s,
                batches=batches,
                rows=rows,
                partitions=partitions,
                root=tmp,
                url=url,
                storage_options=storage_options,
            )
    tmp = root
    simulate = url is None
    url = url or str(Path(tmp) / "log")
    storage_options = storage_options or {}
    log = txn_core.open_log(url, storage_options)
    log.create_topic("in", partitions, SCHEMA)
    log.create_topic("out", partitions, SCHEMA)
    for b in range(3):  # some history
        produce(log, -(b + 1) * rows, rows, partitions)
    meter = Meter(rtt_s, simulate=simulate)
    extra = _dotted(storage_options, "storage.")

    def wrapped(target: Callable[..., Storage]) -> Callable[..., Storage]:
        return lambda *a, **k: meter.wrap(target(*a, **k))

    src_opts = parse_options(
        {"path": url, "topic": "in", "startingOffsets": "group", "consumerGroup": "cg", **extra}, streaming=True
    )
    # Rolling is off: it runs on a thread of its own, off the batch's path, and would mix its requests into
    # whichever phase it overlaps (tests/bench_history.py measures it).
    sink_opts = parse_sink_options(
        {
            "path": url,
            "topic": "out",
            "consumerGroup": "cg",
            "checkpointLocation": str(Path(tmp) / "chk"),
            "rollEntries": "0",
            **extra,
        },
        streaming=True,
    )
    results: list[dict[str, Phase]] = []
    with (
        mock.patch("spark_txn_source.planning.open_storage", wrapped(open_storage)),
        mock.patch("spark_txn_sink.commit.open_storage", wrapped(open_storage)),
    ):
        reader = TxnLogStreamReader(src_opts, None)  # type: ignore[arg-type]
        start = reader.initialOffset()
        task_storage = meter.wrap(open_storage(url, storage_options))
        for n in range(batches):
            produce(log, n * rows, rows, partitions)
            phases = {name: Phase() for name in PHASES}
            with meter.phase(phases["latestOffset"]):
                end = reader.latestOffset(start, ReadAllAvailable())
            with meter.phase(phases["partitions"]):
                planned = reader.partitions(start, end)
            ident = BatchIdentity("spark-sink-group-cg", query_id="q", batch_id=n, topic=sink_opts.topic)

            def task(i_part: tuple[int, Any], ident: BatchIdentity = ident) -> StagedRef | None:
                i, part = i_part
                batches_ = [
                    b.select(["id", "key"])
                    for rng in part.ranges
                    for b in read_range(PartitionLog(task_storage, rng.path, clock=system_clock), rng)
                ]
                return write_staged(
                    task_storage,
                    ident.prefix,
                    "out",
                    i % partitions,
                    [pa.RecordBatch.from_arrays(b.columns, schema=SCHEMA) for b in batches_],
                    SCHEMA,
                    tag=f"t{i}a0",
                    clock=system_clock,
                )

            with meter.phase(phases["tasks"]):
                refs = [r for r in parallel_map(task, list(enumerate(planned))) if r is not None]
            ends = {(k, int(p)): o for k, parts in end["topics"].items() for p, o in parts.items()}
            starts = {
                (k, int(p)): o for k, parts in (end.get("start") or start["topics"]).items() for p, o in parts.items()
            }
            position = GroupPosition(ends, starts)

            def group_offsets(_url: str, pos: GroupPosition = position) -> GroupPosition:
                return pos

            with meter.phase(phases["commit"]):
                committed = commit_batch(sink_opts, ident, refs, group_offsets)
            with meter.phase(phases["finish"]):
                committed.deleted  # noqa: B018 (waits for the finish running behind)
            reader.commit(end)
            start = end
            results.append(phases)
        commit_module._forget(sink_opts)  # closes the kept producer: its last Complete is written
    return results


def table(results: list[dict[str, Phase]], rtt_s: float) -> str:
    lines = [
        f"| batch | {' | '.join(f'{p} req / RTT' for p in PHASES)} | driver req / RTT | micro-batch RTT |",
        "|---:|" + "---:|" * (len(PHASES) + 2),
    ]
    for i, phases in enumerate(results):
        driver = [phases[p] for p in ("latestOffset", "partitions", "commit", "finish")]
        cells = [f"{phases[p].total} / {phases[p].rtt:.1f}" for p in PHASES]
        path = sum(phases[p].rtt for p in ON_PATH)
        lines.append(
            f"| {i} | {' | '.join(cells)} | {sum(d.total for d in driver)} / {sum(d.rtt for d in driver):.1f} "
            f"| {path:.1f} |"
        )
    last = results[-1]
    lines.append("")
    lines.append(
        "requests by kind in the last batch: "
        + "; ".join(f"{p}: {dict(sorted(last[p].requests.items()))}" for p in PHASES)
    )
    return "\n".join(lines)


def attributable(with_latency: list[dict[str, Phase]], without: list[dict[str, Phase]], rtt_s: float) -> str:
    """The latency-attributable part of each steady micro-batch (batch 2 on), as the issue measures it: the
    wall time on the batch's path with the added round trip less the same batch's without it, in RTT."""
    lines = ["| batch | " + " | ".join(ON_PATH) + " | micro-batch |", "|---:|" + "---:|" * (len(ON_PATH) + 1)]
    for i, (lat, base) in enumerate(zip(with_latency, without, strict=True)):
        if i < 2:
            continue  # the first two open the logs and warm the caches
        parts = [(lat[p].wall_s - base[p].wall_s) / rtt_s for p in ON_PATH]
        lines.append(f"| {i} | " + " | ".join(f"{x:.2f}" for x in parts) + f" | {sum(parts):.2f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rtt-ms", type=float, default=25.0)
    ap.add_argument("--batches", type=int, default=6)
    ap.add_argument(
        "--baseline",
        action="store_true",
        help="also run without the added round trip and report the latency-attributable part of each batch",
    )
    args = ap.parse_args()
    rtt = args.rtt_ms / 1000
    results = run(rtt_s=rtt, batches=args.batches)
    print(table(results, rtt))
    if args.baseline:
        print()
        print(attributable(results, run(rtt_s=0.0, batches=args.batches), rtt))


if __name__ == "__main__":
    main()
