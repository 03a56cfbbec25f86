"""The dashboard's data: one JSON document of topics, rates, lags, clients and disk use.

Everything comes from the store, so any worker of any gateway over the same store answers the
same: topics and partitions (offsets, sizes, retention), consumer groups and push
subscriptions (their positions against the partitions' ends), and what push-clients and
mirrors last reported (:mod:`ingest_api.client_status`).

A token sees only what it may read.  A damaged partition (embedded store) is a row that says
so (``damaged``, as ``GET /v1/topics/{topic}`` says it), in its topic and in the groups and
subscriptions reading it, never a failure of the whole answer: every token's dashboard would
go dark, and its error name a topic that token may not know of.

Rates are differences over a sliding window (:class:`RateWindow`): each answer samples the
partitions' end offsets and sizes and the readers' positions, and compares the sample with
one taken about ``window_s`` earlier by the same worker.  Samples are taken only when someone
asks (the page asks every two seconds), so an idle dashboard costs nothing; the first answer
of a worker has no rates yet (``null``).
"""

from __future__ import annotations

import shutil
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from delivery.consumer_group import GroupCoordinator, with_end
from delivery.internal_state import is_internal
from delivery.push import SubscriptionRegistry
from ingest_api.access import Access
from ingest_api.client_status import ClientReports
from ingest_api.settings import GatewaySettings
from log_store.errors import BadRequest
from log_store.interface import LogStore, PartitionInfo, TopicInfo

DEFAULT_WINDOW_S = 30.0
STALE_AFTER_S = 30.0
"""A client report older than this is marked stale: the client stopped or cannot reach us."""
MAX_GROUPS_SHOWN = 200
"""Groups (and subscriptions) beyond this many are counted, not described."""
MAX_ROWS_SHOWN_PER_CLIENT = 20
"""A client's files (or partitions) shown, the most behind first; the others are counted
(``files_left_out``, ``partitions_left_out``)."""
MAX_ROWS_SHOWN = 1000
"""Files and partitions of every client shown in one answer, in all: past it, clients are
listed with their totals and counts only, so one token's reports cannot make every refresh
of every dashboard large."""
_MIN_SPAN_S = 0.2
_Partitions = dict[tuple[str, int], PartitionInfo]
"""Every partition of the listed topics as just described, by (topic, partition)."""


@dataclass(frozen=True)
class TopicTotals:
    """Counters of one topic at one instant: they only grow while the topic lives."""

    end_offsets: int
    size_bytes: int | None
    """None where the store does not know partition sizes (Kafka)."""
    read_positions: int


@dataclass
class _Sample:
    at: float
    totals: dict[str, TopicTotals]


@dataclass(frozen=True)
class TopicRates:
    """Per second over the window: messages written, bytes written, messages read."""

    messages: float
    bytes: float | None
    """None where the store does not know partition sizes (Kafka)."""
    read_messages: float


@dataclass
class RateWindow:
    """Rates per topic over the last ``window_s`` seconds, from samples of growing totals."""

    window_s: float = DEFAULT_WINDOW_S
    clock: Callable[[], float] = time.monotonic
    _samples: deque[_Sample] = field(default_factory=deque)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, totals: dict[str, TopicTotals]) -> dict[str, TopicRates | None]:
        """Record ``totals`` as of now; the rates from the window's base sample to them.

        The base is the newest sample at least ``window_s`` old, or, while the worker has
        none that old, its oldest.  A total that went down (a topic deleted and created
        again, retention shrinking the size) counts as no growth, never as a negative rate.
        """
        now = self.clock()
        with self._lock:
            while self._samples and now - self._samples[0].at > 2 * self.window_s:
                self._samples.popleft()
            base = None
            for sample in self._samples:
                if now - sample.at >= self.window_s:
                    base = sample
            if base is None and self._samples:
                base = self._samples[0]
            self._samples.append(_Sample(now, totals))
        rates: dict[str, TopicRates | None] = {}
        for topic, current in totals.items():
            before = None if base is None else base.totals.get(topic)
            span = 0.0 if base is None else now - base.at
            if before is None or span < _MIN_SPAN_S:
                rates[topic] = None
                continue
            rates[topic] = TopicRates(
                max(0, current.end_offsets - before.end_offsets) / span,
                None
                if current.size_bytes is None or before.size_bytes is None
                else max(0, current.size_bytes - before.size_bytes) / span,
                max(0, current.read_positions - before.read_positions) / span,
            )
        return rates


