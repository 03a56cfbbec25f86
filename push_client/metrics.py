"""Prometheus metrics of the push-client: a text file in the state dir and a local endpoint.

The text file (``metrics.prom``) suits node_exporter's textfile collector; ``metrics_port``
serves the same text at ``http://127.0.0.1:PORT/metrics`` for a direct scrape.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from push_client.installations import InstallationSet
    from push_client.tailer import TailedFile
    from push_client.transport import TransportStats


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _file_labels(tailed: TailedFile, **extra: str) -> str:
    # source as well as file: a rotated file and its successor may share a path for a while
    labels = {"file": tailed.path, "source": tailed.source_id, **extra}
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items()) + "}"


class PushMetrics:
    """Counters kept outside the loop's own (request sizes from sender threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.request_bytes_total = 0
        self.requests_sent = 0
        self.state_corruptions = 0

    def observe_request_bytes(self, size: int) -> None:
        with self._lock:
            self.request_bytes_total += size
            self.requests_sent += 1

    def render(
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
    ) -> str:
        lines: list[str] = []

        def metric(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} {kind}")
            for labels, value in samples:
                lines.append(f"{name}{labels} {value}")

        metric(
            "logbroker_push_read_bytes_total",
            "counter",
            "Bytes cut into chunks.",
            [("", counters.read_bytes)],
        )
        metric(
            "logbroker_push_acked_bytes_total",
            "counter",
            "Bytes the gateway acknowledged.",
            [("", counters.acked_bytes)],
        )
        metric(
            "logbroker_push_acked_chunks_total",
            "counter",
            "Chunks acknowledged.",
            [("", counters.acked_chunks)],
        )
        metric(
            "logbroker_push_duplicate_chunks_total",
            "counter",
            "Chunks the gateway already held (answered duplicate).",
            [("", counters.duplicate_chunks)],
        )
        metric(
            "logbroker_push_rotations_total",
            "counter",
            "Files rotated away.",
            [("", counters.rotations)],
        )
        metric(
            "logbroker_push_fenced_total",
            "counter",
            "Requests refused because a newer session of their source fenced ours.",
            [("", counters.fenced)],
        )
        metric(
            "logbroker_push_out_of_order_total",
            "counter",
            "Pipelined requests refused because they overtook their predecessor.",
            [("", counters.out_of_order)],
        )
        metric(
            "logbroker_push_truncations_total",
            "counter",
            "Files truncated or replaced.",
            [("", counters.truncations)],
        )
        metric(
            "logbroker_push_request_body_bytes_total",
            "counter",
            "Bytes of request bodies.",
            [("", self.request_bytes_total)],
        )
        with stats.lock:
            outcomes = sorted(stats.requests.items())
            retries, failovers = stats.retries, stats.failovers
        metric(
            "logbroker_push_requests_total",
            "counter",
            "Requests by outcome.",
            [(f'{{outcome="{_escape(k)}"}}', v) for k, v in outcomes],
        )
        metric("logbroker_push_retries_total", "counter", "Requests retried.", [("", retries)])
        metric(
            "logbroker_push_failovers_total",
            "counter",
            "Switches to another gateway of an installation.",
            [("", failovers)],
        )
        current = installations.current()
        metric(
            "logbroker_push_installation_up",
            "gauge",
            "Whether an installation is up (1) or left for the next one (0).",
            [(f'{{installation="{_escape(m.name)}"}}', int(m.up)) for m in installations.members],
        )
        metric(
            "logbroker_push_installation_current",
            "gauge",
            "The installation new data goes to (1).",
            [
                (f'{{installation="{_escape(m.name)}"}}', int(m is current))
                for m in installations.members
            ],
        )
        metric(
            "logbroker_push_installation_failovers_total",
            "counter",
            "Switches of the installation new data goes to.",
            [("", installations.failovers)],
        )
        metric(
            "logbroker_push_parked_total",
            "counter",
            "Files parked because the gateway refused them.",
            [("", parked_total)],
        )
        metric(
            "logbroker_push_abandoned_bytes_total",
            "counter",
            "Bytes written to rotated files after they were let go (not shipped).",
            [("", abandoned_bytes)],
        )
        metric(
            "logbroker_push_state_corruptions_total",
            "counter",
            "State files found corrupt at start.",
            [("", self.state_corruptions)],
        )
        metric(
            "logbroker_push_buffered_bytes",
            "gauge",
            "Read but unacknowledged bytes.",
            [("", buffered)],
        )
        metric(
            "logbroker_push_requests_in_flight",
            "gauge",
            "Write requests in flight.",
            [("", in_flight)],
        )
        rows = list(files)
        metric("logbroker_push_files", "gauge", "Files being shipped.", [("", len(rows))])
        metric(
            "logbroker_push_lag_bytes",
            "gauge",
            "Bytes of a file not yet acknowledged.",
            [(_file_labels(t), t.lag_bytes) for t in rows],
        )
        parked = [t for t in rows if t.parked is not None]
        metric(
            "logbroker_push_parked_files",
            "gauge",
            "Files the gateway refuses, not shipping until the cause is gone.",
            [("", len(parked))],
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
        metric(
            "logbroker_push_doubt_bytes",
            "gauge",
            "Bytes sent to an installation that went down before answering, held until it "
            "says what it holds.",
            [(_file_labels(t), t.handover.doubt_bytes) for t in rows if t.handover.doubts],
        )
        return "\n".join(lines) + "\n"


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
