"""The gateway's CPU per MB of compressed chunks: what checking each chunk's codec costs.

    python benchmarks/codec_cpu_bench.py [--codec zstd] [--mb 200] [--runs 5]
        [--repo PATH ...] [--json PATH]

For each ``--repo`` (a checkout of this project; default: this one), alternating, ``--runs``
times: a fresh ``logbroker serve`` takes ``--mb`` MB of log lines (decompressed) as 64 KiB
chunks compressed as the push client compresses them, 32 chunks per binary request over one
keep-alive connection; then it is stopped with SIGTERM (the audit publisher counts what it
deferred and publishes) and its user+system CPU is taken from ``wait4``.  A run with no load
is subtracted, so the figure is the CPU the writes cost: ms per MB of decompressed lines.
Prints a table of medians.
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import os
import random
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson
import zstandard

REPO = Path(__file__).resolve().parent.parent
MAGIC = b"LBW1"
_CHUNK = struct.Struct(">QqI")
BINARY = "application/x-logbroker-chunks"
CHUNK_RAW_BYTES = 64 * 1024
CHUNKS_PER_REQUEST = 32


def _lines(rng: random.Random, size: int) -> bytes:
    words = ["GET", "POST", "/api/v1/items", "/login", "200", "404", "503", "user", "ms"]
    out = bytearray()
    while len(out) < size:
        out += (
            f"2026-11-26T07:{rng.randrange(60):02d}:{rng.randrange(60):02d}Z "
            f"host{rng.randrange(50)} "
            f"{' '.join(rng.choice(words) for _ in range(6))} id={rng.getrandbits(48):x}\n"
        ).encode()
    return bytes(out[: out.rindex(b"\n", 0, size) + 1])


def _compress(codec: str, data: bytes) -> bytes:
    if codec == "gzip":
        return gzip.compress(data, compresslevel=1, mtime=0)
    return zstandard.ZstdCompressor(level=3, write_content_size=True).compress(data)


def _bodies(codec: str, total_mb: int) -> tuple[list[bytes], int]:
    """The request bodies, and the decompressed bytes they hold."""
    rng = random.Random(7)
    pool = [_lines(rng, CHUNK_RAW_BYTES) for _ in range(64)]
    packed = [(_compress(codec, raw), len(raw)) for raw in pool]
    chunks = total_mb * 1024 * 1024 // CHUNK_RAW_BYTES
    bodies = []
    raw_bytes = 0
    seqno = 0
    for first in range(0, chunks, CHUNKS_PER_REQUEST):
        source = f"bench-{first // CHUNKS_PER_REQUEST % 64}"
        meta = orjson.dumps({"log_type": "bench", "source_id": source, "codec": codec})
        parts = [MAGIC, struct.pack(">H", len(meta)), meta]
        count = min(CHUNKS_PER_REQUEST, chunks - first)
        parts.append(struct.pack(">I", count))
        for i in range(count):
            seqno += 1
            data, size = packed[(first + i) % len(packed)]
            raw_bytes += size
            parts.append(_CHUNK.pack(seqno, int(time.time() * 1000), len(data)))
            parts.append(data)
        bodies.append(b"".join(parts))
    return bodies, raw_bytes


def _port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _gateway_cpu_s(repo: Path, bodies: list[bytes]) -> float:
    """A fresh gateway of ``repo`` takes ``bodies``; its CPU seconds until it exits."""
    data_dir = Path(tempfile.mkdtemp(prefix="codec-bench-"))
    port = _port()
    env = {**os.environ, "PYTHONPATH": str(repo)}
    cmd = [sys.executable, "-m", "ops", "serve", "--data-dir", str(data_dir / "d")]
    proc = subprocess.Popen(
        [*cmd, "--port", str(port)],
        cwd=repo,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                conn.request("GET", "/healthz")
                if conn.getresponse().read() is not None:
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        for body in bodies:
            conn.request("POST", "/v1/write", body=body, headers={"Content-Type": BINARY})
            response = conn.getresponse()
            answer = response.read()
            if response.status != 200:
                raise RuntimeError(f"{response.status}: {answer[:300]!r}")
        conn.close()
        proc.send_signal(signal.SIGTERM)
        _, _, usage = os.wait4(proc.pid, 0)
        proc.returncode = 0
        return usage.ru_utime + usage.ru_stime
    finally:
        if proc.returncode is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(data_dir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--codec", choices=("zstd", "gzip"), default="zstd")
    parser.add_argument("--mb", type=int, default=200, help="MB of decompressed lines per run")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--repo", type=Path, action="append", help="checkouts to compare")
    parser.add_argument("--json", type=Path, help="also write the figures here as JSON")
    args = parser.parse_args(argv)
    repos = args.repo or [REPO]
    bodies, raw_bytes = _bodies(args.codec, args.mb)
    sent = sum(map(len, bodies))
    mb = raw_bytes / 1e6
    print(f"{args.codec}: {mb:.0f} MB of lines as {sent / 1e6:.0f} MB compressed, per run")
    per_mb: dict[Path, list[float]] = {repo: [] for repo in repos}
    for run in range(args.runs):
        for repo in repos if run % 2 == 0 else list(reversed(repos)):
            idle = _gateway_cpu_s(repo, [])
            loaded = _gateway_cpu_s(repo, bodies)
            per_mb[repo].append((loaded - idle) * 1000 / mb)
            print(f"  run {run} {repo}: {per_mb[repo][-1]:.2f} ms/MB", flush=True)
    print(f"{'checkout':<40} {'median ms CPU/MB':>18} {'runs':>30}")
    for repo, values in per_mb.items():
        runs = " ".join(f"{v:.2f}" for v in values)
        print(f"{repo!s:<40} {statistics.median(values):>18.2f} {runs:>30}")
    if args.json is not None:
        from benchmark_results import Figure, write

        first = repos[0]
        figure = Figure.of_runs(f"gateway CPU per MB of {args.codec} lines", per_mb[first], "ms")
        for other in repos[1:]:
            ratios = [a / b for a, b in zip(per_mb[first], per_mb[other], strict=True)]
            figure.compared(str(other), ratios)
        write(args.json, "codec_cpu", args, [figure])
    return 0


if __name__ == "__main__":
    sys.exit(main())
