"""Idle source expiry on Apache Kafka against the embedded store: one pass over a partition.

    python benchmarks/kafka_expiry_bench.py [--sources 100000] [--runs 3] [--json PATH]

One local Kafka broker (``ops/local_kafka.py``) and an embedded store in a temporary
directory, filled the same way: one topic of one partition whose seqno table holds
``--sources`` sources, each with a last seqno and a pin.  Cases, each a
``SourceExpiry.run_once`` (medians of ``--runs``, every run in a namespace of its own):

* *scan*: no source is idle: the pass lists the table and the pins and changes nothing (what
  every pass costs while the sources are written);
* *expire all*: every source is idle: the pass forgets them all (their seqnos, the count) in
  the partition's transactions and deletes their pins.

And what expiry costs the write path on Kafka: the first write of each of ``--new-sources``
new sources, one at a time, with the router reading the topic's pin deletion count (as it
does on a store whose pins expiry may delete) and without (as before Kafka had expiry).

Prints a table; never fails on speed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmark_results import Figure, write  # noqa: E402

from log_store import LogStore, PartitionState, TopicConfig, open_store  # noqa: E402
from log_store.kafka import KafkaSettings, open_kafka_store  # noqa: E402
from ops.local_kafka import LocalKafka  # noqa: E402
from session_dedup.exactly_once import ChunkBatch, ExactlyOnceWriter  # noqa: E402
from session_dedup.pinning import encode_pin, pin_key  # noqa: E402
from session_dedup.seqno_table import (  # noqa: E402
    SOURCE_COUNT_KEY,
    encode_seqno,
    encode_source_value,
    seqno_key,
)
from session_dedup.source import SourceMeta  # noqa: E402
from session_dedup.source_expiry import SourceExpiry  # noqa: E402

TOPIC = "dc1.expiry"
IDLE_S = 3600.0
_BATCH = 10_000


def fill(store: LogStore, sources: int, written_ms: int) -> None:
    """``sources`` sources in partition 0, each with a seqno written at ``written_ms`` and a pin."""
    info = store.create_topic(TOPIC, TopicConfig(partitions=1))
    names = [f"host-{i:06d}:/var/log/app.log:2049:{i}" for i in range(sources)]
    for start in range(0, sources, _BATCH):
        batch = names[start : start + _BATCH]

        def fn(state: PartitionState, batch: list[str] = batch, count: int = start) -> list[bytes]:
            for name in batch:
                state.put(seqno_key(name), encode_source_value(7, written_ms))
            state.put(SOURCE_COUNT_KEY, encode_seqno(count + len(batch)))
            return [b"x"]

        store.transact(TOPIC, 0, fn)
        store.put_topic_state_many_if_absent(
            TOPIC, {pin_key(info.topic_id, name): encode_pin(0) for name in batch}
        )


def one_pass(store: LogStore, now_ms: int, expect_expired: int) -> float:
    expiry = SourceExpiry(store, IDLE_S)
    started = time.perf_counter()
    done = expiry.run_once(now_ms)
    seconds = time.perf_counter() - started
    assert done.expired == expect_expired, done
    return seconds


def measure(store: LogStore, sources: int) -> tuple[float, float]:
    """(scan seconds, expire-all seconds) of one store."""
    written = int(time.time() * 1000)
    fill(store, sources, written)
    scan = one_pass(store, written + 1000, 0)
    expire = one_pass(store, written + int(IDLE_S * 1000) + 1000, sources)
    return scan, expire


def new_source_writes(store: LogStore, count: int, *, count_read: bool) -> float:
    """Milliseconds per first write of a new source, one after another."""
    writer = ExactlyOnceWriter(store, dc="dc1", partitions=4)
    # the router reads the deletion count only on a store whose pins may be deleted; this
    # switches that off to measure the write path as it was before
    writer.router._pins_deletable = count_read
    writer.write(SourceMeta("new", "warm-up"), ChunkBatch([1], [0], [b"x\n"]))
    started = time.perf_counter()
    for i in range(count):
        writer.write(SourceMeta("new", f"s{i}"), ChunkBatch([1], [0], [b"x\n"]))
    return (time.perf_counter() - started) / count * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sources", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--new-sources", type=int, default=300)
    parser.add_argument("--json", type=Path, help="also write the figures here as JSON")
    args = parser.parse_args()
    rows: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="expiry-bench-") as tmp:
        work = Path(tmp)
        cluster = LocalKafka(work / "kafka", nodes_count=1)
        cluster.start()
        try:
            for run in range(args.runs):
                settings = KafkaSettings(
                    cluster.bootstrap, namespace=f"exp{run}.", operation_timeout_s=60
                )
                with open_kafka_store(settings) as kafka:
                    scan, expire = measure(kafka, args.sources)
                for count_read in (True, False):
                    name = f"new{run}{'c' if count_read else 'n'}."
                    with open_kafka_store(KafkaSettings(cluster.bootstrap, namespace=name)) as s:
                        ms = new_source_writes(s, args.new_sources, count_read=count_read)
                    rows.setdefault(f"new source {count_read}", []).append(ms)
                rows.setdefault("kafka scan", []).append(scan)
                rows.setdefault("kafka expire", []).append(expire)
                with open_store(work / f"embedded{run}") as embedded:
                    scan, expire = measure(embedded, args.sources)
                rows.setdefault("embedded scan", []).append(scan)
                rows.setdefault("embedded expire", []).append(expire)
                print(
                    f"run {run + 1}: "
                    + ", ".join(
                        f"{name} {values[-1]:.2f} {'ms' if name.startswith('new') else 's'}"
                        for name, values in rows.items()
                    ),
                    flush=True,
                )
        finally:
            cluster.stop()

    def med(name: str) -> float:
        return statistics.median(rows[name])

    print()
    print(
        f"| one expiry pass, {args.sources:,} sources in one partition (median of "
        f"{args.runs}) | Kafka | embedded store | Kafka / embedded |"
    )
    print("|---|---:|---:|---:|")
    for case, label in (("scan", "no source idle (scan only)"), ("expire", "every source idle")):
        kafka, embedded = med(f"kafka {case}"), med(f"embedded {case}")
        print(f"| {label} | {kafka:.2f} s | {embedded:.2f} s | {kafka / embedded:.2f}x |")
    with_count, without = med("new source True"), med("new source False")
    print()
    print("| first write of a new source on Kafka, one at a time | ms | ratio |")
    print("|---|---:|---:|")
    print(f"| without the pin deletion count (before) | {without:.2f} | 1.00x |")
    print(
        f"| reading the pin deletion count (now) | {with_count:.2f} | {with_count / without:.2f}x |"
    )
    figures: list[Figure] = []
    for case, label in (("scan", "no source idle"), ("expire", "every source idle")):
        kafka_runs, embedded_runs = rows[f"kafka {case}"], rows[f"embedded {case}"]
        name = f"one expiry pass on Kafka, {args.sources:,} sources, {label}"
        figures.append(
            Figure.of_runs(name, kafka_runs, "s").compared(
                "embedded store",
                [k / e for k, e in zip(kafka_runs, embedded_runs, strict=True)],
            )
        )
    figures.append(
        Figure.of_runs(
            "first write of a new source on Kafka, reading the pin deletion count",
            rows["new source True"],
            "ms",
        ).compared(
            "without the count",
            [w / n for w, n in zip(rows["new source True"], rows["new source False"], strict=True)],
        )
    )
    write(args.json, "kafka_expiry", args, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
