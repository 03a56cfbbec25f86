"""What a Kafka gateway's ``/v1/fetch`` of many partitions no write has made costs.

Starts a local broker and a real ``logbroker serve --store kafka`` gateway (tokens on), makes
``--topics`` topics of ``--partitions`` partitions each and one of 4 (``dc1.app``), and times
``--fetches`` fetches (no ``wait_ms``) of every partition from offset 0, one after another;
then as many fetches of one partition, the peer: what a fetch costs apart from its partitions.
Printed: the first fetch, the median of the rest, and the gateway's looks at one partition's
bounds per fetch (its metric ``logbroker_kafka_partition_looks``, where it has it).

    python benchmarks/kafka_fetch_bench.py [--topics 4] [--partitions 32] [--fetches 30]
        [--runs 3] [--repo PATH] [--json PATH]

``--repo`` runs the gateway from another checkout (an older commit, to compare).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from long_poll_bench import free_port, serve_until_healthy  # noqa: E402  (beside this script)

from ops.local_kafka import LocalKafka  # noqa: E402

READER = "r" * 32
ADMIN = "z" * 32
CONFIG = """store = "kafka"
kafka_bootstrap = "{bootstrap}"
kafka_namespace = "{namespace}"
kafka_ownership = "on_demand"
partitions = 4
peer_token = "{peer}"
[kafka]
operation_timeout_s = 10.0
[tokens.{reader}]
name = "reader"
read = ["dc1.*"]
[tokens.{admin}]
admin = true
"""


def _looks(http: httpx.Client) -> float | None:
    text = http.get("/metrics", headers={"Authorization": f"Bearer {ADMIN}"}).text
    for line in text.splitlines():
        if line.startswith("logbroker_kafka_partition_looks "):
            return float(line.split()[1])
    return None


def _timed(http: httpx.Client, positions: list[dict[str, object]], count: int) -> list[float]:
    """Milliseconds of each of ``count`` fetches of ``positions``, one after another."""
    times = []
    for _ in range(count):
        started = time.perf_counter()
        answer = http.post("/v1/fetch", json={"partitions": positions})
        times.append((time.perf_counter() - started) * 1000)
        answer.raise_for_status()
    return times


def one_run(args: argparse.Namespace, bootstrap: str, work: Path) -> dict[str, float]:
    config = work / "gateway.toml"
    config.write_text(
        CONFIG.format(
            bootstrap=bootstrap,
            namespace=f"f{uuid.uuid4().hex[:8]}.",
            peer="p" * 32,
            reader=READER,
            admin=ADMIN,
        )
    )
    config.chmod(0o600)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "ops", "serve", "--data-dir", str(work / "data")]
    cmd += ["--port", str(port), "--config", str(config)]
    env = dict(os.environ, PYTHONPATH=str(args.repo))
    proc = serve_until_healthy(cmd, args.repo, env, work / "gateway.log", url, timeout_s=90)
    try:
        admin = {"Authorization": f"Bearer {ADMIN}"}
        with httpx.Client(base_url=url, timeout=120) as http:
            http.post("/v1/topics", json={"name": "dc1.app"}, headers=admin).raise_for_status()
            positions: list[dict[str, object]] = [
                {"topic": "dc1.app", "partition": p, "offset": 0} for p in range(4)
            ]
            for i in range(args.topics):
                body = {"name": f"dc1.web{i}", "partitions": args.partitions}
                http.post("/v1/topics", json=body, headers=admin).raise_for_status()
                positions += [
                    {"topic": f"dc1.web{i}", "partition": p, "offset": 0}
                    for p in range(args.partitions)
                ]
            http.headers["Authorization"] = f"Bearer {READER}"
            looks = _looks(http)
            many = _timed(http, positions, args.fetches)
            after = _looks(http)
            one = _timed(http, positions[:1], args.fetches)
        row = {
            "first": many[0],
            "many": statistics.median(many[1:]),
            "one": statistics.median(one),
            "positions": float(len(positions)),
        }
        if looks is not None and after is not None:
            row["looks"] = (after - looks) / args.fetches
        return row
    finally:
        proc.kill()
        proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--topics", type=int, default=4)
    parser.add_argument("--partitions", type=int, default=32)
    parser.add_argument("--fetches", type=int, default=30)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--repo", type=Path, default=REPO)
    parser.add_argument("--json", type=Path, help="also write the figures here as JSON")
    args = parser.parse_args()
    if args.topics < 1 or args.partitions < 1 or args.fetches < 2 or args.runs < 1:
        parser.error("--topics, --partitions and --runs must be at least 1, --fetches 2")
    rows = []
    with tempfile.TemporaryDirectory(prefix="kafka-fetch-bench-") as tmp:
        cluster = LocalKafka(Path(tmp) / "kafka", nodes_count=1)
        cluster.start()
        try:
            for n in range(args.runs):
                work = Path(tmp) / f"run{n}"
                work.mkdir()
                rows.append(one_run(args, cluster.bootstrap, work))
        finally:
            cluster.stop()
    count = int(rows[0]["positions"])
    print(f"\n/v1/fetch of {count} partitions no write made, {args.fetches} fetches a run")
    print("| | per run | median |")
    print("|---|---|---|")
    for key, name in (
        ("first", f"the first fetch of {count}, ms"),
        ("many", f"a fetch of {count} after it, ms (median)"),
        ("one", "a fetch of 1, ms (median)"),
        ("looks", "looks at one partition's bounds per fetch"),
    ):
        values = [row[key] for row in rows if key in row]
        if values:
            runs = " / ".join(f"{v:.1f}" for v in values)
            print(f"| {name} | {runs} | {statistics.median(values):.1f} |")
    write_json(args, rows, count)


def write_json(args: argparse.Namespace, rows: list[dict[str, float]], count: int) -> None:
    """The table's figures for ``logbroker bench all`` (see benchmarks/benchmark_results.py):
    a fetch of many partitions, against a fetch of one."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from benchmark_results import Figure, write

    many = Figure.of_runs(
        f"a fetch of {count} partitions no write made", [r["many"] for r in rows], "ms"
    )
    many = many.compared("a fetch of 1", [r["many"] / r["one"] for r in rows])
    figures = [many, Figure.of_runs("a fetch of 1 partition", [r["one"] for r in rows], "ms")]
    write(args.json, "kafka_fetch", args, figures)


if __name__ == "__main__":
    main()
