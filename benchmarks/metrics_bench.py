"""What the gateway's metrics cost one write request: prometheus_client vs a hand-written dict.

    python benchmarks/metrics_bench.py [--requests 200000] [--runs 5]

A write request updates six metrics (chunks by topic and status, bytes by topic, sessions
opened, the ack latency histogram, HTTP requests by endpoint and status, the HTTP latency
histogram).  Times those six updates per request with:
  * a hand-written registry: a dict lookup and an add under a lock per update (the design the
    gateway had before prometheus_client);
  * ``ingest_api.metrics`` in one process (prometheus_client's in-memory values);
  * ``ingest_api.metrics`` in multiprocess mode (values in memory-mapped files), as each worker
    of ``logbroker serve --workers N`` runs it.
Each is measured in a fresh process, ``--runs`` times; the table shows medians and the ratio
to the hand-written peer.

Then the same against a whole request: a real ``logbroker serve`` (one worker, and two in
multiprocess mode) answers ``--gateway-requests`` small write requests (one chunk of 100 bytes,
the cheapest request there is) on one keep-alive connection, and the gateway's processes' CPU
time per request is read from ``/proc``: the metrics' share of a request is the first table's
microseconds over this.  ``--repo DIR`` runs that gateway from another checkout (to compare two
versions on the same machine in one run).
"""

from __future__ import annotations

import argparse
import bisect
import http.client
import os
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parent.parent
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class _HandCounter:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[tuple[str, ...], float] = {}

    def inc(self, amount: float = 1.0, labels: tuple[str, ...] = ()) -> None:
        with self._lock:
            self._values[labels] = self._values.get(labels, 0.0) + amount


class _HandHistogram:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, ...], list[int]] = {}
        self._sums: dict[tuple[str, ...], float] = {}

    def observe(self, value: float, labels: tuple[str, ...] = ()) -> None:
        index = bisect.bisect_left(BUCKETS, value)
        with self._lock:
            counts = self._counts.get(labels)
            if counts is None:
                counts = self._counts[labels] = [0] * (len(BUCKETS) + 1)
                self._sums[labels] = 0.0
            counts[index] += 1
            self._sums[labels] += value


def _metrics(kind: str) -> tuple[object, ...]:
    if kind == "hand-written":
        return (
            _HandCounter(),
            _HandCounter(),
            _HandCounter(),
            _HandHistogram(),
            _HandCounter(),
            _HandHistogram(),
        )
    from ingest_api.metrics import MetricsRegistry

    m = MetricsRegistry()
    return (
        m.counter("logbroker_chunks_total", "chunks", ("topic", "status")),
        m.counter("logbroker_written_bytes_total", "bytes", ("topic",)),
        m.counter("logbroker_sessions_opened_total", "sessions"),
        m.histogram("logbroker_ack_latency_seconds", "ack latency"),
        m.counter("logbroker_http_requests_total", "requests", ("endpoint", "status")),
        m.histogram("logbroker_http_request_seconds", "latency", ("endpoint",)),
    )


def measure(kind: str, requests: int) -> float:
    """Microseconds of the six updates of one write request."""
    chunks, data, sessions, ack, http_requests, http_latency = _metrics(kind)
    started = time.perf_counter()
    for i in range(requests):
        latency = 0.002 + (i % 7) * 0.001
        chunks.inc(32, ("dc1.app", "written"))  # type: ignore[attr-defined]
        data.inc(131072, ("dc1.app",))  # type: ignore[attr-defined]
        sessions.inc(1)  # type: ignore[attr-defined]
        ack.observe(latency)  # type: ignore[attr-defined]
        http_requests.inc(1, ("write_chunks", "200"))  # type: ignore[attr-defined]
        http_latency.observe(latency, ("write_chunks",))  # type: ignore[attr-defined]
    return (time.perf_counter() - started) / requests * 1e6


def _child(kind: str, requests: int) -> float:
    env = dict(os.environ)
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    with tempfile.TemporaryDirectory(prefix="logbroker-metrics-bench-") as directory:
        if kind == "prometheus_client, multiprocess":
            env["PROMETHEUS_MULTIPROC_DIR"] = directory
        out = subprocess.run(
            [sys.executable, __file__, "--child", kind, "--requests", str(requests)],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        )
    return float(out.stdout.strip())


