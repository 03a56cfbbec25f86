"""Durable append and read throughput of the embedded log store, next to ``dd`` on the same disk.

    python benchmarks/store_bench.py [--dir DIR] [--seconds S] [--runs N] [--json PATH]

Prints one table row per case with the median of N runs.  Every append is durable (acked only
after the segment's fdatasync).  "1 writer" appends one batch at a time and waits for each
(``LogStore.transact``: the embedded store commits it in the calling thread when no commit is
under way); "N in flight" is one writer thread that keeps N appends submitted
(``LogStore.submit``), as the gateway does with concurrent requests, so that group commit can
merge them.  The ``dd ... conv=fdatasync`` row is the disk's own sequential write speed, measured
in the same run on the same file system; the "sync floor" row is what a loop of plain ``pwrite``
+ ``fdatasync`` of one 200 B case's batch (500 records) reaches with no store at all: the most a
writer that waits for each durable append to a growing file can get on this disk.  The "over
zeros" floor does the same into a file written with zeros first: fdatasync then writes data
only, no file size or extents; it is the bound for a store that writes its segments ahead of the
writer (docs/store.md says why the store does not).
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing as mp
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from benchmark_results import Figure, write

from log_store import TopicConfig, open_store

TOPIC = "bench.store"


def dd_mb_s(directory: Path, mib: int = 1024) -> float:
    target = directory / "dd.bin"
    out = subprocess.run(
        ["dd", "if=/dev/zero", f"of={target}", "bs=1M", f"count={mib}", "conv=fdatasync"],
        capture_output=True,
        text=True,
        check=True,
    ).stderr
    target.unlink()
    match = re.search(r"(\d+) bytes .* copied, ([\d.]+) s", out)
    assert match, out
    return int(match.group(1)) / float(match.group(2)) / 1e6


def _writer(
    data_dir: str,
    partition: int,
    record_bytes: int,
    batch: int,
    seconds: float,
    in_flight: int,
    out: mp.Queue,  # type: ignore[type-arg]
) -> None:
    store = open_store(data_dir)
    values = [b"x" * record_bytes] * batch

    def append_values(_state: object) -> list[bytes]:
        return values

    records = 0
    pending: collections.deque = collections.deque()  # type: ignore[type-arg]
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        if in_flight == 1:  # a writer that waits for each append: the blocking call
            records += store.transact(TOPIC, partition, append_values).count
            continue
        pending.append(store.submit(TOPIC, partition, append_values))
        if len(pending) >= in_flight:
            records += pending.popleft().result().count
    while pending:
        records += pending.popleft().result().count
    elapsed = time.perf_counter() - start
    store.close()
    out.put((records, elapsed))


def append_case(
    directory: Path, writers: int, record_bytes: int, batch: int, seconds: float, in_flight: int
) -> tuple[float, float]:
    """(records/s, MB/s) summed over ``writers`` processes, each on its own partition."""
    data_dir = directory / "store"
    shutil.rmtree(data_dir, ignore_errors=True)
    with open_store(data_dir) as store:
        store.create_topic(TOPIC, TopicConfig(partitions=max(writers, 1)))
    queue: mp.Queue = mp.Queue()  # type: ignore[type-arg]
    procs = [
        mp.Process(
            target=_writer,
            args=(str(data_dir), w, record_bytes, batch, seconds, in_flight, queue),
        )
        for w in range(writers)
    ]
    for p in procs:
        p.start()
    results = [queue.get() for _ in procs]
    for p in procs:
        p.join()
    rate = sum(records / elapsed for records, elapsed in results)
    return rate, rate * record_bytes / 1e6


def sync_floor_case(
    directory: Path, record_bytes: int, batch: int, seconds: float, zeros_first: bool = False
) -> tuple[float, float]:
    """(records/s, MB/s) of writing ``batch`` records' bytes to a file with one fdatasync each.

    The file grows with each write, or with ``zeros_first`` it is 256 MiB of zeros written and
    synced beforehand: its size and blocks then do not change, so each fdatasync writes data
    only (the bound for a store that writes its segments ahead of the writer).
    """
    target = directory / "floor.bin"
    data = b"x" * (record_bytes * batch)
    fd = os.open(target, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    limit = 256 << 20 if zeros_first else 1 << 62
    try:
        if zeros_first:
            zeros = bytes(1 << 20)
            for pos in range(0, limit, len(zeros)):
                os.pwrite(fd, zeros, pos)
            os.fsync(fd)
        appends = 0
        pos = 0
        start = time.perf_counter()
        while time.perf_counter() - start < seconds and pos + len(data) <= limit:
            os.pwrite(fd, data, pos)
            os.fdatasync(fd)
            pos += len(data)
            appends += 1
        elapsed = time.perf_counter() - start
    finally:
        os.close(fd)
        target.unlink()
    rate = appends * batch / elapsed
    return rate, rate * record_bytes / 1e6


def read_case(directory: Path, record_bytes: int, total_bytes: int) -> tuple[float, float]:
    """Read a whole partition from the page cache: (records/s, MB/s)."""
    data_dir = directory / "store"
    shutil.rmtree(data_dir, ignore_errors=True)
    with open_store(data_dir) as store:
        store.create_topic(TOPIC, TopicConfig(partitions=1))
        per_batch = max(1, (1 << 20) // record_bytes)
        values = [b"r" * record_bytes] * per_batch
        for _ in range(total_bytes // (per_batch * record_bytes)):
            store.append(TOPIC, 0, values)
        read_all(store)  # warm the page cache
        start = time.perf_counter()
        records = read_all(store)
        elapsed = time.perf_counter() - start
    return records / elapsed, records * record_bytes / elapsed / 1e6


def read_all(store: object) -> int:
    offset = 0
    count = 0
    while True:
        result = store.read(TOPIC, 0, offset, 4 << 20)  # type: ignore[attr-defined]
        if not result.records:
            return count
        count += len(result.records)
        offset = result.next_offset


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--dir", type=Path, default=None, help="where to write (default: a temp dir)"
    )
    parser.add_argument("--seconds", type=float, default=3.0, help="length of each append run")
    parser.add_argument("--runs", type=int, default=3, help="runs per case; the median is shown")
    parser.add_argument("--dd-mib", type=int, default=1024, help="size of each dd run")
    parser.add_argument("--read-mib", type=int, default=512, help="size of each read case")
    parser.add_argument("--json", type=Path, help="also write the figures here as JSON")
    args = parser.parse_args(argv)
    directory = Path(tempfile.mkdtemp(prefix="store-bench-", dir=args.dir))
    rows: list[tuple[str, str, str, str]] = []
    dd_runs: list[float] = []
    figures: list[Figure] = []
    dd_label = f"dd bs=1M count={args.dd_mib} conv=fdatasync (disk reference)"

    def measure(label: str, case: Callable[[], tuple[float, float]]) -> None:
        """Each run right after a dd run: the ratio is taken pairwise, then the median."""
        runs = []
        for _ in range(args.runs):
            dd = dd_mb_s(directory, args.dd_mib)
            dd_runs.append(dd)
            rate, mb = case()
            runs.append((rate, mb, mb / dd))
        rate = statistics.median(r[0] for r in runs)
        mb = statistics.median(r[1] for r in runs)
        ratio = statistics.median(r[2] for r in runs)
        rows.append((label, f"{rate:,.0f}", f"{mb:,.0f}", f"{ratio:.0%}"))
        # small records are counted in records/s, large ones in MB/s; "of dd" is in bytes
        by_records = "200 B" in label
        figures.append(
            Figure.of_runs(
                label,
                [r[0] if by_records else r[1] for r in runs],
                "records/s" if by_records else "MB/s",
            ).compared("dd", [r[2] for r in runs], "percent")
        )

    try:
        cases = [
            ("append 64 KiB records, 16 per append, 1 writer", 1, 65536, 16, 1),
            ("append 64 KiB records, 16 per append, 1 writer, 4 in flight", 1, 65536, 16, 4),
            ("append 64 KiB records, 16 per append, 4 writer processes", 4, 65536, 16, 1),
            ("append 200 B records, 500 per append, 1 writer", 1, 200, 500, 1),
            ("append 200 B records, 500 per append, 1 writer, 8 in flight", 1, 200, 500, 8),
            ("append 200 B records, 500 per append, 4 writer processes", 4, 200, 500, 1),
        ]
        for label, writers, size, batch, in_flight in cases:
            measure(
                label,
                lambda w=writers, s=size, b=batch, f=in_flight: append_case(
                    directory, w, s, b, args.seconds, f
                ),
            )
        measure(
            "sync floor: pwrite + fdatasync of 500 x 200 B, one at a time (no store)",
            lambda: sync_floor_case(directory, 200, 500, args.seconds),
        )
        measure(
            "sync floor over zeros written ahead: the same into a pre-zeroed file (no store)",
            lambda: sync_floor_case(directory, 200, 500, args.seconds, zeros_first=True),
        )
        for label, size in (
            ("read 64 KiB records (page cache)", 65536),
            ("read 200 B records (page cache)", 200),
        ):
            measure(label, lambda s=size: read_case(directory, s, args.read_mib << 20))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    dd = statistics.median(dd_runs)
    rows.insert(0, (dd_label, "-", f"{dd:,.0f}", "100%"))
    figures.insert(0, Figure.of_runs(dd_label, dd_runs, "MB/s"))
    print(
        f"| case (median of {args.runs}; of dd: median of each run / the dd run before it) "
        "| records/s | MB/s | of dd |"
    )
    print("|---|---:|---:|---:|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    write(args.json, "store", args, figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
