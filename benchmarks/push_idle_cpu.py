"""CPU an idle push-client costs: ``logbroker push`` watching many files that do not change.

    python benchmarks/push_idle_cpu.py [--files 1000] [--seconds 30] [--runs 3]
        [--repo PATH ...]

One gateway (of this checkout) runs throughout.  For each ``--repo`` (a checkout of this
project; default: this one), alternating, ``--runs`` times: a fresh state dir, ``--files``
files of one line each under one glob, a client with the default settings (inotify, poll
0.25 s, rescan 1 s, status every second) that ships them, then ``--seconds`` of nothing: the
client's user+system CPU over that window (``/proc/PID/stat``) as a share of one core.
Prints each run and the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
TICKS = os.sysconf("SC_CLK_TCK")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def _start_gateway(work: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = _port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ops",
            "serve",
            "--data-dir",
            str(work / "data"),
            "--port",
            str(port),
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("the gateway did not start")


def _idle_share(repo: Path, url: str, work: Path, files: int, seconds: float) -> float:
    """A client of ``repo`` ships ``files`` one-line files, then idles: its CPU share."""
    logs = Path(tempfile.mkdtemp(prefix="logs-", dir=work))
    for i in range(files):
        (logs / f"{i:05d}.log").write_bytes(f"{logs.name} {i} one line\n".encode())
    state = logs.with_name(logs.name + "-state")
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "ops", "push", "--server", url, "--log-type", "idle"),
            *("--state-dir", str(state), "--no-progress", str(logs / "*.log")),
        ],
        cwd=repo,
        env={**os.environ, "PYTHONPATH": str(repo)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                doc = json.loads((state / "status.json").read_bytes())
                rows = doc["files"]
                if len(rows) == files and all(r["acked"] == r["size"] for r in rows):
                    break
            except (OSError, ValueError, KeyError):
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit(f"{repo}: the client did not ship {files} files")
            time.sleep(0.2)
        time.sleep(3)  # the last acks' state save, the first lag report
        before, started = _cpu_s(proc.pid), time.monotonic()
        time.sleep(seconds)
        return (_cpu_s(proc.pid) - before) / (time.monotonic() - started)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        shutil.rmtree(logs, ignore_errors=True)
        shutil.rmtree(state, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--repo", type=Path, action="append", help="checkouts to compare")
    args = parser.parse_args(argv)
    repos = args.repo or [REPO]
    work = Path(tempfile.mkdtemp(prefix="push-idle-bench-"))
    gateway, url = _start_gateway(work)
    shares: dict[Path, list[float]] = {repo: [] for repo in repos}
    try:
        for run in range(args.runs):
            for repo in repos if run % 2 == 0 else list(reversed(repos)):
                share = _idle_share(repo, url, work, args.files, args.seconds)
                shares[repo].append(share)
                print(f"  run {run} {repo}: {share * 100:.2f}% of a core", flush=True)
    finally:
        gateway.send_signal(signal.SIGTERM)
        gateway.wait(30)
        shutil.rmtree(work, ignore_errors=True)
    print(f"idle client, {args.files} files, {args.seconds:.0f} s windows")
    print(f"{'checkout':<40} {'median % of a core':>19}  runs")
    for repo, values in shares.items():
        runs = " ".join(f"{v * 100:.2f}" for v in values)
        print(f"{repo!s:<40} {statistics.median(values) * 100:>19.2f}  {runs}")
    if len(repos) > 1:
        first = statistics.median(shares[repos[0]])
        for other in repos[1:]:
            print(f"{other} / {repos[0]}: {statistics.median(shares[other]) / first:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
