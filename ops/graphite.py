"""Sending a daemon's metrics to Graphite in its plaintext protocol, every interval.

One line per sample, ``PREFIX.NAME[.LABEL.VALUE...] VALUE TIMESTAMP``, labels sorted by name and
every character outside ``[A-Za-z0-9_-]`` replaced by ``_`` (prometheus_client's
``GraphiteBridge`` writes them; this module only schedules it and can be stopped).  A Graphite
that is down costs a logged warning per interval: the daemon goes on, and the next interval
sends the counters' new totals.
"""

from __future__ import annotations

import argparse
import logging
import threading
import time
from typing import Protocol

from prometheus_client.bridge.graphite import GraphiteBridge
from prometheus_client.registry import Collector

from log_store.errors import BadRequest

_log = logging.getLogger(__name__)
DEFAULT_INTERVAL_S = 60.0
DEFAULT_PREFIX = "logbroker"
_TIMEOUT_S = 10.0
STOP_WAIT_S = 2.0
"""The most a stopping daemon waits for Graphite: for a send in flight, then for the last one."""


def graphite_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:2003`` for IPv6) as a socket address; BadRequest otherwise."""
    host, _, port = text.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not host or not port.isdigit() or not 0 < int(port) <= 65535:
        raise BadRequest(f"graphite address {text!r} must be HOST:PORT")
    return host, int(port)


class GraphiteSender:
    """Sends ``collector``'s samples to ``address`` every ``interval_s`` until stopped."""

    def __init__(
        self,
        address: tuple[str, int],
        collector: Collector,
        *,
        prefix: str = DEFAULT_PREFIX,
        interval_s: float = DEFAULT_INTERVAL_S,
    ) -> None:
        if interval_s <= 0:
            raise BadRequest("the Graphite interval must be positive")
        self.address = address
        self.prefix = prefix
        self.interval_s = interval_s
        self._collector = collector
        self._bridge = GraphiteBridge(address, registry=collector, timeout_seconds=_TIMEOUT_S)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="graphite-sender", daemon=True)

    def start(self) -> GraphiteSender:
        self._thread.start()
        return self

    def send_once(self) -> None:
        """Send every sample now (raises OSError if Graphite cannot be reached)."""
        self._bridge.push(prefix=self.prefix)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.send_once()
            except OSError as exc:
                _log.warning("graphite %s:%d: %s", *self.address, exc)
            except Exception:
                _log.exception("graphite: collecting the metrics failed")

    def stop(self, wait_s: float = STOP_WAIT_S) -> None:
        """Stop and send one last time, so the final totals of a stopping daemon arrive.

        Waits ``wait_s`` at most in all: a Graphite that hangs (a connect or a send waiting
        out its 10 s timeout) used to hold the daemon's stop for up to twice that.  A send
        still in flight is left to its (daemon) thread, and the last one is then not made.
        """
        deadline = time.monotonic() + wait_s
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(wait_s)
        left = deadline - time.monotonic()
        if self._thread.is_alive() or left <= 0:
            _log.warning(
                "graphite %s:%d: a send still waits for an answer; the last totals are not sent",
                *self.address,
            )
            return
        last = GraphiteBridge(self.address, registry=self._collector, timeout_seconds=left)
        try:
            last.push(prefix=self.prefix)
        except OSError as exc:
            _log.warning("graphite %s:%d: %s", *self.address, exc)
        except Exception:
            _log.exception("graphite: collecting the metrics failed")


def add_graphite_options(parser: argparse.ArgumentParser) -> None:
    """``--graphite HOST:PORT``, ``--graphite-prefix``, ``--graphite-interval`` of a daemon."""
    parser.add_argument(
        "--graphite",
        metavar="HOST:PORT",
        help="also send the metrics to Graphite's plaintext listener (carbon) at HOST:PORT",
    )
    parser.add_argument(
        "--graphite-prefix",
        default=None,
        help=f"prefix of every Graphite metric path (default {DEFAULT_PREFIX})",
    )
    parser.add_argument(
        "--graphite-interval",
        dest="graphite_interval_s",
        type=float,
        default=None,
        metavar="SECONDS",
        help=f"seconds between two sends to Graphite (default {DEFAULT_INTERVAL_S:g})",
    )


class GraphiteOptions(Protocol):
    """Parsed ``--graphite*`` flags, or a daemon's configuration with the same keys."""

    @property
    def graphite(self) -> str | None: ...
    @property
    def graphite_prefix(self) -> str | None: ...
    @property
    def graphite_interval_s(self) -> float | None: ...


def graphite_from(options: GraphiteOptions, collector: Collector) -> GraphiteSender | None:
    """The sender the options ask for, started (None without ``graphite``); BadRequest."""
    if options.graphite is None:
        return None
    return GraphiteSender(
        graphite_address(options.graphite),
        collector,
        prefix=options.graphite_prefix or DEFAULT_PREFIX,
        interval_s=options.graphite_interval_s or DEFAULT_INTERVAL_S,
    ).start()
