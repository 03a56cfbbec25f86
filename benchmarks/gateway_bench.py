"""Gateway ingest benchmark: a real ``logbroker serve`` fed over loopback HTTP by load processes.

    python benchmarks/gateway_bench.py [--seconds 5] [--workers 1] [--load-processes 2]
        [--skip-sessions] [--json PATH]

Measures, on a fresh data directory (fsync on every commit, as in production):
  * MB/s and chunks/s with 64 KiB chunks and with 4 KiB chunks, many sources, many chunks per
    request over keep-alive connections (binary framing);
  * ack latency p50/p99 (planned send -> ack received, i.e. after the fsync) at half of the
    4 KiB peak chunk rate, in 32-chunk requests paced open-loop over 4x the connections, with
    the gateway's own view of the same from its ``logbroker_ack_latency_seconds`` histogram;
  * session open latency p50/p99 with 100,000 sources in one partition.
Prints a table.  Load generators are separate processes using ``http.client``.
"""

from __future__ import annotations

import argparse
import http.client
import multiprocessing
import os
import random
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import orjson
from benchmark_results import Figure, write

REPO = Path(__file__).resolve().parent.parent
MAGIC = b"LBW1"
_CHUNK = struct.Struct(">QqI")
BINARY = "application/x-logbroker-chunks"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_gateway(data_dir: Path, port: int, workers: int, partitions: int) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "ops",
        "serve",
        "--data-dir",
        str(data_dir),
        "--port",
        str(port),
        "--workers",
        str(workers),
        "--partitions",
        str(partitions),
    ]
    log_path = data_dir.with_suffix(".log")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            conn.request("GET", "/healthz")
            healthy = conn.getresponse().status == 200
            conn.close()
            if healthy:
                return proc
        except (OSError, http.client.HTTPException):
            pass  # not listening yet: try again below
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"gateway did not start: {log_path.read_text(errors='replace')[-2000:]}")


def stop_gateway(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


def section(meta: bytes, first_seqno: int, count: int, data: bytes) -> bytes:
    """A binary write section of one source: ``count`` chunks of ``data`` from
    ``first_seqno``."""
    return section_of(meta, first_seqno, [data] * count)


def section_of(meta: bytes, first_seqno: int, datas: list[bytes]) -> bytes:
    """A binary write section of one source: ``datas`` as chunks from ``first_seqno``."""
    parts = [struct.pack(">H", len(meta)), meta, struct.pack(">I", len(datas))]
    header = _CHUNK.pack
    for seqno, data in enumerate(datas, first_seqno):
        parts.append(header(seqno, 0, len(data)))
        parts.append(data)
    return b"".join(parts)


@dataclass
class LoadResult:
    chunks: int
    data_bytes: int
    latencies_s: list[float]
    errors: int


def load_process(
    port: int,
    worker_id: int,
    connections: int,
    sources_per_request: int,
    chunks_per_source: int,
    chunk_bytes: int,
    seconds: float,
    requests_per_s: float | None,
    queue: multiprocessing.Queue,
) -> None:
    """One load process: ``connections`` threads, each a keep-alive connection."""
    import threading

    data = (b"x" * (chunk_bytes - 1)) + b"\n"
    results: list[LoadResult] = []
    lock = threading.Lock()
    start_at = time.monotonic() + 0.2
    stop_at = start_at + seconds

    def run(conn_id: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        metas = [
            orjson.dumps(
                {
                    "log_type": "bench",
                    "source_id": f"w{worker_id}-c{conn_id}-s{i}",
                    "server": f"host{worker_id}",
                    "file": "/var/log/bench.log",
                }
            )
            for i in range(sources_per_request)
        ]
        seqno = 1
        chunks = 0
        data_bytes = 0
        errors = 0
        latencies: list[float] = []
        interval = None if requests_per_s is None else connections / requests_per_s
        next_send = start_at + (random.random() * interval if interval else 0)
        while time.monotonic() < start_at:
            time.sleep(0.005)
        while True:
            now = time.monotonic()
            if now >= stop_at:
                break
            if interval is not None:
                if now < next_send:
                    time.sleep(next_send - now)
                # open loop: latency counts from the planned send time
                sent = next_send
                next_send += interval
            else:
                sent = now
            body = MAGIC + b"".join(section(m, seqno, chunks_per_source, data) for m in metas)
            seqno += chunks_per_source
            conn.request("POST", "/v1/write", body=body, headers={"Content-Type": BINARY})
            response = conn.getresponse()
            payload = response.read()
            done = time.monotonic()
            if response.status != 200:
                errors += 1
                continue
            answer = orjson.loads(payload)
            n = sum(len(r["acks"]) for r in answer["results"])
            chunks += n
            data_bytes += n * chunk_bytes
            latencies.append(done - sent)
        conn.close()
        with lock:
            results.append(LoadResult(chunks, data_bytes, latencies, errors))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(connections)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    queue.put(
        LoadResult(
            sum(r.chunks for r in results),
            sum(r.data_bytes for r in results),
            [x for r in results for x in r.latencies_s],
            sum(r.errors for r in results),
        )
    )


def run_load(
    port: int,
    *,
    processes: int,
    connections: int,
    sources_per_request: int,
    chunks_per_source: int,
    chunk_bytes: int,
    seconds: float,
    requests_per_s: float | None = None,
) -> tuple[float, float, list[float], int]:
    """Returns (MB/s, chunks/s, request latencies, errors) over all load processes."""
    queue: multiprocessing.Queue = multiprocessing.Queue()
    per_process_rate = None if requests_per_s is None else requests_per_s / processes
    procs = [
        multiprocessing.Process(
            target=load_process,
            args=(
                port,
                w,
                connections,
                sources_per_request,
                chunks_per_source,
                chunk_bytes,
                seconds,
                per_process_rate,
                queue,
            ),
        )
        for w in range(processes)
    ]
    for p in procs:
        p.start()
    results = [queue.get() for _ in procs]
    for p in procs:
        p.join()
    chunks = sum(r.chunks for r in results)
    data_bytes = sum(r.data_bytes for r in results)
    latencies = sorted(x for r in results for x in r.latencies_s)
    return (
        data_bytes / seconds / 1e6,
        chunks / seconds,
        latencies,
        sum(r.errors for r in results),
    )


def ack_histogram(port: int) -> dict[float, int]:
    """Cumulative bucket counts of the gateway's own ack latency histogram (one worker)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    buckets: dict[float, int] = {}
    for line in text.splitlines():
        if line.startswith("logbroker_ack_latency_seconds_bucket"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            buckets[float("inf") if le == "+Inf" else float(le)] = int(
                float(line.rsplit(" ", 1)[1])
            )
    return buckets


def histogram_quantile(before: dict[float, int], after: dict[float, int], q: float) -> float:
    """The upper bound of the bucket holding quantile ``q`` of the observations in between."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0) for b in bounds]
    total = counts[-1] if counts else 0
    for bound, cumulative in zip(bounds, counts, strict=True):
        if total and cumulative >= q / 100 * total:
            return bound
    return float("nan")


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, round(q / 100 * (len(sorted_values) - 1))))
    return sorted_values[index]


