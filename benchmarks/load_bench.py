"""Loader throughput: log lines from the embedded store into Parquet tables on Spark.

    python benchmarks/load_bench.py [--mb 128] [--runs 3] [--master local[2]] [--codec raw]

Writes ``--mb`` MB of 200-byte lines (chunks of 64 KiB, 4 partitions) into a fresh store,
starts Spark once (its start-up is timed apart), then per run: ``logbroker load`` into a fresh
warehouse (read, decode, split lines, write Parquet, commit), and a read-only pass of the same
data through the ``logbroker`` data source into Spark's ``noop`` sink.  MB/s counts log data
(uncompressed line bytes, newlines included).  Prints one row per case, medians of the runs.
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=128, help="log data to load (MB)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--codec", choices=("raw", "gzip", "zstd"), default="raw")
    parser.add_argument("--dir", type=Path, help="work directory (default: a temp dir)")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="load-bench-", dir=args.dir))
    try:
        lines, data_bytes = fill_store(work / "store", args.mb * 1_000_000, args.codec)

        started = time.perf_counter()
        from yt_loader.load_job import LoadConfig, run_load
        from yt_loader.log_source import SourceSpec
        from yt_loader.spark_session import build_session

        spark = build_session(args.master, app_name="logbroker load bench")
        spark.range(1).count()
        startup_s = time.perf_counter() - started

        load_s: list[float] = []
        read_s: list[float] = []
        for run in range(args.runs):
            config = LoadConfig(SourceSpec(data_dir=str(work / "store")), work / f"wh{run}")
            t0 = time.perf_counter()
            report = run_load(spark, config, lambda _line: None)
            load_s.append(time.perf_counter() - t0)
            assert report.lines == lines, (report.lines, lines)

            t0 = time.perf_counter()
            (
                spark.read.format("logbroker")
                .option("data_dir", str(work / "store"))
                .load()
                .write.format("noop")
                .mode("overwrite")
                .save()
            )
            read_s.append(time.perf_counter() - t0)
        spark.stop()

        mb = data_bytes / 1e6
        print(
            f"logbroker load bench: {mb:.0f} MB, {lines} lines of {LINE_BYTES} B, "
            f"codec {args.codec}, {PARTITIONS} partitions, master {args.master}, "
            f"median of {args.runs} runs"
        )
        print(f"{'case':<44} {'seconds':>8} {'lines/s':>12} {'MB/s':>8}")
        print(
            f"{'Spark start-up (JVM, session, first job)':<44} {startup_s:>8.2f} {'':>12} {'':>8}"
        )
        for name, times in (
            ("load: store -> Parquet tables, committed", load_s),
            ("read only: data source -> noop sink", read_s),
        ):
            t = statistics.median(times)
            print(f"{name:<44} {t:>8.2f} {lines / t:>12,.0f} {mb / t:>8.1f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
