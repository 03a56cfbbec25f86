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
to the hand-written peer.  Compare with a write request's own time (benchmarks/gateway_bench.py:
thousands of microseconds).
"""

from __future__ import annotations

import argparse
import bisect
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--child", help=argparse.SUPPRESS)
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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
