"""Prometheus metrics of the push-client: a text file in the state dir and a local endpoint.

The text file (``metrics.prom``) suits node_exporter's textfile collector; ``metrics_port``
serves the same text at ``http://127.0.0.1:PORT/metrics`` for a direct scrape.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from push_client.identity import display_path

if TYPE_CHECKING:
    from push_client.files import Unreadable
    from push_client.installations import InstallationSet
    from push_client.tailer import TailedFile
    from push_client.transport import TransportStats


def _file_labels(tailed: TailedFile, **extra: str) -> dict[str, str]:
    # source as well as file: a rotated file and its successor may share a path for a while
    return {"file": display_path(tailed.path), "source": tailed.source_id, **extra}


class _Families:
    """The families one render builds, in the order they were added."""

    def __init__(self) -> None:
        self.families: list[Metric] = []

    def add(
        self,
        name: str,
        kind: str,
        help_text: str,
        samples: Iterable[tuple[dict[str, str], float]],
    ) -> None:
        rows = list(samples)
        label_names = sorted({k for labels, _ in rows for k in labels})
        family: Metric
        if kind == "counter":
            family = CounterMetricFamily(name, help_text, labels=label_names)
        else:
            family = GaugeMetricFamily(name, help_text, labels=label_names)
        for labels, value in rows:
            family.add_metric([labels[k] for k in label_names], float(value))
        self.families.append(family)


class _Snapshot(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


class PushCollector(Collector):
    """The push-client's metrics as a prometheus_client collector (for Graphite, say)."""

    def __init__(self, families: Callable[[], list[Metric]]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families())


