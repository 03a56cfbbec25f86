"""``logbroker mirror``: copy the topics written in one DC to another installation, exactly once.

The resume point of every partition is kept by the destination, in the same transaction as
the data, so the mirror can be killed and restarted at any moment (or run twice by mistake)
without duplicating or losing a message.  Before copying (and after every outage) it asks
both gateways which installation they belong to, and refuses (exit 2) to copy one into itself
or into the installation of the DC whose topics it copies; with a gateway too old to say, the
URLs' comparison is all that is left.  ``--state-dir`` keeps a status file for operators.
SIGTERM/SIGINT stop it after the round in hand.
"""

from __future__ import annotations

import argparse
import errno
import logging
import socket
import sys
import threading
from pathlib import Path
from urllib.parse import urlsplit
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server

from delivery.installations import MixedInstallations, NotAGateway
from delivery.mirror import (
    DestinationRefused,
    Mirror,
    MirrorStuck,
    WrongDestination,
    check_gateway_url,
)
from delivery.mirror_metrics import MirrorCollector
from delivery.partition_reader import MAX_MAX_BYTES
from delivery.pull_client import GatewayUnavailable, RequestRefused
from log_store.errors import BadRequest
from ops import stop_signals
from ops.commands.arg_types import add_log_level, seconds
from ops.graphite import add_graphite_options, graphite_from
from ops.token_options import add_token_options, token_from

HANDLES_STOP_SIGNALS = True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--from", dest="source", required=True, help="source gateway URL")
    parser.add_argument("--to", dest="dest", required=True, help="destination gateway URL")
    parser.add_argument(
        "--prefix", required=True, help="mirror the topics starting with this, e.g. dc1."
    )
    parser.add_argument("--state-dir", type=Path, help="where to keep mirror-status.json")
    parser.add_argument(
        "--idle-exit", type=seconds, metavar="SECONDS", help="exit after this long with nothing new"
    )
    parser.add_argument("--max-bytes", type=int, default=4 * 1024 * 1024)
    add_token_options(parser)  # one token for both gateways: read at --from, replicate at --to
    parser.add_argument(
        "--metrics-port", type=int, metavar="PORT", help="serve /metrics on 127.0.0.1:PORT"
    )
    add_graphite_options(parser)
    add_log_level(parser, "warning")


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(message)s")
    # the same URL needs no question (and is all a gateway too old to name its installation
    # leaves to compare: see Mirror.check_ends)
    if args.source.rstrip("/") == args.dest.rstrip("/"):
        print("logbroker mirror: --from and --to are the same installation", file=sys.stderr)
        return 2
    if not 1 <= args.max_bytes <= MAX_MAX_BYTES:
        print(f"logbroker mirror: --max-bytes must be in 1..{MAX_MAX_BYTES}", file=sys.stderr)
        return 2
    if args.metrics_port is not None and not 1 <= args.metrics_port <= 65535:
        print(
            "logbroker mirror: --metrics-port must be a TCP port (1-65535), "
            f"not {args.metrics_port}",
            file=sys.stderr,
        )
        return 2
    try:
        check_gateway_url("--from", args.source)
        check_gateway_url("--to", args.dest)
        token = token_from(args)
        mirror = Mirror(
            args.source,
            args.dest,
            args.prefix,
            state_dir=args.state_dir,
            max_bytes=args.max_bytes,
            token=token,
        )
    except BadRequest as exc:
        print(f"logbroker mirror: {exc}", file=sys.stderr)
        return 2
    for option, url in (("--from", args.source), ("--to", args.dest)):
        host = urlsplit(url).hostname or ""
        if _no_such_host(host):
            print(f"logbroker mirror: {option} {url}: no such host: {host}", file=sys.stderr)
            mirror.close()
            return 2
    collector = MirrorCollector(mirror)
    try:
        exporter = _serve_metrics(args.metrics_port, collector)
    except OSError as exc:
        print(
            f"logbroker mirror: cannot serve metrics on 127.0.0.1:{args.metrics_port}: "
            f"{exc.strerror or exc}",
            file=sys.stderr,
        )
        mirror.close()
        return 2 if exc.errno in (errno.EADDRINUSE, errno.EACCES) else 1
    try:
        graphite = graphite_from(args, collector)
    except BadRequest as exc:
        print(f"logbroker mirror: {exc}", file=sys.stderr)
        mirror.close()
        if exporter is not None:
            exporter.shutdown()
        return 2
    stop = threading.Event()
    stop_signals.on_stop(stop.set)
    try:
        mirror.run(stop, idle_exit_s=args.idle_exit)
        # --idle-exit ran out without a topic to copy: most likely a mistyped prefix
        nothing = None if mirror.found_topics or stop.is_set() else mirror.no_topics_reason()
    except RequestRefused as exc:
        side, url = (
            ("destination", args.dest)
            if isinstance(exc, DestinationRefused)
            else ("source", args.source)
        )
        missing = exc.status == 401 and token is None
        hint = " (give the mirror's token with --token-file FILE)" if missing else ""
        print(f"logbroker mirror: the {side} {url} refused: {exc.reason}{hint}", file=sys.stderr)
        return 2
    except (WrongDestination, MixedInstallations, NotAGateway) as exc:
        print(f"logbroker mirror: {exc}", file=sys.stderr)
        return 2
    except (GatewayUnavailable, MirrorStuck) as exc:
        print(f"logbroker mirror: {exc}", file=sys.stderr)
        return 1
    finally:
        if graphite is not None:
            graphite.stop()
        if exporter is not None:
            exporter.shutdown()
            exporter.server_close()
        mirror.close()
    if nothing is not None:
        print(f"logbroker mirror: {nothing}", file=sys.stderr)
        return 2
    stats = mirror.stats
    print(f"logbroker mirror: copied {stats.copied_messages} messages", file=sys.stderr)
    if stats.dropped_offsets:
        print(
            f"logbroker mirror: {stats.dropped_offsets} source messages were dropped by the "
            "source's retention before they could be copied",
            file=sys.stderr,
        )
    for (topic, partition), (stopped_at, error) in sorted(mirror.corrupt.items()):
        print(
            f"logbroker mirror: {topic}/{partition} was not copied past source offset "
            f"{stopped_at}: {error} "
            '(docs/operations.md, "A batch fails its checksum")',
            file=sys.stderr,
        )
    return 3 if mirror.corrupt else 0


def _no_such_host(host: str) -> bool:
    """Whether the resolver says ``host`` does not exist; a resolver that cannot answer now
    (no network yet) is an outage, which the mirror waits through like a gateway that is down."""
    try:
        socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        return exc.errno in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME))
    except UnicodeError:
        return True
    return False


def _serve_metrics(port: int | None, collector: MirrorCollector) -> WSGIServer | None:
    """prometheus_client's exporter of ``collector`` on 127.0.0.1:port (None: no port)."""
    if port is None:
        return None
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    server, _ = start_http_server(port, addr="127.0.0.1", registry=registry)
    return server
