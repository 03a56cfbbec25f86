"""Gauges of the whole gateway read from its store at each scrape: disk, offsets, consumer lag.

Every worker (and every gateway over one Kafka cluster) would read the same values, so they are
:meth:`~ingest_api.metrics.MetricsRegistry.collected_gauge`: read by the process that answers
the scrape, never added up.  Internal topics (``logbroker-internal.*``) are left out.
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from delivery.consumer_group import GroupCoordinator
from delivery.internal_state import InternalState, is_internal
from delivery.push import SubscriptionRegistry, UnknownSubscription
from ingest_api.metrics import LabelValues, MetricsRegistry
from log_store.errors import BadRequest
from log_store.interface import LogStore, TopicInfo

Sample = tuple[LabelValues, float]
_SNAPSHOT_S = 1.0
"""One scrape reads the topics once: the partition gauges share what was read this long ago."""
_READ_TIMEOUT_S = 2.0
"""A gauge's store read not done by then is left out of the scrape (see ``_BoundedRead``)."""
_WAIT_WHILE_STUCK_S = 0.1
"""How long a gauge's read is waited for while another gauge's read is stuck."""

log = logging.getLogger(__name__)


class _BoundedRead:
    """A gauge's store read that a hung disk cannot make the scrape wait for.

    The read runs in a thread of its own and is waited for ``timeout_s`` at most; a read still
    outstanding is not started again, and later scrapes do not wait for it: until it returns,
    the gauge is left out of the scrape (absent, not stale), and ``/readyz`` says why.  While
    one gauge's read is stuck (``stuck``, shared by the gauges), the others are waited for
    ``_WAIT_WHILE_STUCK_S`` only: a hung disk costs one scrape ``timeout_s``, not one per gauge.
    """

    def __init__(
        self, name: str, read: Callable[[], list[Sample]], timeout_s: float, stuck: set[str]
    ) -> None:
        self._name = name
        self._read = read
        self._timeout_s = timeout_s
        self._stuck = stuck
        self._lock = threading.Lock()
        self._in_flight: concurrent.futures.Future[list[Sample]] | None = None
        self._started = 0.0

    def __call__(self) -> list[Sample]:
        with self._lock:
            wait_s = self._timeout_s
            if self._in_flight is None or self._in_flight.done():
                self._in_flight = self._start()
                self._started = time.monotonic()
            else:
                wait_s = max(0.0, self._started + self._timeout_s - time.monotonic())
            if self._stuck - {self._name}:
                wait_s = min(wait_s, _WAIT_WHILE_STUCK_S)
            read = self._in_flight
        try:
            samples = read.result(timeout=wait_s)
        except concurrent.futures.TimeoutError:
            if time.monotonic() - self._started >= self._timeout_s:
                self._stuck.add(self._name)
            log.warning("metrics: %s left out, its store read has not returned", self._name)
            return []
        self._stuck.discard(self._name)
        return samples

    def _start(self) -> concurrent.futures.Future[list[Sample]]:
        future: concurrent.futures.Future[list[Sample]] = concurrent.futures.Future()

        def run() -> None:
            try:
                future.set_result(self._read())
            except BaseException as exc:
                future.set_exception(exc)

        threading.Thread(target=run, name=f"logbroker-gauge-{self._name}", daemon=True).start()
        return future


class _Delivery:
    """The groups and subscriptions of the store, opened on the first scrape that needs them."""

    def __init__(self, store: LogStore) -> None:
        self._store = store
        self._parts: tuple[GroupCoordinator, SubscriptionRegistry] | None = None

    def parts(self) -> tuple[GroupCoordinator, SubscriptionRegistry]:
        if self._parts is None:
            state = InternalState(self._store)
            self._parts = (
                GroupCoordinator(self._store, state),
                SubscriptionRegistry(self._store, state),
            )
        return self._parts


class _TopicsSnapshot:
    """Every topic described once per scrape, for the three partition gauges that read it."""

    def __init__(self, store: LogStore) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._taken = -math.inf
        self._topics: list[TopicInfo] = []

    def get(self) -> list[TopicInfo]:
        with self._lock:
            if time.monotonic() - self._taken > _SNAPSHOT_S:
                self._topics = list(_topics(self._store))
                self._taken = time.monotonic()
            return self._topics


def _topics(store: LogStore) -> Iterator[TopicInfo]:
    for topic in store.list_topics():
        if is_internal(topic.name):
            continue
        try:
            yield store.describe_topic(topic.name)
        except BadRequest:
            continue  # deleted since the listing


