"""Pull throughput: 1, 4 and 16 concurrent readers of one topic, JSON and binary framing.

Starts a real gateway on a free port over a fresh data dir, writes the data set through
``POST /v1/write`` (binary framing, one writer; its rate is printed as the ingest reference),
then has N reader processes each read the whole topic from offset 0 with ``POST /v1/fetch``.
Aggregate throughput counts the log data (chunk bytes) delivered to all readers.

    python benchmarks/pull_bench.py [--mb 64] [--chunk-kb 64] [--readers 1,4,16] [--workers 1]
        [--runs 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import http.client
import multiprocessing
import os
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import orjson

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmark_results import Figure, write  # noqa: E402

from ingest_api.framing import BINARY_MEDIA_TYPE as WRITE_MEDIA_TYPE  # noqa: E402
from ingest_api.framing import encode_binary as encode_write  # noqa: E402

PARTITIONS = 4
TOPIC = "dc1.bench"
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_RECORD = struct.Struct(">QI")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_gateway(data_dir: Path, workers: int) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    cmd = [
        sys.executable,
        "-m",
        "ops",
        "serve",
        "--data-dir",
        str(data_dir),
        "--port",
        str(port),
        "--partitions",
        str(PARTITIONS),
        "--workers",
        str(workers),
    ]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("gateway did not start")


def _line_chunk(source: int, seqno: int, chunk_bytes: int) -> bytes:
    line = f"2026-01-01T00:00:00 host{source} GET /index.html?seq={seqno} 200 ".encode()
    line = line.ljust(199, b"x") + b"\n"
    return line * (chunk_bytes // len(line))


def _ingest(url: str, total_bytes: int, chunk_bytes: int) -> tuple[int, float]:
    """Write the data set; returns (bytes written, seconds)."""
    sources = PARTITIONS * 4
    per_request = max(1, (4 * 1024 * 1024) // chunk_bytes)
    written = 0
    seqno = 0
    started = time.perf_counter()
    with httpx.Client(base_url=url, timeout=120) as http:
        while written < total_bytes:
            seqno += 1
            sections = []
            for s in range(sources):
                meta = {
                    "log_type": "bench",
                    "source_id": f"bench-{s}",
                    "server": f"host{s}",
                    "file": "/var/log/bench.log",
                    "codec": "raw",
                }
                chunks = [
                    (seqno * per_request + i, 0, _line_chunk(s, seqno, chunk_bytes))
                    for i in range(per_request // sources or 1)
                ]
                written += sum(len(c[2]) for c in chunks)
                sections.append((meta, chunks))
            response = http.post(
                "/v1/write",
                content=encode_write(sections),
                headers={"content-type": WRITE_MEDIA_TYPE},
            )
            response.raise_for_status()
    return written, time.perf_counter() - started


def _count_binary(body: memoryview, positions: dict[int, int]) -> int:
    """Walk the binary framing without copying values; returns the data bytes seen."""
    data_bytes = 0
    pos = 4
    while pos < len(body):
        (meta_len,) = _U16.unpack_from(body, pos)
        pos += 2
        meta = orjson.loads(body[pos : pos + meta_len])
        pos += meta_len
        (count,) = _U32.unpack_from(body, pos)
        pos += 4
        for _ in range(count):
            _offset, length = _RECORD.unpack_from(body, pos)
            pos += _RECORD.size + length
            data_bytes += length
        positions[meta["partition"]] = meta["next_offset"]
    return data_bytes


def _reader(url: str, fmt: str, max_bytes: int, ready: object, go: object, out: object) -> None:
    """One reader process: reads the whole topic once over one keep-alive connection.

    It uses the standard library's HTTP client and walks the framing in place, so the
    machine's two cores go to the gateway rather than to a client's copies.
    """
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    conn.request("GET", f"/v1/topics/{TOPIC}")
    info = orjson.loads(conn.getresponse().read())
    ends = {p["partition"]: p["end_offset"] for p in info["partitions"]}
    positions = {p: 0 for p in ends}
    data_bytes = 0
    ready.put(1)  # type: ignore[attr-defined]
    go.wait()  # type: ignore[attr-defined]
    started = time.perf_counter()
    while any(positions[p] < ends[p] for p in positions):
        wanted = [
            {"topic": TOPIC, "partition": p, "offset": o}
            for p, o in positions.items()
            if o < ends[p]
        ]
        body = orjson.dumps({"partitions": wanted, "max_bytes": max_bytes, "format": fmt})
        conn.request("POST", "/v1/fetch", body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        raw = response.read()
        if response.status != 200:
            raise SystemExit(f"fetch answered {response.status}: {raw[:200]!r}")
        if fmt == "binary":
            data_bytes += _count_binary(memoryview(raw), positions)
        else:
            for part in orjson.loads(raw)["partitions"]:
                positions[part["partition"]] = part["next_offset"]
                data_bytes += sum(len(m["data"]) for m in part["messages"])
    out.put((data_bytes, time.perf_counter() - started))  # type: ignore[attr-defined]
    conn.close()


def _run_readers(url: str, readers: int, fmt: str, max_bytes: int) -> tuple[float, float]:
    """(aggregate MB/s, seconds) of ``readers`` processes reading the topic once each."""
    ctx = multiprocessing.get_context("spawn")
    ready, out = ctx.Queue(), ctx.Queue()
    go = ctx.Event()
    procs = [
        ctx.Process(target=_reader, args=(url, fmt, max_bytes, ready, go, out))
        for _ in range(readers)
    ]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=60)
    started = time.perf_counter()
    go.set()
    results = [out.get(timeout=600) for _ in procs]
    wall = time.perf_counter() - started
    for p in procs:
        p.join(30)
    total = sum(r[0] for r in results)
    return total / wall / 1e6, wall


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=64, help="data set size in MB")
    parser.add_argument("--chunk-kb", type=int, default=64, help="chunk size in KiB")
    parser.add_argument("--readers", default="1,4,16")
    parser.add_argument("--formats", default="binary,json")
    parser.add_argument("--max-bytes", type=int, default=8 * 1024 * 1024)
    parser.add_argument("--workers", type=int, default=1, help="gateway worker processes")
    parser.add_argument("--runs", type=int, default=3, help="runs per cell; the median is shown")
    parser.add_argument("--json", type=Path, help="also write the figures here as JSON")
    args = parser.parse_args(argv)
    figures: list[Figure] = []

    work = Path(tempfile.mkdtemp(prefix="pull-bench-"))
    proc, url = _start_gateway(work / "data", args.workers)
    try:
        written, seconds = _ingest(url, args.mb * 1_000_000, args.chunk_kb * 1024)
        ingest_rate = written / seconds / 1e6
        print(
            f"data set: {written / 1e6:.0f} MB in {args.chunk_kb} KiB chunks, "
            f"{PARTITIONS} partitions; gateway workers: {args.workers}"
        )
        print(f"ingest reference (1 writer, binary /v1/write): {ingest_rate:.0f} MB/s\n")
        figures.append(
            Figure.of_runs(
                f"ingest, 1 writer, binary /v1/write, {args.chunk_kb} KiB chunks "
                f"(the pull reference)",
                [ingest_rate],
                "MB/s",
            )
        )
        print(
            f"{'format':<8} {'readers':>7} {'aggregate MB/s':>15} {'x ingest':>9} "
            f"{'per reader MB/s':>16}"
        )
        for fmt in args.formats.split(","):
            for readers in (int(r) for r in args.readers.split(",")):
                rates = [
                    _run_readers(url, readers, fmt, args.max_bytes)[0] for _ in range(args.runs)
                ]
                rate = statistics.median(rates)
                figures.append(
                    Figure.of_runs(
                        f"pull, {fmt} framing, {readers} reader{'s' if readers > 1 else ''} "
                        f"of {written / 1e6:.0f} MB, aggregate",
                        rates,
                        "MB/s",
                    ).compared("ingest", [r / ingest_rate for r in rates])
                )
                print(
                    f"{fmt:<8} {readers:>7} {rate:>15.0f} {rate / ingest_rate:>9.1f} "
                    f"{rate / readers:>16.0f}",
                    flush=True,
                )
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(work, ignore_errors=True)
    write(args.json, "pull", args, figures)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
