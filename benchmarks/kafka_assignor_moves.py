"""How many partitions move when a gateway joins or leaves, with Kafka's range or uniform assignor.

    python benchmarks/kafka_assignor_moves.py [--runs 4] [--bootstrap HOST:PORT]

Each case is a KIP-848 consumer group (``group.protocol=consumer``) of bare consumers that
pause what they are given, as the gateways' group does (``log_store/kafka/gateway_group.py``),
subscribed to fresh topics: two members settle, a third joins (partitions moved, and the
fewest that would do), then the first leaves.  Each move is what a gateway pays as a takeover
(fence, snapshot, tail).  The spread columns show, per topic, how many partitions each member
holds (``4`` alone: the whole topic on one member).  Without ``--bootstrap`` a local broker is
started (``ops/local_kafka.py``) and stopped at the end.  Prints a table; never fails.
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from confluent_kafka import Consumer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from ops.local_kafka import LocalKafka  # noqa: E402

SHAPES = ([12], [4, 4, 4], [4] * 6)
ASSIGNORS = ("range", "uniform")
_QUIET_S = 3.0
_SETTLE_TIMEOUT_S = 90.0

Owners = dict[tuple[str, int], str]


class _Member:
    """One group member on a thread of its own; ``owned()`` is what it holds now."""

    def __init__(self, name: str, bootstrap: str, group: str, topics: list[str], assignor: str):
        self.name = name
        self._owned: set[tuple[str, int]] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "group.protocol": "consumer",
                "group.remote.assignor": assignor,
                "enable.auto.commit": False,
                "log_level": 0,
            }
        )
        self._consumer.subscribe(
            topics, on_assign=self._assign, on_revoke=self._revoke, on_lost=self._revoke
        )
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _assign(self, consumer: Consumer, parts: list[TopicPartition]) -> None:
        consumer.incremental_assign(parts)
        if parts:
            consumer.pause(parts)
        with self._lock:
            self._owned |= {(p.topic, p.partition) for p in parts}

    def _revoke(self, consumer: Consumer, parts: list[TopicPartition]) -> None:
        with self._lock:
            self._owned -= {(p.topic, p.partition) for p in parts}
        consumer.incremental_unassign(parts)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._consumer.poll(0.1)
        self._consumer.close()

    def leave(self) -> None:
        self._stop.set()
        self._thread.join()

    def owned(self) -> frozenset[tuple[str, int]]:
        with self._lock:
            return frozenset(self._owned)


def _settled(members: list[_Member], total: int) -> Owners:
    """The owners once every partition has one, every member has some, and nothing moved for
    a while."""
    last: dict[str, frozenset[tuple[str, int]]] | None = None
    since = time.monotonic()
    deadline = since + _SETTLE_TIMEOUT_S
    while time.monotonic() < deadline:
        now = {m.name: m.owned() for m in members}
        held = [p for parts in now.values() for p in parts]
        if now != last:
            last, since = now, time.monotonic()
        elif (
            len(held) == total == len(set(held))
            and all(now.values())
            and time.monotonic() - since > _QUIET_S
        ):
            return {p: name for name, parts in now.items() for p in parts}
        time.sleep(0.1)
    raise RuntimeError(f"the group did not settle: {last}")


def _spread(owners: Owners, topics: list[str]) -> str:
    shown = []
    for topic in topics:
        counts = collections.Counter(o for (t, _), o in owners.items() if t == topic)
        shown.append("/".join(str(counts[m]) for m in sorted(counts)))
    return " ".join(shown)


def _moved(before: Owners, after: Owners) -> int:
    return sum(1 for p, owner in before.items() if after.get(p) != owner)


def _fewest_on_join(before: Owners) -> int:
    """Moves a balanced assignment over one more member needs at least: what the members
    hold above their new share."""
    per_member = collections.Counter(before.values())
    share = -(-len(before) // (len(per_member) + 1))
    return sum(max(0, held - share) for held in per_member.values())


def case(bootstrap: str, assignor: str, shape: list[int]) -> tuple[int, int, int, str, str]:
    tag = uuid.uuid4().hex[:8]
    topics = [f"moves-{tag}-{i}" for i in range(len(shape))]
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    for future in admin.create_topics(
        [NewTopic(t, n, replication_factor=1) for t, n in zip(topics, shape, strict=True)]
    ).values():
        future.result()
    total = sum(shape)
    group = f"moves-{tag}"
    first = _Member("a", bootstrap, group, topics, assignor)
    second = _Member("b", bootstrap, group, topics, assignor)
    two = _settled([first, second], total)
    third = _Member("c", bootstrap, group, topics, assignor)
    three = _settled([first, second, third], total)
    first.leave()
    after_leave = _settled([second, third], total)
    second.leave()
    third.leave()
    admin.delete_topics(topics)
    return (
        _moved(two, three),
        _fewest_on_join(two),
        _moved(three, after_leave),
        _spread(two, topics),
        _spread(three, topics),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--bootstrap", help="a running broker (default: start a local one)")
    args = parser.parse_args()
    cluster = None
    bootstrap = args.bootstrap
    if bootstrap is None:
        cluster = LocalKafka(Path(tempfile.mkdtemp(prefix="assignor-moves-")), 1).start()
        bootstrap = cluster.bootstrap
    try:
        print("| topics x partitions | assignor | moved on join (fewest) | moved on leave "
              "| spread over two | spread over three |")  # fmt: skip
        print("|---|---|---|---|---|---|")
        for shape in SHAPES:
            for assignor in ASSIGNORS:
                for _ in range(args.runs):
                    join, fewest, leave, two, three = case(bootstrap, assignor, shape)
                    label = f"{len(shape)} x {shape[0]}"
                    print(
                        f"| {label} | {assignor} | {join} ({fewest}) | {leave} | {two} | {three} |",
                        flush=True,
                    )
    finally:
        if cluster is not None:
            cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
