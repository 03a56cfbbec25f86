"""What the bounded cache of open partitions costs: appends and reads spread over many
partitions with every partition kept open, next to a cache far smaller than the partitions.

    python benchmarks/partition_handles_bench.py [--dir DIR] [--partitions N] [--runs R]

Each case appends one small durable record to each partition in turn (round robin, so a small
cache closes and reopens a partition for every append: the worst case), then reads each
partition back.  Prints the median of R runs per case and its ratio to "all open", measured in
the same run.  Not a test: it never fails on speed.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from log_store import TopicConfig, open_store

TOPIC = "bench.handles"


def _run(directory: Path, partitions: int, max_open: int, rounds: int) -> tuple[float, float]:
    shutil.rmtree(directory, ignore_errors=True)
    store = open_store(directory, max_open_partitions=max_open)
    try:
        store.create_topic(TOPIC, TopicConfig(partitions=partitions))
        started = time.perf_counter()
        for i in range(rounds):
            for p in range(partitions):
                store.append(TOPIC, p, [b"record %d" % i])
        appends_s = rounds * partitions / (time.perf_counter() - started)
        started = time.perf_counter()
        for p in range(partitions):
            assert len(store.read(TOPIC, p, 0).records) == rounds
        reads_s = partitions / (time.perf_counter() - started)
        return appends_s, reads_s
    finally:
        store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--partitions", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the figures here as JSON")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="handles-bench-", dir=args.dir))
    cases = [("all open", args.partitions), ("max_open 16", 16), ("max_open 1", 1)]
    results: dict[str, list[tuple[float, float]]] = {name: [] for name, _ in cases}
    try:
        for _ in range(args.runs):
            for name, max_open in cases:
                results[name].append(_run(base / "store", args.partitions, max_open, args.rounds))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    base_append = statistics.median(r[0] for r in results["all open"])
    base_read = statistics.median(r[1] for r in results["all open"])
    print(f"{args.partitions} partitions, {args.rounds} rounds, median of {args.runs} runs")
    print(f"{'case':<14} {'appends/s':>10} {'ratio':>6} {'partition reads/s':>18} {'ratio':>6}")
    for name, _ in cases:
        append_s = statistics.median(r[0] for r in results[name])
        read_s = statistics.median(r[1] for r in results[name])
        print(
            f"{name:<14} {append_s:>10.0f} {append_s / base_append:>6.2f} "
            f"{read_s:>18.0f} {read_s / base_read:>6.2f}"
        )
    write_json(args, cases, results)


def write_json(
    args: argparse.Namespace,
    cases: list[tuple[str, int]],
    results: dict[str, list[tuple[float, float]]],
) -> None:
    """The table's figures for ``logbroker bench all`` (see benchmarks/benchmark_results.py)."""
    from benchmark_results import Figure, write

    figures = []
    base = results[cases[0][0]]
    for column, what, unit in ((0, "appends", "appends/s"), (1, "partition reads", "reads/s")):
        for name, _ in cases:
            runs = [r[column] for r in results[name]]
            figure = Figure.of_runs(f"{what}, {args.partitions} partitions, {name}", runs, unit)
            if name != cases[0][0]:
                ratios = [r / b[column] for r, b in zip(runs, base, strict=True)]
                figure.compared("all open", ratios, "percent")
            figures.append(figure)
    write(args.json, "partition_handles", args, figures)


if __name__ == "__main__":
    main()
