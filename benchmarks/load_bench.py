"""Loader throughput against Spark's own ceiling: the log into a Delta table, on ``local[2]``
and on a 2-worker standalone cluster, each beside a plain Parquet copy of the same data.

    python benchmarks/load_bench.py [--mb 256] [--runs 3] [--masters local,cluster] [--codec raw]
        [--json PATH]

Writes ``--mb`` MB of 200-byte lines (chunks of 64 KiB, 4 partitions) into a fresh store. Then,
per master (``local[2]``; a master and two 1-core workers started from the installed PySpark,
executors of 1 GiB), starts Spark once and times apart what a fresh ``logbroker load`` process
pays before its first batch: the session (JVM, Delta's jars, executors, a first job) and a
first small load (Delta's table creation and class loading).  Then per run, once running:

- ``load``: ``logbroker load`` into an empty Delta table (read, decode, split lines, write
  Parquet, one Delta commit with the offsets);
- ``load, Parquet warehouse``: the same with ``--table-format parquet``;
- ``ceiling``: ``spark.read.parquet(<the loaded table's files>).write.parquet(...)`` of the same
  rows: what Spark itself needs to read and write that data, the peer of the load;
- ``read only``: the ``logbroker`` data source into Spark's ``noop`` sink.

MB/s counts log data (uncompressed line bytes, newlines included) for every case, so the rows
compare directly.  Prints one table per master, medians of the runs, and load/ceiling.
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import zstandard
from benchmark_results import Figure, write

from log_store import TopicConfig, open_store
from session_dedup.envelope import EnvelopeWriter

TOPIC = "dc1.bench-access"
LINE_BYTES = 200
CHUNK_BYTES = 64 * 1024
PARTITIONS = 4


def _compress(codec: str, data: bytes) -> bytes:
    if codec == "gzip":
        return gzip.compress(data, compresslevel=1)
    if codec == "zstd":
        return zstandard.ZstdCompressor(level=1).compress(data)
    return data


def fill_store(data_dir: Path, total_bytes: int, codec: str) -> tuple[int, int]:
    """Append about ``total_bytes`` of lines; returns (lines, bytes) written."""
    lines_per_chunk = CHUNK_BYTES // LINE_BYTES
    now = int(time.time() * 1000)
    written_lines = written_bytes = 0
    with open_store(data_dir) as store:
        store.create_topic(TOPIC, TopicConfig(partitions=PARTITIONS))
        writers = [
            EnvelopeWriter(
                source_id=f"bench-host{p}:/var/log/access.log",
                server=f"bench-host{p}",
                file="/var/log/access.log",
                log_type="bench-access",
                codec=codec,
            )
            for p in range(PARTITIONS)
        ]
        seqno = 0
        while written_bytes < total_bytes:
            for p in range(PARTITIONS):
                values = []
                for _ in range(64):
                    seqno += 1
                    prefix = f"{seqno:012d} GET /index.html 200 "
                    line = (prefix + "x" * (LINE_BYTES - len(prefix) - 1) + "\n").encode()
                    data = line * lines_per_chunk
                    values.append(writers[p].encode(seqno, now, now, _compress(codec, data)))
                    written_lines += lines_per_chunk
                    written_bytes += len(data)
                store.append(TOPIC, p, values)
    return written_lines, written_bytes


def _median(times: list[float]) -> float:
    return statistics.median(times)


def _measure(
    master_name: str,
    spark: object,
    store: Path,
    work: Path,
    runs: int,
    lines: int,
) -> dict[str, list[float]]:
    from yt_loader.delta_table import DeltaTarget
    from yt_loader.load_job import LoadConfig, run_load
    from yt_loader.log_source import SourceSpec

    times: dict[str, list[float]] = {
        "load": [],
        "load, Parquet warehouse": [],
        "ceiling": [],
        "read only": [],
    }
    for run in range(runs):
        table = work / f"{master_name}-table{run}"
        DeltaTarget(spark, table)._create_if_absent()  # type: ignore[arg-type]
        for name, table_format, target in (
            ("load", "delta", table),
            ("load, Parquet warehouse", "parquet", work / f"{master_name}-wh{run}"),
        ):
            config = LoadConfig(
                SourceSpec(data_dir=str(store)),
                target,
                table_format=table_format,  # type: ignore[arg-type]
            )
            t0 = time.perf_counter()
            report = run_load(spark, config, lambda _line: None)  # type: ignore[arg-type]
            times[name].append(time.perf_counter() - t0)
            assert report.lines == lines, (report.lines, lines)

        t0 = time.perf_counter()
        (
            spark.read.parquet(str(table))  # type: ignore[attr-defined]
            .write.mode("overwrite")
            .parquet(str(work / f"{master_name}-copy{run}"))
        )
        times["ceiling"].append(time.perf_counter() - t0)

        t0 = time.perf_counter()
        (
            spark.read.format("logbroker")  # type: ignore[attr-defined]
            .option("data_dir", str(store))
            .load()
            .write.format("noop")
            .mode("overwrite")
            .save()
        )
        times["read only"].append(time.perf_counter() - t0)
        for path in work.glob(f"{master_name}-*{run}"):
            shutil.rmtree(path, ignore_errors=True)
    return times


def _first_load(spark: object, work: Path, master_name: str) -> float:
    """Seconds of a first load of a few lines into a new table in this JVM."""
    from yt_loader.load_job import LoadConfig, run_load
    from yt_loader.log_source import SourceSpec

    store = work / f"{master_name}-small-store"
    with open_store(store) as small:
        small.create_topic(TOPIC, TopicConfig(partitions=1))
        writer = EnvelopeWriter(
            source_id="warm:/x", server="warm", file="/x", log_type="bench-access"
        )
        now = int(time.time() * 1000)
        small.append(TOPIC, 0, [writer.encode(1, now, now, b"first line\n")])
    config = LoadConfig(SourceSpec(data_dir=str(store)), work / f"{master_name}-small-table")
    started = time.perf_counter()
    run_load(spark, config, lambda _line: None)  # type: ignore[arg-type]
    return time.perf_counter() - started


def _print_table(
    title: str,
    startup_s: float,
    first_s: float,
    times: dict[str, list[float]],
    lines: int,
    mb: float,
) -> None:
    print(title)
    print(f"{'case':<52} {'seconds':>8} {'lines/s':>12} {'MB/s':>8}")
    print(f"{'start-up: JVM, Delta jars, session, executors, a job':<52} {startup_s:>8.2f}")
    print(f"{'start-up: first load into a new table (one line)':<52} {first_s:>8.2f}")
    for name, label in (
        ("load", "load: store -> Delta table, committed"),
        ("load, Parquet warehouse", "load: store -> Parquet warehouse, committed"),
        ("ceiling", "ceiling: spark.read.parquet(same rows).write"),
        ("read only", "read only: data source -> noop sink"),
    ):
        t = _median(times[name])
        print(f"{label:<52} {t:>8.2f} {lines / t:>12,.0f} {mb / t:>8.1f}")
    ratio = _median(times["ceiling"]) / _median(times["load"])
    print(f"load / ceiling: {100 * ratio:.0f}% (goal >= 60%)")
    print()


def _figures(
    master: str, startup_s: float, times: dict[str, list[float]], mb: float
) -> list[Figure]:
    """The table of one master as figures: MB/s of log data per case, the load against Spark's
    own ceiling run by run."""
    figures = [
        Figure.of_runs(f"Spark {master}: start-up (JVM, Delta jars, a job)", [startup_s], "s")
    ]
    for name, label in (
        ("load", "load: store -> Delta table, committed"),
        ("load, Parquet warehouse", "load: store -> Parquet warehouse, committed"),
        ("ceiling", "ceiling: spark.read.parquet(same rows).write"),
        ("read only", "read only: data source -> noop sink"),
    ):
        figure = Figure.of_runs(f"Spark {master}, {label}", [mb / t for t in times[name]], "MB/s")
        if name == "load":
            ratios = [c / t for c, t in zip(times["ceiling"], times["load"], strict=True)]
            figure.compared("ceiling", ratios, "percent")
        figures.append(figure)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=256, help="log data to load (MB)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--masters", default="local,cluster", help="local, cluster or both")
    parser.add_argument("--codec", choices=("raw", "gzip", "zstd"), default="raw")
    parser.add_argument("--dir", type=Path, help="work directory (default: a temp dir)")
    parser.add_argument("--json", type=Path, help="also write the figures here as JSON")
    args = parser.parse_args()
    figures: list[Figure] = []

    from yt_loader.spark_session import LOOPBACK, build_session
    from yt_loader.standalone_cluster import StandaloneCluster

    work = Path(tempfile.mkdtemp(prefix="load-bench-", dir=args.dir))
    try:
        store = work / "store"
        lines, data_bytes = fill_store(store, args.mb * 1_000_000, args.codec)
        mb = data_bytes / 1e6
        print(
            f"logbroker load bench: {mb:.0f} MB, {lines} lines of {LINE_BYTES} B, "
            f"codec {args.codec}, {PARTITIONS} partitions, median of {args.runs} runs"
        )
        print()
        for master_name in args.masters.split(","):
            cluster: StandaloneCluster | None = None
            try:
                started = time.perf_counter()
                if master_name == "local":
                    master, conf = "local[2]", {}
                else:
                    cluster = StandaloneCluster(work / "cluster", workers=2, cores=1).start()
                    master = cluster.master_url
                    conf = {
                        "spark.driver.host": LOOPBACK,
                        "spark.driver.bindAddress": LOOPBACK,
                        "spark.executor.memory": "1g",
                        "spark.ui.enabled": "false",
                    }
                cluster_s = time.perf_counter() - started
                started = time.perf_counter()
                spark = build_session(master, app_name="logbroker load bench", conf=conf)
                spark.sparkContext.parallelize(range(4), 4).count()
                startup_s = time.perf_counter() - started
                first_s = _first_load(spark, work, master_name)
                times = _measure(master_name, spark, store, work, args.runs, lines)
                spark.stop()
            finally:
                if cluster is not None:
                    cluster.stop()
            title = f"master {master}" + (
                f" (2 workers x 1 core; the cluster itself took {cluster_s:.1f} s to start)"
                if cluster is not None
                else ""
            )
            _print_table(title, startup_s, first_s, times, lines, mb)
            where = "local[2]" if cluster is None else "standalone, 2 workers x 1 core"
            figures += _figures(where, startup_s, times, mb)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    write(args.json, "load", args, figures)


if __name__ == "__main__":
    main()
