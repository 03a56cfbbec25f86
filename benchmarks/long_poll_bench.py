"""Many long-polls of one read token against another tenant's requests.

Starts a real gateway (tokens on, one worker) over a fresh data dir.  Tenant B, who reads
``dc1.web*``, sends N concurrent ``POST /v1/fetch`` of ``--positions`` positions each with
``wait_ms``: topics that do not exist (``--mode missing``: random ``dc1.web<hex>`` names) or
distinct partitions of existing empty topics (``--mode existing``: 64-partition topics made by
an admin, no partition made by a write yet), or the same with one record in every partition
(``--mode written``: written before the gateway starts; the fetches wait after it).
Meanwhile tenant A describes its own topic (``GET /v1/topics/dc1.app``) in a loop.  Printed:
A's latency before and during the long-polls, the gateway's resident memory and threads (its
process group), and how B's fetches were answered.

    python benchmarks/long_poll_bench.py [--fetches 50] [--positions 1000] [--wait-ms 15000]
        [--mode missing|existing|written] [--limits 'max_waiting_positions = 0'] [--repo PATH]

``--repo`` runs the gateway from another checkout (an older commit, to compare); ``--limits``
adds lines to the gateway's ``[limits]``.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
A = "a" * 32
B = "b" * 32
ADMIN = "z" * 32
CONFIG = f"""
partitions = 4
[limits]
{{limits}}
[tokens.{A}]
name = "tenant-a"
write = ["app"]
read = ["dc1.app"]
[tokens.{B}]
name = "tenant-b"
write = ["web*"]
read = ["dc1.web*"]
[tokens.{ADMIN}]
admin = true
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _group_processes(group: int) -> Iterator[str]:
    """The /proc entries of every process in the process group ``group``."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[2]) == group:
                yield f"/proc/{entry}"
        except (OSError, ValueError, IndexError):
            continue


def _rss_mb(group: int) -> float:
    """Resident memory of every process in the process group ``group``, in MB."""
    total_kb = 0
    for proc in _group_processes(group):
        try:
            for line in Path(f"{proc}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total_kb += int(line.split()[1])
        except (OSError, ValueError, IndexError):
            continue
    return total_kb / 1024


def _cpu_s(group: int) -> float:
    """CPU time (user and system) every process in the process group ``group`` used so far."""
    ticks = 0
    for proc in _group_processes(group):
        try:
            fields = Path(f"{proc}/stat").read_text().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])
        except (OSError, ValueError, IndexError):
            continue
    return ticks / os.sysconf("SC_CLK_TCK")


def _threads(group: int) -> int:
    """Threads of every process in the process group ``group``."""
    count = 0
    for proc in _group_processes(group):
        try:
            count += len(os.listdir(f"{proc}/task"))
        except OSError:
            continue
    return count


def _write_topics(data_dir: Path, positions: int) -> None:
    """The topics of ``--mode written``, one record in each partition, made before the
    gateway opens the data dir."""
    sys.path.insert(0, str(REPO))
    from log_store import TopicConfig, open_store

    with open_store(data_dir) as store:
        for i in range((positions + 63) // 64):
            store.create_topic(f"dc1.web{i:02d}", TopicConfig(partitions=64))
            for partition in range(64):
                store.append(f"dc1.web{i:02d}", partition, [b"written before the long-polls"])


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class _Probe(threading.Thread):
    """Tenant A's requests, timed, until stopped."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self._http = httpx.Client(
            base_url=url, timeout=120, headers={"Authorization": f"Bearer {A}"}
        )
        self.latencies_ms: list[float] = []
        self.errors = 0
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            started = time.perf_counter()
            try:
                ok = self._http.get("/v1/topics/dc1.app").status_code == 200
            except httpx.HTTPError:
                ok = False
            if ok:
                self.latencies_ms.append((time.perf_counter() - started) * 1000)
            else:
                self.errors += 1
            self._halt.wait(0.05)

    def stop(self) -> None:
        self._halt.set()
        self.join()
        self._http.close()


def _positions(mode: str, count: int) -> list[dict[str, object]]:
    if mode == "missing":
        return [
            {"topic": f"dc1.web{secrets.token_hex(6)}", "partition": 0, "offset": 0}
            for _ in range(count)
        ]
    offset = 1 if mode == "written" else 0
    return [
        {"topic": f"dc1.web{i // 64:02d}", "partition": i % 64, "offset": offset}
        for i in range(count)
    ]


