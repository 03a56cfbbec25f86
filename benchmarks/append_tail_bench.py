"""What following busy partitions costs a Kafka gateway: CPU of the append tail per MB written.

A long-poll on Kafka is woken by the store's tail consumer (``log_store/kafka/append_tail.py``),
which is assigned every partition some long-poll waits on and fetches (and drops) whatever is
written there.  This starts a local broker, opens the store in this process, follows the
4 partitions of a topic (as the long-polls of any number of readers would: one consumer
whatever their number) or not, and has another process write ``--mb`` MB in records of
``--record-bytes``.  Printed per run: this process's CPU per MB written, following and not
(the difference is the tail's fetching; what readers' answers cost comes on top), and the
partition ends the tail asked Kafka for per commit.  ``--writer here`` writes from this
process instead (its store the partitions' writer, as a gateway that owns the partitions its
readers wait on): the CPU then includes the writes, and the tail asks for no end of a commit
its own writer made.

    python benchmarks/append_tail_bench.py [--mb 200] [--record-bytes 1000] [--runs 3]
        [--writer elsewhere|here] [--json PATH]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from log_store import TopicConfig  # noqa: E402
from log_store.kafka import KafkaSettings, open_kafka_store  # noqa: E402
from ops.local_kafka import LocalKafka  # noqa: E402

PARTITIONS = 4
_WRITER = """
import sys
from log_store.kafka import KafkaSettings, open_kafka_store
bootstrap, namespace, total, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
append_bytes = int(sys.argv[5])
store = open_kafka_store(KafkaSettings(bootstrap, namespace=namespace, operation_timeout_s=20))
per_append = max(1, append_bytes // size)
record = b"x" * size
for n in range(max(1, total // (per_append * size))):
    store.append("dc1.app", n % 4, [record] * per_append)
store.close()
"""


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def one_run(
    bootstrap: str,
    follow: bool,
    mb: int,
    record_bytes: int,
    append_bytes: int = 256 * 1024,
    writer_here: bool = False,
) -> tuple[float, float]:
    """This process's CPU in ms per MB another process (or, ``writer_here``, this one)
    writes, its store following or not; and the ends its tail asked Kafka for per commit."""
    namespace = f"b{uuid.uuid4().hex[:8]}."
    store = open_kafka_store(KafkaSettings(bootstrap, namespace=namespace, operation_timeout_s=20))
    try:
        store.create_topic("dc1.app", TopicConfig(partitions=PARTITIONS))
        unfollows = [
            store.follow_appends("dc1.app", p, lambda: None) for p in range(PARTITIONS) if follow
        ]
        per_append = max(1, append_bytes // record_bytes)
        commits = max(1, mb * 10**6 // (per_append * record_bytes))
        if writer_here:
            for p in range(PARTITIONS):
                store.append("dc1.app", p, [b"x"])  # taken over before the count begins
        time.sleep(2)  # assigned, and its first fetches made
        looks = store.tail_end_looks
        before = _cpu_s()
        if writer_here:
            record = b"x" * record_bytes
            for n in range(commits):
                store.append("dc1.app", n % PARTITIONS, [record] * per_append)
        else:
            writer = [sys.executable, "-c", _WRITER, bootstrap, namespace]
            subprocess.run(
                [*writer, str(mb * 10**6), str(record_bytes), str(append_bytes)],
                check=True,
                cwd=REPO,
            )
        time.sleep(2)  # the tail has caught up
        spent = _cpu_s() - before
        looks = store.tail_end_looks - looks
        for unfollow in unfollows:
            unfollow()
    finally:
        store.close()
    return spent * 1000 / mb, looks / commits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=int, default=200)
    parser.add_argument("--record-bytes", type=int, default=1000)
    parser.add_argument(
        "--append-bytes",
        type=int,
        default=256 * 1024,
        help="bytes of records per append (a Kafka transaction): a gateway under load "
        "commits about 2.5 MB at a time",
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--writer",
        choices=("elsewhere", "here"),
        default="elsewhere",
        help="who writes: another process (default), or this one, the partitions' writer",
    )
    parser.add_argument("--json", type=Path, help="also write the figures here as JSON")
    args = parser.parse_args()
    rows: dict[str, list[float]] = {"following": [], "not following": []}
    looks: list[float] = []
    with tempfile.TemporaryDirectory(prefix="append-tail-bench-") as tmp:
        cluster = LocalKafka(Path(tmp) / "kafka", nodes_count=1)
        cluster.start()
        try:
            for _ in range(args.runs):
                for name, follow in (("following", True), ("not following", False)):
                    cpu, asked = one_run(
                        cluster.bootstrap,
                        follow,
                        args.mb,
                        args.record_bytes,
                        args.append_bytes,
                        writer_here=args.writer == "here",
                    )
                    rows[name].append(cpu)
                    if follow:
                        looks.append(asked)
        finally:
            cluster.stop()
    print(
        f"\n{args.mb} MB written in records of {args.record_bytes} B, "
        f"{args.append_bytes} B per append, {args.runs} runs, written {args.writer}"
    )
    print("| this process | CPU ms per MB written, per run | median |")
    print("|---|---|---|")
    for name, values in rows.items():
        runs = " / ".join(f"{v:.1f}" for v in values)
        print(f"| {name} | {runs} | {statistics.median(values):.1f} |")
    print(
        "partition ends the tail asked Kafka for, per commit: "
        + " / ".join(f"{v:.2f}" for v in looks)
    )
    write_json(args, rows)


def write_json(args: argparse.Namespace, rows: dict[str, list[float]]) -> None:
    """The table's figures for ``logbroker bench all`` (see benchmarks/benchmark_results.py):
    the CPU per MB following, and not (no ratio: not following costs about nothing)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from benchmark_results import Figure, write

    figures = [
        Figure.of_runs(f"this process's CPU per MB written, {name}", values, "ms")
        for name, values in rows.items()
    ]
    write(args.json, "append_tail", args, figures)


if __name__ == "__main__":
    main()