class Overview:
    """Builds the ``GET /v1/ui/overview`` document (blocking: call it in a worker thread)."""

    def __init__(
        self,
        store: LogStore,
        settings: GatewaySettings,
        groups: GroupCoordinator,
        subscriptions: SubscriptionRegistry,
        clients: ClientReports,
        window: RateWindow,
    ) -> None:
        self._store = store
        self._settings = settings
        self._groups = groups
        self._subscriptions = subscriptions
        self._clients = clients
        self._window = window

    def build(self, access: Access) -> dict[str, Any]:
        """What ``access`` may see: readable topics, its groups and subscriptions, the client
        reports about readable topics (or made with its token)."""
        infos = self._topics()
        partitions = {
            (name, p.partition): p for name, info in infos.items() for p in info.partitions
        }
        all_groups = self._all_group_rows(partitions)
        all_subscriptions = self._all_subscription_rows(partitions)
        read_positions = _positions_by_topic(all_groups)
        read_positions_push = _positions_by_topic(all_subscriptions)
        totals = {
            name: TopicTotals(
                sum(p.end_offset for p in info.partitions),
                _total_size(info),
                read_positions.get(name, 0) + read_positions_push.get(name, 0),
            )
            for name, info in infos.items()
        }
        rates = self._window.add(totals)
        budget = _RowBudget()
        topics = [
            _topic_row(info, rates.get(name))
            for name, info in sorted(infos.items())
            if access.may_read(name)
        ]
        return {
            "now_ms": int(time.time() * 1000),
            "dc": self._settings.dc,
            "store": self._settings.store,
            "window_s": self._window.window_s,
            "disk": self._disk(access),
            "topics": topics,
            "groups": self._group_rows(access, all_groups),
            "subscriptions": self._subscription_rows(access, all_subscriptions),
            "push_clients": self._push_clients(access, budget),
            "mirrors": self._mirrors(access, budget),
        }

    # -- parts ------------------------------------------------------------------------------
    def _topics(self) -> dict[str, TopicInfo]:
        infos: dict[str, TopicInfo] = {}
        for listed in self._store.list_topics():
            if is_internal(listed.name):
                continue
            try:
                infos[listed.name] = self._store.describe_topic(listed.name)
            except BadRequest:
                continue  # deleted since it was listed
        return infos

    def _disk(self, access: Access) -> dict[str, Any] | None:
        """The data directory's file system; its path only for an admin token (or no auth)."""
        if self._settings.store != "sqlite":
            return None  # Kafka's brokers own the disks; their own metrics show them
        usage = shutil.disk_usage(self._settings.data_dir)
        return {
            "path": str(self._settings.data_dir) if access.is_admin else None,
            "total_bytes": usage.total,
            "used_bytes": usage.used,
            "free_bytes": usage.free,
        }

    def _all_group_rows(self, partitions: _Partitions) -> list[dict[str, Any]]:
        """Every group's positions, with the partitions' ends as just described: they are
        not read again, and a damaged one is a row that says so, never a failure of the
        answer (which every token would see, those that may not read the topic too)."""
        rows = []
        for name in self._groups.names()[:MAX_GROUPS_SHOWN]:
            try:
                described = self._groups.positions(name)
            except BadRequest:
                continue
            rows_of_group = []
            for p in described["partitions"]:
                info = partitions.get((p["topic"], p["partition"]))
                if info is not None:  # else its topic is gone (or internal)
                    rows_of_group.append(with_end(p, info.end_offset, info.damaged))
            described["partitions"] = rows_of_group
            rows.append(described)
        return rows

    def _group_rows(self, access: Access, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for described in rows:
            _, owner = self._groups.owner_of(described["group"])
            if not access.owns(owner):
                continue
            partitions = [p for p in described["partitions"] if access.may_read(p["topic"])]
            out.append(
                {
                    "group": described["group"],
                    "members": len(described["members"]),
                    "topics": sorted({p["topic"] for p in partitions}),
                    "lag": _total_lag(partitions),
                    "partitions": partitions,
                }
            )
        return out

    def _all_subscription_rows(self, partitions: _Partitions) -> list[dict[str, Any]]:
        rows = []
        for sub, owner in self._subscriptions.list_owned()[:MAX_GROUPS_SHOWN]:
            try:
                status = self._subscriptions.status(sub.name)
            except BadRequest:
                continue
            rows_of_sub = []
            for p in status["partitions"]:
                info = partitions.get((p["topic"], p["partition"]))
                if info is not None and info.damaged is not None:
                    p = {**p, "lag": None, "damaged": info.damaged}
                rows_of_sub.append(p)
            rows.append({"name": sub.name, "owner": owner, "partitions": rows_of_sub})
        return rows

    def _subscription_rows(
        self, access: Access, rows: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        out = []
        for row in rows:
            if not access.owns(row["owner"]):
                continue
            partitions = [
                {**p, "committed": p["position"]}
                for p in row["partitions"]
                if access.may_read(p["topic"])
            ]
            out.append(
                {
                    "name": row["name"],
                    "topics": sorted({p["topic"] for p in partitions}),
                    "lag": _total_lag(partitions),
                    "partitions": partitions,
                }
            )
        return out

    def _push_clients(self, access: Access, budget: _RowBudget) -> list[dict[str, Any]]:
        out = []
        for report in self._clients.reports("push"):
            mine = access.owner is not None and access.owns(report.owner)
            files = [
                {**row, "topic": f"{self._settings.dc}.{row['log_type']}"} for row in report.rows
            ]
            files = [f for f in files if mine or access.may_read(f["topic"])]
            if not files and not mine:
                continue
            shown = budget.take(files, "lag_bytes")
            out.append(
                {
                    "client": report.client,
                    "host": report.host,
                    "reported_ms": report.reported_ms,
                    "stale": _stale(report.reported_ms),
                    "lag_bytes": sum(f["lag_bytes"] for f in files),
                    "files": shown,
                    "files_left_out": len(files) - len(shown) + report.left_out,
                }
            )
        return out

    def _mirrors(self, access: Access, budget: _RowBudget) -> list[dict[str, Any]]:
        out = []
        for report in self._clients.reports("mirror"):
            partitions = [row for row in report.rows if access.may_read(row["topic"])]
            if not partitions:
                continue
            shown = budget.take(partitions, "lag")
            out.append(
                {
                    "client": report.client,
                    "host": report.host,
                    "reported_ms": report.reported_ms,
                    "stale": _stale(report.reported_ms),
                    "lag": sum(p["lag"] for p in partitions),
                    "partitions": shown,
                    "partitions_left_out": len(partitions) - len(shown) + report.left_out,
                }
            )
        return out


@dataclass
class _RowBudget:
    """The client rows one overview answer still shows."""

    left: int = MAX_ROWS_SHOWN

    def take(self, rows: list[dict[str, Any]], lag: str) -> list[dict[str, Any]]:
        """What this answer shows of one client's ``rows``: all, in their order, if they fit
        its share, else the ones most behind (largest ``lag``)."""
        share = min(MAX_ROWS_SHOWN_PER_CLIENT, self.left)
        shown = rows if len(rows) <= share else sorted(rows, key=lambda r: -r[lag])[:share]
        self.left -= len(shown)
        return shown


def _total_size(info: TopicInfo) -> int | None:
    """The topic's bytes; None if the store does not know a partition's (Kafka)."""
    sizes = [p.size_bytes for p in info.partitions]
    return None if None in sizes else sum(s for s in sizes if s is not None)


def _partition_row(p: PartitionInfo) -> dict[str, Any]:
    row: dict[str, Any] = {
        "partition": p.partition,
        "start_offset": p.start_offset,
        "end_offset": p.end_offset,
        "size_bytes": p.size_bytes,
        "segments": p.segments,
    }
    if p.damaged is not None:
        row["damaged"] = p.damaged  # as GET /v1/topics/{topic} says it
    return row


def _topic_row(info: TopicInfo, rates: TopicRates | None) -> dict[str, Any]:
    """Sizes the store does not know (Kafka) are null.  A damaged partition (embedded store)
    is a row like the others, with its offsets as its index says them and why (``damaged``);
    ``damaged_partitions`` counts them."""
    partitions = [_partition_row(p) for p in info.partitions]
    return {
        "name": info.name,
        "partitions": partitions,
        "damaged_partitions": sum(1 for p in info.partitions if p.damaged is not None),
        "end_offsets": sum(p.end_offset for p in info.partitions),
        "retained_offsets": sum(p.end_offset - p.start_offset for p in info.partitions),
        "size_bytes": _total_size(info),
        "retention_ms": info.config.retention_ms,
        "retention_bytes": info.config.retention_bytes,
        "segment_bytes": info.config.segment_bytes,
        "write_rate": None if rates is None else round(rates.messages, 3),
        "write_bytes_rate": None if rates is None or rates.bytes is None else round(rates.bytes, 1),
        "read_rate": None if rates is None else round(rates.read_messages, 3),
    }


def _stale(reported_ms: int) -> bool:
    return time.time() * 1000 - reported_ms > STALE_AFTER_S * 1000


def _total_lag(partitions: Iterable[dict[str, Any]]) -> int | None:
    lags = [p["lag"] for p in partitions if p.get("lag") is not None]
    return sum(lags) if lags else None


def _positions_by_topic(rows: Iterable[dict[str, Any]]) -> dict[str, int]:
    """The sum of every reader's committed position per topic (it grows as they read)."""
    out: dict[str, int] = {}
    for row in rows:
        for p in row["partitions"]:
            position = p.get("committed", p.get("position"))
            if position is not None:
                out[p["topic"]] = out.get(p["topic"], 0) + int(position)
    return out