def serve_until_healthy(
    cmd: list[str], repo: Path, env: dict[str, str], log_path: Path, url: str, timeout_s: float
) -> subprocess.Popen[bytes]:
    """Start the gateway ``cmd`` (its output to ``log_path``) and return once ``url`` answers
    ``/healthz`` 200; exit naming the log if it does not within ``timeout_s``."""
    with open(log_path, "wb") as log:  # the child keeps its own copy
        proc = subprocess.Popen(
            cmd, cwd=repo, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            proc.wait()
            raise SystemExit(f"the gateway did not start: see {log_path}")
        time.sleep(0.1)


def _run(args: argparse.Namespace, work: Path) -> None:
    config = work / "gateway.toml"
    config.write_text(CONFIG.format(limits=args.limits))
    config.chmod(0o600)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "ops", "serve", "--data-dir", str(work / "data")]
    cmd += ["--port", str(port), "--config", str(config)]
    env = dict(os.environ, PYTHONPATH=str(args.repo))
    if args.mode == "written":
        _write_topics(work / "data", args.positions)
    proc = serve_until_healthy(cmd, args.repo, env, work / "gateway.log", url, timeout_s=60)
    try:
        admin = {"Authorization": f"Bearer {ADMIN}"}
        made = httpx.post(url + "/v1/topics", json={"name": "dc1.app"}, headers=admin)
        made.raise_for_status()
        if args.mode == "existing":
            for i in range((args.positions + 63) // 64):
                body = {"name": f"dc1.web{i:02d}", "partitions": 64}
                httpx.post(url + "/v1/topics", json=body, headers=admin).raise_for_status()

        probe = _Probe(url)
        probe.start()
        time.sleep(args.quiet_s)
        quiet = list(probe.latencies_ms)
        rss_before = _rss_mb(proc.pid)
        threads_before = _threads(proc.pid)

        took: dict[int, list[float]] = {}
        lock = threading.Lock()

        def fetch() -> None:
            body = {"partitions": _positions(args.mode, args.positions), "wait_ms": args.wait_ms}
            started = time.perf_counter()
            with httpx.Client(timeout=300, headers={"Authorization": f"Bearer {B}"}) as http:
                try:
                    status = http.post(url + "/v1/fetch", json=body).status_code
                except httpx.HTTPError:
                    status = 0
            with lock:
                took.setdefault(status, []).append(time.perf_counter() - started)

        first = len(probe.latencies_ms)
        cpu_before = _cpu_s(proc.pid)
        fetches = [threading.Thread(target=fetch) for _ in range(args.fetches)]
        for thread in fetches:
            thread.start()
        rss_peak = rss_before
        threads_peak = threads_before
        while any(thread.is_alive() for thread in fetches):
            rss_peak = max(rss_peak, _rss_mb(proc.pid))
            threads_peak = max(threads_peak, _threads(proc.pid))
            time.sleep(0.5)
        cpu_s = _cpu_s(proc.pid) - cpu_before
        loaded = probe.latencies_ms[first:]
        probe.stop()
        time.sleep(2)
        rss_after = _rss_mb(proc.pid)
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()

    def row(name: str, values: list[float]) -> str:
        if not values:
            return f"| {name} | - | - | - | 0 |"
        p50, p99 = statistics.median(values), _percentile(values, 0.99)
        return f"| {name} | {p50:.0f} | {p99:.0f} | {max(values):.0f} | {len(values)} |"

    print(f"\n{args.fetches} fetches x {args.positions} {args.mode} positions, ", end="")
    print(f"wait_ms={args.wait_ms}; limits: {args.limits or 'defaults'}")
    print("| tenant A's describe | p50 ms | p99 ms | max ms | requests |")
    print("|---|---|---|---|---|")
    print(row("before the long-polls", quiet))
    print(row("during them", loaded))
    print(f"tenant A's failed requests: {probe.errors}")
    answers = ", ".join(
        f"{len(times)} x {status or 'failed'} in {statistics.median(times):.1f} s (median), "
        f"{max(times):.1f} s (max)"
        for status, times in sorted(took.items())
    )
    print(f"tenant B's fetches: {answers}")
    print(f"gateway RSS: {rss_before:.0f} MB before, {rss_peak:.0f} MB peak, ", end="")
    print(f"{rss_after:.0f} MB 2 s after")
    print(f"gateway threads: {threads_before} before, {threads_peak} peak")
    print(f"gateway CPU while the long-polls ran: {cpu_s:.1f} s")
    write_json(args, quiet, loaded, rss_before, rss_peak)


def write_json(
    args: argparse.Namespace,
    quiet: list[float],
    loaded: list[float],
    rss_before: float,
    rss_peak: float,
) -> None:
    """The table's figures for ``logbroker bench all`` (see benchmarks/benchmark_results.py)."""
    from benchmark_results import Figure, write

    if not loaded:
        raise SystemExit("long_poll_bench: tenant A made no request during the long-polls")
    during = statistics.median(loaded)
    figure = Figure.of_runs(
        f"another tenant's p50 during {args.fetches} long-polls of {args.positions} "
        f"{args.mode} positions",
        [during],
        "ms",
    )
    if quiet:
        figure.compared(
            "the same requests before the long-polls", [during / statistics.median(quiet)]
        )
    peak = Figure.of_runs("the gateway's peak RSS during them", [rss_peak], "MB")
    if rss_before:
        peak.compared("its RSS before them", [rss_peak / rss_before])
    write(args.json, "long_poll", args, [figure, peak])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--fetches", type=int, default=50)
    parser.add_argument("--positions", type=int, default=1000)
    parser.add_argument("--wait-ms", type=int, default=15_000)
    parser.add_argument("--mode", choices=("missing", "existing", "written"), default="missing")
    parser.add_argument("--limits", default="", help="lines added to the gateway's [limits]")
    parser.add_argument("--quiet-s", type=float, default=5.0, help="probe alone this long first")
    parser.add_argument("--repo", type=Path, default=REPO, help="checkout the gateway runs from")
    parser.add_argument("--json", type=Path, help="also write the figures here as JSON")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="long-poll-bench-"))
    try:
        _run(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