def _cpu_seconds(pid: int) -> float:
    """User + system CPU of a process and its children (alive ones and reaped ones)."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    pids = [pid]
    children = Path(f"/proc/{pid}/task/{pid}/children")
    if children.exists():
        pids += [int(c) for c in children.read_text().split()]
    for p in pids:
        fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        total += sum(int(f) for f in fields[11:15]) / tick
    return total


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _one_chunk_body(source: str, seqno: int) -> bytes:
    meta = orjson.dumps({"log_type": "app", "source_id": source, "server": "bench", "file": "/f"})
    data = b"x" * 99 + b"\n"
    return b"".join(
        [
            b"LBW1",
            struct.pack(">H", len(meta)),
            meta,
            struct.pack(">I", 1),
            struct.pack(">QqI", seqno, 0, len(data)),
            data,
        ]
    )


def gateway_cpu_per_request(repo: Path, workers: int, requests: int) -> float:
    """Microseconds of gateway CPU (all its processes) per one-chunk write request."""
    base = Path(tempfile.mkdtemp(prefix="logbroker-metrics-bench-"))
    port = _free_port()
    cmd = [sys.executable, "-m", "ops", "serve", "--data-dir", str(base / "data")]
    cmd += ["--port", str(port), "--workers", str(workers), "--retention-check-seconds", "0"]
    proc = subprocess.Popen(
        cmd, cwd=repo, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        conn = _connect(port, proc)
        for i in range(200):  # warm up: topic, partitions, sessions
            _post(conn, _one_chunk_body(f"warm-{i % 8}", i + 1))
        before = _cpu_seconds(proc.pid)
        for i in range(requests):
            _post(conn, _one_chunk_body(f"bench-{i % 8}", i + 1))
        spent = _cpu_seconds(proc.pid) - before
        conn.close()
        return spent / requests * 1e6
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        shutil.rmtree(base, ignore_errors=True)


def _connect(port: int, proc: subprocess.Popen[bytes]) -> http.client.HTTPConnection:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            conn.request("GET", "/healthz")
            response = conn.getresponse()
            response.read()
            if response.status == 200:
                return conn
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("the gateway did not start")


def _post(conn: http.client.HTTPConnection, body: bytes) -> None:
    conn.request("POST", "/v1/write", body, {"content-type": "application/x-logbroker-chunks"})
    response = conn.getresponse()
    response.read()
    if response.status != 200:
        raise RuntimeError(f"write answered {response.status}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--gateway-requests", type=int, default=2000)
    parser.add_argument("--repo", type=Path, default=REPO, help="checkout the gateway runs from")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, help="also write the figures here as JSON")
    args = parser.parse_args()
    if args.child:
        sys.path.insert(0, str(REPO))
        print(measure(args.child, args.requests))
        return 0
    kinds = ("hand-written", "prometheus_client, one process", "prometheus_client, multiprocess")
    results: dict[str, list[float]] = {k: [] for k in kinds}
    for _ in range(args.runs):
        for kind in kinds:  # interleaved, so that the machine's noise hits every kind alike
            results[kind].append(_child(kind, args.requests))
    peer = statistics.median(results["hand-written"])
    print(
        f"metrics cost per write request (6 updates): {os.cpu_count()} CPUs, "
        f"{args.requests:,} requests x {args.runs} runs, medians"
    )
    print(f"{'registry':34}  {'us/request':>10}  {'vs hand-written':>15}")
    print(f"{'-' * 34}  {'-' * 10}  {'-' * 15}")
    for kind in kinds:
        median = statistics.median(results[kind])
        print(f"{kind:34}  {median:10.2f}  {median / peer:14.2f}x")
    if args.gateway_requests <= 0:
        write_json(args, kinds, results, {})
        return 0
    cpu: dict[int, list[float]] = {1: [], 2: []}
    for _ in range(args.runs):
        for workers in cpu:
            cpu[workers].append(gateway_cpu_per_request(args.repo, workers, args.gateway_requests))
    print()
    print(
        f"gateway CPU per one-chunk write request ({args.gateway_requests:,} requests x "
        f"{args.runs} runs, medians; gateway from {args.repo})"
    )
    print(f"{'gateway':34}  {'us/request':>10}  {'metrics share':>15}")
    print(f"{'-' * 34}  {'-' * 10}  {'-' * 15}")
    for workers, kind in ((1, kinds[1]), (2, kinds[2])):
        per_request = statistics.median(cpu[workers])
        share = statistics.median(results[kind]) / per_request
        print(f"{f'{workers} worker(s)':34}  {per_request:10.1f}  {share:14.1%}")
    write_json(args, kinds, results, cpu)
    return 0


def write_json(
    args: argparse.Namespace,
    kinds: tuple[str, ...],
    results: dict[str, list[float]],
    cpu: dict[int, list[float]],
) -> None:
    """The tables' figures for ``logbroker bench all`` (see benchmarks/benchmark_results.py)."""
    from benchmark_results import Figure, write

    peer = results[kinds[0]]
    figures = [
        Figure.of_runs(f"metrics of one write request, {kind}", results[kind], "µs").compared(
            "hand-written", [r / p for r, p in zip(results[kind], peer, strict=True)]
        )
        if kind != kinds[0]
        else Figure.of_runs(f"metrics of one write request, {kind}", results[kind], "µs")
        for kind in kinds
    ]
    for workers, runs in cpu.items():
        figures.append(
            Figure.of_runs(
                f"gateway CPU per one-chunk write request, {workers} worker(s)", runs, "µs"
            )
        )
    write(args.json, "metrics", args, figures)


if __name__ == "__main__":
    raise SystemExit(main())