class PushMetrics:
    """Counters kept outside the loop's own (request sizes from sender threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.request_bytes_total = 0
        self.requests_sent = 0
        self.state_corruptions = 0
        self.state_save_failures = 0
        self.overlap_bytes = 0
        """Bytes found in two installations (see ``push_client.handover.Overlap``)."""

    def observe_request_bytes(self, size: int) -> None:
        with self._lock:
            self.request_bytes_total += size
            self.requests_sent += 1

    def render(self, **state: Any) -> str:
        """The Prometheus text format of :meth:`families` (arguments as there)."""
        return generate_latest(_Snapshot(self.families(**state))).decode()

    def families(
        self,
        *,
        counters: Any,
        stats: TransportStats,
        files: Iterable[TailedFile],
        buffered: int,
        in_flight: int,
        installations: InstallationSet,
        parked_total: int,
        abandoned_bytes: int,
        unreadable: Sequence[Unreadable] = (),
        failing_gateways: dict[str, list[dict[str, Any]]] | None = None,
    ) -> list[Metric]:
        out = _Families()
        metric = out.add
        none: dict[str, str] = {}
        metric(
            "logbroker_push_read_bytes_total",
            "counter",
            "Bytes cut into chunks.",
            [(none, counters.read_bytes)],
        )
        metric(
            "logbroker_push_acked_bytes_total",
            "counter",
            "Bytes the gateway acknowledged.",
            [(none, counters.acked_bytes)],
        )
        metric(
            "logbroker_push_acked_chunks_total",
            "counter",
            "Chunks acknowledged.",
            [(none, counters.acked_chunks)],
        )
        metric(
            "logbroker_push_duplicate_chunks_total",
            "counter",
            "Chunks the gateway already held (answered duplicate).",
            [(none, counters.duplicate_chunks)],
        )
        metric(
            "logbroker_push_rotations_total",
            "counter",
            "Files rotated away.",
            [(none, counters.rotations)],
        )
        metric(
            "logbroker_push_fenced_total",
            "counter",
            "Requests refused because a newer session of their source fenced ours.",
            [(none, counters.fenced)],
        )
        metric(
            "logbroker_push_out_of_order_total",
            "counter",
            "Pipelined requests refused because they overtook their predecessor.",
            [(none, counters.out_of_order)],
        )
        metric(
            "logbroker_push_truncations_total",
            "counter",
            "Files truncated or replaced.",
            [(none, counters.truncations)],
        )
        metric(
            "logbroker_push_request_body_bytes_total",
            "counter",
            "Bytes of request bodies.",
            [(none, self.request_bytes_total)],
        )
        with stats.lock:
            outcomes = sorted(stats.requests.items())
            owner_writes = sorted(stats.owner_writes.items())
            owner_partitions = sorted(stats.owner_partitions.items())
            retries, failovers = stats.retries, stats.failovers
        metric(
            "logbroker_push_requests_total",
            "counter",
            "Requests by outcome.",
            [({"outcome": k}, v) for k, v in outcomes],
        )
        metric(
            "logbroker_push_owner_writes_total",
            "counter",
            "Write requests sent to a partition's owner directly (direct_to_owner): answered "
            "by it (owner), or failed there and sent to the configured gateways (fallback).",
            [({"outcome": k}, v) for k, v in owner_writes],
        )
        metric(
            "logbroker_push_owner_partitions",
            "gauge",
            "Partitions whose owner gateway is known and allowed, per installation "
            "(direct_to_owner; their sources are sent there).",
            [({"installation": k}, v) for k, v in owner_partitions],
        )
        metric("logbroker_push_retries_total", "counter", "Requests retried.", [(none, retries)])
        metric(
            "logbroker_push_failovers_total",
            "counter",
            "Switches to another gateway of an installation.",
            [(none, failovers)],
        )
        current = installations.current()
        metric(
            "logbroker_push_installation_up",
            "gauge",
            "Whether an installation is up (1) or left for the next one (0).",
            [({"installation": m.name}, int(m.up)) for m in installations.members],
        )
        metric(
            "logbroker_push_installation_unanswered",
            "gauge",
            "An installation up but idle whose probes (GET /readyz) fail now (1): with "
            "several installations it is marked down after failover_after_s of them.",
            [
                ({"installation": m.name}, int(m.up and m.unanswered_since is not None))
                for m in installations.members
            ],
        )
        metric(
            "logbroker_push_installation_current",
            "gauge",
            "The installation new data goes to (1).",
            [({"installation": m.name}, int(m is current)) for m in installations.members],
        )
        metric(
            "logbroker_push_gateway_failing",
            "gauge",
            "A gateway failing now (1): its last request or probe failed; one the client "
            "does not send to is probed until it answers, at waits doubling from "
            "probe_interval_s to probe_max_interval_s. error: the kind of failure.",
            [
                ({"installation": name, "gateway": gw["server"], "error": gw["error"]}, 1)
                for name, gateways in sorted((failing_gateways or {}).items())
                for gw in gateways
            ],
        )
        metric(
            "logbroker_push_installation_failovers_total",
            "counter",
            "Switches of the installation new data goes to.",
            [(none, installations.failovers)],
        )
        metric(
            "logbroker_push_parked_total",
            "counter",
            "Files parked because the gateway refused them.",
            [(none, parked_total)],
        )
        metric(
            "logbroker_push_abandoned_bytes_total",
            "counter",
            "Bytes written to rotated files after they were let go (not shipped).",
            [(none, abandoned_bytes)],
        )
        metric(
            "logbroker_push_state_corruptions_total",
            "counter",
            "State files found corrupt at start.",
            [(none, self.state_corruptions)],
        )
        metric(
            "logbroker_push_state_save_failures_total",
            "counter",
            "Saves of the positions that failed (state dir full or broken); shipping goes on.",
            [(none, self.state_save_failures)],
        )
        metric(
            "logbroker_push_overlap_bytes_total",
            "counter",
            "Bytes an installation was found to hold that were sent to another one too "
            "(written twice: positions older than that installation's log).",
            [(none, self.overlap_bytes)],
        )
        metric(
            "logbroker_push_unreadable_files",
            "gauge",
            "Files an entry matches that cannot be opened (no permission, say), and directories "
            "of entries that cannot be looked at: not shipped.",
            [(none, len(unreadable))],
        )
        metric(
            "logbroker_push_buffered_bytes",
            "gauge",
            "Read but unacknowledged bytes.",
            [(none, buffered)],
        )
        metric(
            "logbroker_push_requests_in_flight",
            "gauge",
            "Write requests in flight.",
            [(none, in_flight)],
        )
        rows = list(files)
        metric("logbroker_push_files", "gauge", "Files being shipped.", [(none, len(rows))])
        metric(
            "logbroker_push_lag_bytes",
            "gauge",
            "Bytes of a file not yet acknowledged (of an unreadable file: as last seen).",
            [(_file_labels(t), t.lag_bytes) for t in rows]
            + [
                ({"file": display_path(m.path), "source": ""}, m.lag_bytes)
                for m in unreadable
                if m.lag_bytes is not None
            ],
        )
        metric(
            "logbroker_push_file_unreadable",
            "gauge",
            "A file that cannot be opened (unreadable: not shipped), or a tailed file whose "
            "path cannot be looked at (stat: shipped, but its rotation is not noticed), and "
            "the error: its message and its symbolic errno (EACCES).",
            [
                (
                    {
                        "file": display_path(m.path),
                        "source": "",
                        "what": "unreadable",
                        "error": m.error,
                        "errno": m.errno,
                    },
                    1,
                )
                for m in unreadable
            ]
            + [
                (
                    _file_labels(
                        t, what="stat", error=t.path_error.error, errno=t.path_error.errno
                    ),
                    1,
                )
                for t in rows
                if t.path_error is not None
            ],
        )
        parked = [t for t in rows if t.parked is not None]
        metric(
            "logbroker_push_parked_files",
            "gauge",
            "Files the gateway refuses, not shipping until the cause is gone.",
            [(none, len(parked))],
        )
        metric(
            "logbroker_push_file_parked",
            "gauge",
            "A parked file and the gateway's error code.",
            [
                (_file_labels(t, error=t.parked.refusal.error), 1)
                for t in parked
                if t.parked is not None
            ],
        )
        waiting = [t for t in rows if t.outage is not None]
        metric(
            "logbroker_push_partition_waiting_files",
            "gauge",
            "Files waiting for their partition to have a reachable owner again (the others "
            "ship on).",
            [(none, len(waiting))],
        )
        metric(
            "logbroker_push_file_partition_waiting",
            "gauge",
            "A file waiting for a partition (its own, or the one holding its pin), and the "
            "partition.",
            [
                (
                    _file_labels(t, topic=t.outage.topic, partition=str(t.outage.partition)),
                    1,
                )
                for t in waiting
                if t.outage is not None
            ],
        )
        metric(
            "logbroker_push_doubt_bytes",
            "gauge",
            "Bytes sent to an installation that went down before answering, held until it "
            "says what it holds.",
            [(_file_labels(t), t.handover.doubt_bytes) for t in rows if t.handover.doubts],
        )
        return out.families


class MetricsServer:
    """``GET /metrics`` (Prometheus text) and ``GET /status`` (JSON) on 127.0.0.1:port."""

    def __init__(self, port: int, render: Callable[[], str], status: Callable[[], bytes]) -> None:
        pages: dict[str, tuple[str, Callable[[], bytes]]] = {
            "/metrics": ("text/plain; version=0.0.4", lambda: render().encode()),
            "/status": ("application/json", status),
        }

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                page = pages.get(self.path.split("?")[0])
                if page is None:
                    self.send_error(404, "only /metrics and /status are served here")
                    return
                body = page[1]()
                self.send_response(200)
                self.send_header("Content-Type", page[0])
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="push-metrics", daemon=True
        )
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