def session_benchmark(port: int, sources: int, samples: int) -> tuple[float, float, float, float]:
    """Fill one partition with ``sources`` sources, then time session opens (ms p50, p99)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    per_request = 2000
    data = b"session bench line\n"
    fill_started = time.monotonic()
    for base in range(0, sources, per_request):
        body = MAGIC + b"".join(
            section(
                orjson.dumps({"log_type": "sessions", "source_id": f"host{i}:/var/log/app.log"}),
                1000 + i,
                1,
                data,
            )
            for i in range(base, min(sources, base + per_request))
        )
        conn.request("POST", "/v1/write", body=body, headers={"Content-Type": BINARY})
        response = conn.getresponse()
        response.read()
        if response.status != 200:
            raise RuntimeError(f"fill failed: {response.status}")
    fill_s = time.monotonic() - fill_started
    latencies = []
    for _ in range(samples):
        i = random.randrange(sources)
        body = orjson.dumps({"log_type": "sessions", "source_id": f"host{i}:/var/log/app.log"})
        started = time.perf_counter()
        conn.request(
            "POST", "/v1/sessions", body=body, headers={"Content-Type": "application/json"}
        )
        response = conn.getresponse()
        answer = orjson.loads(response.read())
        latencies.append(time.perf_counter() - started)
        if answer["last_seqno"] != 1000 + i:
            raise RuntimeError(f"wrong last_seqno for source {i}: {answer}")
    latencies.sort()
    batch = orjson.dumps(
        {
            "sessions": [
                {"log_type": "sessions", "source_id": f"host{i}:/var/log/app.log"}
                for i in random.sample(range(sources), 1000)
            ]
        }
    )
    started = time.perf_counter()
    conn.request("POST", "/v1/sessions", body=batch, headers={"Content-Type": "application/json"})
    conn.getresponse().read()
    batch_ms = (time.perf_counter() - started) * 1000
    conn.close()
    return percentile(latencies, 50) * 1000, percentile(latencies, 99) * 1000, batch_ms, fill_s


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--workers", type=int, default=1, help="gateway uvicorn workers")
    parser.add_argument("--load-processes", type=int, default=2)
    parser.add_argument("--connections", type=int, default=4, help="per load process")
    parser.add_argument("--session-sources", type=int, default=100_000)
    parser.add_argument("--skip-sessions", action="store_true")
    parser.add_argument("--json", type=Path, help="also write the figures here as JSON")
    args = parser.parse_args(argv)

    rows: list[tuple[str, str]] = []
    figures: list[Figure] = []
    base = Path(tempfile.mkdtemp(prefix="logbroker-gateway-bench-"))
    try:
        port = free_port()
        gateway = start_gateway(base / "data", port, args.workers, partitions=4)
        try:
            load = {
                "processes": args.load_processes,
                "connections": args.connections,
                "seconds": args.seconds,
            }
            mbs, cps, lat, err = run_load(
                port, sources_per_request=4, chunks_per_source=4, chunk_bytes=64 * 1024, **load
            )
            rows.append(("64 KiB chunks, 1 MiB requests: MB/s", f"{mbs:,.0f}"))
            rows.append(("64 KiB chunks: chunks/s", f"{cps:,.0f}"))
            rows.append(("64 KiB chunks: request p50 / p99 ms", _ms(lat)))
            figures.append(Figure.of_runs("ingest, 64 KiB chunks, 1 MiB requests", [mbs], "MB/s"))
            mbs4, cps4, lat4, err4 = run_load(
                port, sources_per_request=8, chunks_per_source=32, chunk_bytes=4096, **load
            )
            rows.append(("4 KiB chunks, 1 MiB requests: chunks/s", f"{cps4:,.0f}"))
            rows.append(("4 KiB chunks: MB/s", f"{mbs4:,.0f}"))
            rows.append(("4 KiB chunks: request p50 / p99 ms", _ms(lat4)))
            figures.append(
                Figure.of_runs("ingest, 4 KiB chunks, 1 MiB requests", [cps4], "chunks/s")
            )
            # half of the 4 KiB peak, in requests of 32 chunks (one source each), paced
            # open-loop over 4x the connections: many hosts each sending now and then, so that
            # one slow answer does not hold back the sends scheduled after it
            chunks_per_request = 32
            rate = cps4 / 2 / chunks_per_request
            histogram_before = ack_histogram(port)
            _, cps_half, lat_half, err_half = run_load(
                port,
                processes=args.load_processes,
                connections=4 * args.connections,
                seconds=args.seconds,
                sources_per_request=1,
                chunks_per_source=chunks_per_request,
                chunk_bytes=4096,
                requests_per_s=rate,
            )
            rows.append(
                (
                    f"ack latency at half load ({cps_half:,.0f} chunks/s): p50 / p99 ms",
                    _ms(lat_half),
                )
            )
            if lat_half:
                figures.append(
                    Figure.of_runs(
                        "ack latency at half the 4 KiB load: p99",
                        [percentile(lat_half, 99) * 1000],
                        "ms",
                    )
                )
            if args.workers == 1:
                histogram_after = ack_histogram(port)
                p50_le = histogram_quantile(histogram_before, histogram_after, 50) * 1000
                p99_le = histogram_quantile(histogram_before, histogram_after, 99) * 1000
                rows.append(
                    (
                        "  same, gateway-side (request in -> ack out), bucket bounds: p50 / p99 ms",
                        f"<= {p50_le:g} / <= {p99_le:g}",
                    )
                )
            rows.append(("errors (non-200 answers)", str(err + err4 + err_half)))
        finally:
            stop_gateway(gateway)
        if not args.skip_sessions:
            port = free_port()
            gateway = start_gateway(base / "sessions", port, 1, partitions=1)
            try:
                p50, p99, batch_ms, fill_s = session_benchmark(
                    port, args.session_sources, samples=2000
                )
            finally:
                stop_gateway(gateway)
            label = f"{args.session_sources:,} sources in one partition"
            rows.append((f"session open, {label}: p50 / p99 ms", f"{p50:.2f} / {p99:.2f}"))
            figures.append(Figure.of_runs(f"session open, {label}: p99", [p99], "ms"))
            rows.append((f"batch of 1,000 session opens, {label}: ms", f"{batch_ms:.1f}"))
            rows.append((f"filling {label} (1 chunk each): s", f"{fill_s:.1f}"))
    finally:
        shutil.rmtree(base, ignore_errors=True)

    width = max(len(r[0]) for r in rows)
    print(
        f"gateway benchmark: {os.cpu_count()} CPUs, gateway workers {args.workers}, "
        f"{args.load_processes}x{args.connections} connections, {args.seconds:g} s per run"
    )
    print(f"{'measure'.ljust(width)}  value")
    print(f"{'-' * width}  {'-' * 16}")
    for name, value in rows:
        print(f"{name.ljust(width)}  {value}")
    write(args.json, "gateway", args, figures)
    return 0


def _ms(latencies: list[float]) -> str:
    if not latencies:
        return "n/a"
    return f"{percentile(latencies, 50) * 1000:.1f} / {percentile(latencies, 99) * 1000:.1f}"


if __name__ == "__main__":
    sys.exit(main())
