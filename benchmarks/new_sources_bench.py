"""New sources per second through the gateway: the first write of many sources into one partition.

    python benchmarks/new_sources_bench.py [--runs 3] [--requests 20] [--sources 5000] [--json PATH]

What a fleet restart or a new deployment looks like: every file of every host is a new source
at once, so each needs a pin, a seqno entry and its first chunk.  A real ``logbroker serve``
(one worker, one partition, every ack after its fsync) on a fresh data directory takes
``--requests`` requests of ``--sources`` one-chunk sections of sources it has never seen, sent
one after another on one keep-alive connection, and then the same again from 4 connections at
once.  Prints a table with the median of ``--runs`` runs, and the gateway's CPU time per new
source, which a busy machine disturbs less than the rate.
"""

from __future__ import annotations

import argparse
import http.client
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchmark_results import Figure, write
from gateway_bench import BINARY, MAGIC, free_port, section, start_gateway, stop_gateway

LINE = b"the first line of a new source\n"


def request_body(tag: str, sources: int) -> bytes:
    return MAGIC + b"".join(
        section(
            orjson.dumps(
                {
                    "log_type": "fleet",
                    "source_id": f"{tag}-host{i}:/var/log/app.log",
                    "server": f"{tag}-host{i}",
                    "file": "/var/log/app.log",
                }
            ),
            len(LINE),
            1,
            LINE,
        )
        for i in range(sources)
    )


def send_all(port: int, bodies: list[bytes], sources: int) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    for body in bodies:
        conn.request("POST", "/v1/write", body=body, headers={"Content-Type": BINARY})
        response = conn.getresponse()
        answer = orjson.loads(response.read())
        if response.status != 200:
            raise RuntimeError(f"write failed: {response.status} {answer}")
        written = sum(r["acks"][0]["status"] == "written" for r in answer["results"])
        if written != sources:
            raise RuntimeError(f"{sources - written} of {sources} new sources not written")
    conn.close()


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process so far (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_run(
    base: Path, run: int, requests: int, sources: int, connections: int
) -> tuple[float, float]:
    """New sources per second over ``connections`` connections sending ``requests`` in all,
    and the gateway's CPU microseconds per new source (steadier than the rate on a busy
    machine)."""
    data_dir = base / f"run{run}-c{connections}"
    port = free_port()
    gateway = start_gateway(data_dir, port, 1, partitions=1)
    try:
        per_connection = [
            [request_body(f"r{run}c{c}q{q}", sources) for q in range(requests // connections)]
            for c in range(connections)
        ]
        threads = [
            threading.Thread(target=send_all, args=(port, bodies, sources))
            for bodies in per_connection
        ]
        cpu_before = cpu_seconds(gateway.pid)
        started = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - started
        cpu = cpu_seconds(gateway.pid) - cpu_before
    finally:
        stop_gateway(gateway)
        shutil.rmtree(data_dir, ignore_errors=True)
    total = sum(len(b) for b in per_connection) * sources
    return total / elapsed, cpu / total * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--sources", type=int, default=5000, help="new sources per request")
    parser.add_argument("--json", type=Path, help="also write the figures here as JSON")
    args = parser.parse_args(argv)
    base = Path(tempfile.mkdtemp(prefix="logbroker-new-sources-"))
    rows = []
    figures: list[Figure] = []
    try:
        for connections in (1, 4):
            runs = [
                one_run(base, run, args.requests, args.sources, connections)
                for run in range(args.runs)
            ]
            rates = [rate for rate, _ in runs]
            label = (
                f"{args.requests} requests of {args.sources:,} new sources, one partition, "
                f"{connections} connection{'s' if connections > 1 else ''}"
            )
            figures.append(Figure.of_runs(label, rates, "new sources/s"))
            figures.append(
                Figure.of_runs(f"{label}: gateway CPU", [cpu for _, cpu in runs], "µs/source")
            )
            rows.append(
                (
                    label,
                    f"{statistics.median(rates):,.0f}",
                    f"{statistics.median(cpu for _, cpu in runs):.0f}",
                    " / ".join(f"{r:,.0f}" for r in rates),
                )
            )
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(
        f"| case (median of {args.runs}) | new sources/s | gateway CPU µs per new source | runs |"
    )
    print("|---|---:|---:|---:|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    write(args.json, "new_sources", args, figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