def register_store_gauges(
    metrics: MetricsRegistry,
    store: LogStore,
    data_dir: Path | None,
    read_timeout_s: float = _READ_TIMEOUT_S,
) -> None:
    """Register the gateway-wide gauges; ``data_dir`` is the embedded store's (None on Kafka).
    Each is read within ``read_timeout_s`` or left out of the scrape (``_BoundedRead``)."""

    stuck: set[str] = set()

    def collected_gauge(
        name: str, help_text: str, labels: tuple[str, ...], read: Callable[[], list[Sample]]
    ) -> None:
        bounded = _BoundedRead(name, read, read_timeout_s, stuck)
        metrics.collected_gauge(name, help_text, labels, bounded)

    if data_dir is not None:
        directory = str(data_dir)

        def disk(attribute: str) -> list[Sample]:
            fs = os.statvfs(directory)
            blocks = fs.f_bavail if attribute == "free" else fs.f_blocks
            return [((), float(blocks * fs.f_frsize))]

        collected_gauge(
            "logbroker_disk_free_bytes",
            "bytes free for the gateway on the file system of its data dir",
            (),
            lambda: disk("free"),
        )
        collected_gauge(
            "logbroker_disk_size_bytes",
            "size of the file system of the gateway's data dir",
            (),
            lambda: disk("size"),
        )

    topics = _TopicsSnapshot(store)

    def partitions(field: str) -> list[Sample]:
        return [
            ((t.name, str(p.partition)), float(value))
            for t in topics.get()
            for p in t.partitions
            if (value := getattr(p, field)) is not None
        ]

    collected_gauge(
        "logbroker_partition_end_offset",
        "the offset the next message of a partition will get (its growth is the write rate)",
        ("topic", "partition"),
        lambda: partitions("end_offset"),
    )
    collected_gauge(
        "logbroker_partition_start_offset",
        "the first offset a partition still holds (retention moves it)",
        ("topic", "partition"),
        lambda: partitions("start_offset"),
    )
    if store.capabilities.segment_files:  # Kafka's sizes are the brokers' (kafka-log-dirs)
        collected_gauge(
            "logbroker_partition_size_bytes",
            "bytes a partition takes in the store",
            ("topic", "partition"),
            lambda: partitions("size_bytes"),
        )
    delivery = _Delivery(store)

    def group_lag() -> list[Sample]:
        groups, _ = delivery.parts()
        lag: dict[tuple[str, str], int] = {}
        for group in groups.names():
            try:
                described = groups.describe(group)
            except BadRequest:
                continue
            for p in described["partitions"]:
                if p["lag"] is not None:
                    key = (group, p["topic"])
                    lag[key] = lag.get(key, 0) + max(0, int(p["lag"]))
        return [(key, float(value)) for key, value in sorted(lag.items())]

    collected_gauge(
        "logbroker_consumer_group_lag_messages",
        "messages of a topic a consumer group has not committed yet (over its partitions)",
        ("group", "topic"),
        group_lag,
    )

    def push_lag() -> list[Sample]:
        _, subscriptions = delivery.parts()
        lag: dict[tuple[str, str], int] = {}
        for sub in subscriptions.list():
            try:
                status = subscriptions.status(sub.name)
            except UnknownSubscription:
                continue
            for p in status["partitions"]:
                if p["lag"] is not None:
                    key = (sub.name, p["topic"])
                    lag[key] = lag.get(key, 0) + max(0, int(p["lag"]))
        return [(key, float(value)) for key, value in sorted(lag.items())]

    collected_gauge(
        "logbroker_push_subscription_lag_messages",
        "messages of a topic a push subscription has not delivered yet (over its partitions)",
        ("subscription", "topic"),
        push_lag,
    )

    def push_skipped() -> list[Sample]:
        _, subscriptions = delivery.parts()
        samples: list[Sample] = []
        for sub in subscriptions.list():
            # the state document only: status() would describe every topic again, as the lag
            # gauge just did
            for kind, count in sorted(subscriptions.skipped(sub.name).items()):
                samples.append(((sub.name, kind), float(count)))
        return samples

    collected_gauge(
        "logbroker_push_subscription_skipped_messages",
        "messages a push subscription passed over undelivered since it was made, by kind: "
        "not_envelope (another producer's record), lost_to_retention",
        ("subscription", "kind"),
        push_skipped,
    )
