"""``logbroker serve``: run the gateway (Starlette on uvicorn) over a log store.

Settings come from ``--config FILE`` (TOML), then ``LOGBROKER_*`` environment variables, then
flags (see ``ingest_api.settings``).  SIGTERM stops gracefully: no new connections, in-flight
requests (and their appends) finish, then the store is closed; threads still blocked then in a
call nobody waits for (on a Kafka that does not answer) are not waited for at exit.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import faulthandler
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import uvicorn
from uvicorn.supervisors import Multiprocess

from log_store.data_dir_kind import check_for_serve, record_kafka_scratch
from log_store.errors import BadRequest, LogbrokerError, StoreUnavailable
from log_store.open_files import raise_open_files_limit
from ops import heap, stop_signals
from ops.advertised_url import DEFAULT_WAIT_S, AdvertisedUrlWrong, check_advertised_url
from ops.commands.arg_types import add_log_level, seconds
from ops.graphite import add_graphite_options
from ops.retention import DEFAULT_INTERVAL_S, RetentionWatchdog
from ops.source_expiry import SourceExpiryWatchdog

if TYPE_CHECKING:
    from starlette.applications import Starlette

    from ingest_api.settings import GatewaySettings

GRACEFUL_STOP_S = 30
_EXIT_WAIT_S = 0.5
"""How long a stopped gateway waits for threads still inside a call before it exits anyway."""
_KAFKA_WAIT_S = 5.0
"""How often a gateway started before its Kafka cluster says it is still waiting."""
_KAFKA_ASK_S = 0.5
"""How long each look for a Kafka broker at start-up waits for an answer (a stop is seen
between two looks)."""
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
HANDLES_STOP_SIGNALS = True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", type=Path, help="directory of the embedded log store")
    parser.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port to listen on (default 8080)")
    parser.add_argument("--dc", help="this data center's name, the topics' prefix (default dc1)")
    parser.add_argument(
        "--partitions", type=int, help="partitions of topics created on first write (default 4)"
    )
    parser.add_argument("--store", choices=("sqlite", "kafka"), help="log store backend")
    parser.add_argument("--kafka-bootstrap", metavar="HOST:PORT", help="Kafka bootstrap servers")
    parser.add_argument(
        "--kafka-namespace", help="prefix of every Kafka topic and group this gateway uses"
    )
    parser.add_argument(
        "--kafka-ownership",
        choices=("group", "on_demand"),
        help="share partitions among gateways in a Kafka group (default) or take any on demand",
    )
    parser.add_argument(
        "--advertised-url", help="how other gateways reach this one (default http://HOST:PORT)"
    )
    parser.add_argument(
        "--advertised-url-check",
        type=seconds,
        default=DEFAULT_WAIT_S,
        metavar="SECONDS",
        help="on Kafka, before joining the gateways' group: how long to wait for the advertised "
        "URL to reach this gateway (default 10; exit 2 if it reaches another gateway or "
        "nothing); 0 turns the check off (for a front that routes only to ready gateways)",
    )
    parser.add_argument("--config", type=Path, help="TOML configuration file")
    parser.add_argument("--workers", type=int, help="uvicorn worker processes (default 1)")
    parser.add_argument("--ssl-certfile", help="serve HTTPS with this certificate (PEM)")
    parser.add_argument("--ssl-keyfile", help="the certificate's private key (PEM)")
    parser.add_argument(
        "--allow-public-without-tokens",
        action="store_true",
        default=None,
        help="listen on a non-loopback address even with no tokens configured",
    )
    parser.add_argument(
        "--push-allow",
        action="append",
        metavar="NETWORK",
        help="a network (10.1.2.0/24, 127.0.0.1) push subscriptions may deliver to besides "
        "public addresses; repeat for more",
    )
    parser.add_argument(
        "--allowed-host",
        action="append",
        dest="allowed_hosts",
        metavar="NAME",
        help="without tokens: a name (gw1.example, .example, *) requests may address this "
        "gateway by besides addresses, localhost and its host; repeat for more",
    )
    parser.add_argument(
        "--metrics-require-token",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="/metrics needs a token with metrics = true (the default with tokens); "
        "--no-metrics-require-token makes it public",
    )
    add_graphite_options(parser)
    add_log_level(parser, "warning")
    parser.add_argument(
        "--retention-check-seconds",
        type=seconds,
        default=DEFAULT_INTERVAL_S,
        help="apply topics' retention this often (default 60; 0 turns it off)",
    )


def _flags(args: argparse.Namespace) -> dict[str, Any]:
    names = (
        "data_dir",
        "host",
        "port",
        "dc",
        "partitions",
        "store",
        "kafka_bootstrap",
        "kafka_namespace",
        "kafka_ownership",
        "advertised_url",
        "workers",
        "ssl_certfile",
        "ssl_keyfile",
        "allow_public_without_tokens",
        "push_allow",
        "allowed_hosts",
        "metrics_require_token",
        "graphite",
        "graphite_prefix",
        "graphite_interval_s",
    )
    flags = {name: getattr(args, name) for name in names}
    if flags["data_dir"] is not None:
        flags["data_dir"] = str(flags["data_dir"])
    return flags


def _bind(host: str, port: int) -> socket.socket:
    """The gateway's socket, bound before the store is opened: a gateway that cannot have its
    port must not join the gateways' group on Kafka (and take partitions from the others)
    before it finds out.  It listens once the gateway is ready to accept."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family=family)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _check_data_dir(settings: GatewaySettings) -> None:
    """Refuse a data dir the embedded store cannot use (a file, under a file, not writable),
    naming it: the store's own failure does not; and one that is not this gateway's (another
    DC's, the other store kind's, another tool's: see :mod:`log_store.data_dir_kind`)."""
    if settings.store != "sqlite":
        check_for_serve(settings.data_dir, settings.store, settings.dc)
        return
    path = settings.data_dir
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    where = f"data_dir {path}" + ("" if probe == path else f": {probe}")
    if not probe.is_dir():
        raise BadRequest(f"{where} is not a directory")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise BadRequest(f"{where} is not writable by this user")
    check_for_serve(path, settings.store, settings.dc)


def _bind_failure(exc: OSError, host: str, port: int) -> tuple[str, int]:
    """Why the gateway cannot have its address, and the exit status: 2 for what the user must
    fix (the port is taken, the host does not resolve or is no address of this machine), 1 for
    the rest."""
    where = f"cannot listen on {_host_port(host, port)}"
    if isinstance(exc, socket.gaierror):
        return f"{where}: {host!r} does not resolve ({exc.strerror}); give --host an address", 2
    if exc.errno == errno.EADDRINUSE:
        return (
            f"{where}: it is in use ({exc.strerror}): another process listens there; "
            "choose another --port or stop that process",
            2,
        )
    if exc.errno == errno.EADDRNOTAVAIL:
        return (
            f"{where}: {host!r} is not an address of this machine ({exc.strerror}); give "
            "--host one of its addresses (127.0.0.1, or 0.0.0.0 for all)",
            2,
        )
    if exc.errno == errno.EAFNOSUPPORT:
        return f"{where}: {exc.strerror}: this machine has no IPv6; give an IPv4 --host", 2
    if exc.errno == errno.EACCES:
        return f"{where}: {exc.strerror} (a port below 1024 needs root)", 2
    return f"{where}: {exc.strerror or exc}", 1


def _wait_for_kafka(settings: GatewaySettings) -> bool:
    """True once a broker of the cluster answers; False if a stop was asked for first.

    A gateway started before its cluster (a host booting, the cluster restarting) waits for
    it, saying so every few seconds with the last reason librdkafka gave, instead of giving
    up.  Its port does not listen yet.  librdkafka's own lines go to the Python logger
    meanwhile: its clients printed each failed connection, 4-8 lines a second, which buried
    the gateway's own line.
    """
    from log_store.kafka.outage import ClientLines
    from log_store.kafka.topic_admin import TopicAdmin

    stopped = threading.Event()
    stop_signals.on_stop(stopped.set)
    heard = ClientLines()
    admin = TopicAdmin(settings.kafka_settings(), logger=heard)
    waiting_since = time.monotonic()
    while not stopped.is_set():
        asked = time.monotonic()
        try:
            # short asks: a stop is seen between two of them (one ask of 5 s held SIGTERM
            # that long); the client's connection attempts go on across them
            admin.reachable(_KAFKA_ASK_S)
            return True
        except StoreUnavailable as exc:
            admin.serve_log()  # hands the lines logged meanwhile to ``heard``
            if time.monotonic() - waiting_since >= _KAFKA_WAIT_S:
                waiting_since = time.monotonic()
                why = heard.last_failure or str(exc)
                print(
                    f"logbroker serve: waiting for Kafka at {settings.kafka_bootstrap}: {why}",
                    file=sys.stderr,
                    flush=True,
                )
        stopped.wait(max(0.0, asked + _KAFKA_ASK_S - time.monotonic()))
    return False


def _check_advertised_url(
    sock: socket.socket, settings: GatewaySettings, wait_s: float
) -> int | None:
    """None if the gateway may join the gateways' group (its advertised URL reaches it, or
    there is nothing to check); else the exit status: 2, said why, or 0 if a stop came first.
    See :mod:`ops.advertised_url`."""
    if settings.store != "kafka" or settings.kafka_ownership != "group" or wait_s <= 0:
        return None
    stopped = threading.Event()
    stop_signals.on_stop(stopped.set)
    try:
        reached = check_advertised_url(
            sock,
            settings.url,
            wait_s=wait_s,
            stopped=stopped,
            ssl_certfile=settings.ssl_certfile,
            ssl_keyfile=settings.ssl_keyfile,
        )
    except AdvertisedUrlWrong as exc:
        print(f"logbroker serve: {exc}", file=sys.stderr)
        return 2
    return None if reached else 0


class _GracefulServer(uvicorn.Server):
    """uvicorn's server, except that a graceful stop by SIGTERM exits with status 0.

    uvicorn re-raises the captured signal after its graceful shutdown, so the process would
    die "killed by SIGTERM"; for a service manager a completed graceful stop is a success.
    The banner is printed once the server accepts connections.
    """

    def __init__(self, config: uvicorn.Config, banner: str | None = None) -> None:
        super().__init__(config)
        self._banner = banner

    def request_stop(self) -> None:
        """A graceful stop, also before the server has started (then it exits at once)."""
        self.should_exit = True

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and self._banner:
            print(self._banner, file=sys.stderr, flush=True)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        original = {sig: signal.signal(sig, self.handle_exit) for sig in _STOP_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)


def _warn_if_others_may_read_tokens(config: str | Path | None, settings: GatewaySettings) -> None:
    """Say so when the configuration holds bearer tokens and other users may read it: the
    client commands refuse such a token file; the gateway starts, since it owns no file."""
    if config is None or not settings.tokens:
        return
    path = Path(config)
    try:
        mode = path.stat().st_mode
    except OSError:
        return
    if mode & 0o077:
        print(
            f"logbroker serve: warning: {path} holds bearer tokens and may be read by other "
            f"users (mode {mode & 0o777:o}); run: chmod 600 {path}",
            file=sys.stderr,
        )


def _keep_data_private(settings: GatewaySettings) -> None:
    """Everything the gateway creates (the data directory, segments, databases, staged
    uploads) is for its own user only: tokens are moot for whoever can read the files, and a
    local user who may open a partition's ``write.lock`` could hold its writes.  An existing
    data directory that others may enter is left as it is, and said."""
    os.umask(0o077)  # inherited by the workers
    try:
        mode = settings.data_dir.stat().st_mode
    except OSError:
        return  # made by the store, under the umask above
    if mode & 0o077:
        print(
            f"logbroker serve: warning: data_dir {settings.data_dir} may be entered by other "
            f"users (mode {mode & 0o777:o}), who can then read every topic's data; run: "
            f"chmod 700 {settings.data_dir}",
            file=sys.stderr,
        )


def _warn_if_metrics_are_public(settings: GatewaySettings) -> None:
    """Say so when tokens are on and ``/metrics`` is made public all the same: its labels
    name every tenant's topics, groups and subscriptions."""
    if settings.tokens and not settings.metrics_need_token:
        print(
            "logbroker serve: warning: metrics_require_token = false: /metrics answers anyone, "
            "and names every tenant's topics, groups and subscriptions",
            file=sys.stderr,
        )


def create_worker_app() -> Starlette:
    """uvicorn factory of a worker process: the app (see ``ingest_api.app.create_app``), and
    the worker's free C heap handed back now and then, as the supervisor's is."""
    from ingest_api.app import create_app

    heap.trim_now_and_then()
    return create_app()


def run(args: argparse.Namespace) -> int:
    # prometheus_client reads it once, on import: set below for this run's workers only
    os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
    from ingest_api.app import SETTINGS_ENV, SUPERVISOR_PID_ENV, build_app
    from ingest_api.context import open_context
    from ingest_api.request_head import bounded_head_protocol, connection_cap
    from ingest_api.settings import load_settings

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    _trace_fatal_signals()
    if args.log_level != "debug":
        # httpx says every request at INFO with its whole URL, a push endpoint's user and
        # password included; the deliveries log their own outcomes, without them
        logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        settings = load_settings(config_file=args.config, flags=_flags(args))
        # absolute once, for the start line, the logs and the dashboard's disk card (a relative
        # one named the store only to whoever knew the gateway's working directory)
        settings = dataclasses.replace(settings, data_dir=Path(os.path.abspath(settings.data_dir)))
        _check_data_dir(settings)
    except LogbrokerError as exc:
        print(f"logbroker serve: {exc}", file=sys.stderr)
        return 2
    _warn_if_others_may_read_tokens(args.config or os.environ.get("LOGBROKER_CONFIG"), settings)
    _warn_if_metrics_are_public(settings)
    _keep_data_private(settings)
    heap.keep_freed_memory()
    heap.trim_now_and_then()  # workers start their own (see create_worker_app)
    raise_open_files_limit()
    options: dict[str, Any] = {
        "host": settings.host,
        "port": settings.port,
        # httptools, with a bound on each request's head (size and time): see request_head
        # and on the connections it holds (per address, and in all: see connection_cap)
        "http": bounded_head_protocol(
            settings.limits.request_timeout_s,
            settings.limits.max_connections_per_client,
            connection_cap(
                settings.limits.max_open_connections, settings.limits.max_open_partitions
            ),
        ),
        "loop": "uvloop",
        "access_log": False,
        "log_level": args.log_level,
        "timeout_graceful_shutdown": GRACEFUL_STOP_S,
        "timeout_keep_alive": 30,
        "ssl_certfile": settings.ssl_certfile,
        "ssl_keyfile": settings.ssl_keyfile,
    }
    if settings.store == "kafka":
        from log_store.kafka.bootstrap import check_bootstrap_names

        try:
            unknown = check_bootstrap_names(settings.kafka_bootstrap or "")
        except BadRequest as exc:
            print(f"logbroker serve: {exc}", file=sys.stderr)
            return 2
        if unknown:
            print(f"logbroker serve: warning: no such host: {', '.join(unknown)}", file=sys.stderr)
    try:
        sock = _bind(settings.host, settings.port)
    except OSError as exc:
        message, code = _bind_failure(exc, settings.host, settings.port)
        print(f"logbroker serve: {message}", file=sys.stderr)
        return code
    try:
        if settings.store == "kafka" and not _wait_for_kafka(settings):
            sock.close()
            return 0
    except BadRequest as exc:  # librdkafka refused a [kafka.properties] setting
        sock.close()
        print(f"logbroker serve: {exc}", file=sys.stderr)
        return 2
    checked = _check_advertised_url(sock, settings, args.advertised_url_check)
    if checked is not None:
        sock.close()
        return checked
    try:
        ctx = open_context(settings)
    except LogbrokerError as exc:
        sock.close()
        if isinstance(exc, BadRequest):
            print(f"logbroker serve: {exc}", file=sys.stderr)
            return 2
        print(f"logbroker serve: cannot open the log store: {exc}", file=sys.stderr)
        return 1
    if settings.store == "kafka":
        try:
            record_kafka_scratch(settings.data_dir, settings.dc, settings.kafka_namespace)
        except OSError as exc:
            print(f"logbroker serve: warning: data_dir {settings.data_dir}: {exc}", file=sys.stderr)
    sock.listen(2048)
    config = uvicorn.Config(
        # one worker: the store is closed below, after the last Graphite send has read it
        "ops.commands.serve:create_worker_app" if settings.workers > 1 else build_app(ctx),
        factory=settings.workers > 1,
        workers=settings.workers,
        **options,
    )
    banner = (
        f"logbroker gateway on {'https' if settings.ssl_certfile else 'http'}://"
        f"{_host_port(settings.host, settings.port)} (dc {settings.dc}, store {settings.store}"
        + (f" at {settings.kafka_bootstrap}" if settings.store == "kafka" else "")
        + f", data dir {settings.data_dir}, {settings.workers} worker(s))"
    )
    # One retention watchdog per gateway, in this (parent) process, on its own store handle.
    watchdog = (
        RetentionWatchdog(ctx.store, args.retention_check_seconds).start()
        if args.retention_check_seconds > 0
        else None
    )
    metrics_dir = _shared_metrics_dir() if settings.workers > 1 else None
    graphite = _graphite_sender(settings, ctx, metrics_dir)
    expired = ctx.metrics.counter(
        "logbroker_sources_expired_total",
        f"sources forgotten after limits.source_idle_expiry_s "
        f"({settings.limits.source_idle_expiry_s:g} s) without a write",
    )
    expiry = SourceExpiryWatchdog(
        ctx.store, settings.limits.source_idle_expiry_s, lambda done: expired.inc(done.expired)
    ).start()
    try:
        if settings.workers > 1:
            # each worker process builds its own app and store handle from the settings
            os.environ[SETTINGS_ENV] = settings.to_json()
            os.environ[SUPERVISOR_PID_ENV] = str(os.getpid())
            supervisor = Multiprocess(config, sockets=[sock])
            stop_signals.on_stop(supervisor.should_exit.set)
            print(banner, file=sys.stderr, flush=True)
            supervisor.run()
            if graphite is not None:
                graphite.stop()
                graphite = None
            ctx.store.close()
            code = 0
        else:
            server = _GracefulServer(config, banner=banner)
            stop_signals.on_stop(server.request_stop)
            server.run(sockets=[sock])
            code = 0 if server.started else 1
    finally:
        expiry.stop()
        if graphite is not None:
            graphite.stop()  # its last send reads the store's gauges: before the store closes
        if watchdog is not None:
            watchdog.stop()
        if metrics_dir is not None:
            shutil.rmtree(metrics_dir, ignore_errors=True)
        if settings.workers == 1:
            _close_store(ctx)
    _exit_past_blocked_threads(code)
    return code


def _close_store(ctx: Any) -> None:
    """Close the store of a one-worker gateway once its app and watchdogs have stopped,
    within what is left of the stop's time (a Kafka store's last commits)."""
    if ctx.stop_deadline is None:  # the app did not get to start its stop
        ctx.begin_stop()
    close_within = getattr(ctx.store, "close_within", None)
    if close_within is not None:
        close_within(ctx.stop_time_left(float("inf")))
    else:
        ctx.store.close()


def _trace_fatal_signals() -> None:
    """A gateway killed by a fatal signal (SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL) writes
    every Python thread's stack to stderr first, its workers too (``PYTHONFAULTHANDLER``).

    The Kafka client library ends the process with an assertion (``abort()``) when it trips
    over a bug of its own, from one of its own threads, and used to leave only its one line:
    the stacks say which of the gateway's calls were under way (the start-up group probe,
    a takeover's ``init_transactions``, ...).
    """
    faulthandler.enable(file=sys.stderr, all_threads=True)
    os.environ.setdefault("PYTHONFAULTHANDLER", "1")


def _exit_past_blocked_threads(code: int) -> None:
    """Exit now with ``code`` if threads are still inside blocking calls once all is stopped.

    The interpreter's exit joins every non-daemon thread, anyio's workers and
    ``concurrent.futures`` pools among them: one still waiting on a Kafka that does not
    answer, in a call nobody waits for any more (a push supervisor's look at the
    subscriptions, a request cut off at the graceful timeout), would hold the stopped gateway
    for up to its operation timeout.  Everything the gateway owes is done by now: requests
    are answered (acknowledged data was committed before its ack), the store is closed.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    deadline = time.monotonic() + _EXIT_WAIT_S
    me = threading.current_thread()
    blocked = [t for t in threading.enumerate() if t is not me and not t.daemon]
    for thread in blocked:
        thread.join(max(0.0, deadline - time.monotonic()))
    blocked = [t for t in blocked if t.is_alive()]
    if not blocked:
        return
    logging.getLogger(__name__).warning(
        "exiting without waiting for %d thread(s) still in a blocking call: %s",
        len(blocked),
        ", ".join(sorted(t.name for t in blocked)),
    )
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _shared_metrics_dir() -> str:
    """A directory of this gateway run where every worker keeps its metric values.

    Named in ``PROMETHEUS_MULTIPROC_DIR`` for the workers (prometheus_client's multiprocess
    mode) and removed when the gateway stops; a new run starts from zero, as one process does.
    """
    from ingest_api.metrics import MULTIPROC_DIR_ENV

    _remove_dead_runs_dirs()
    directory = tempfile.mkdtemp(prefix=f"{_METRICS_DIR_PREFIX}{os.getpid()}-")
    os.environ[MULTIPROC_DIR_ENV] = directory
    return directory


_METRICS_DIR_PREFIX = "logbroker-metrics-"


def _remove_dead_runs_dirs() -> None:
    """Remove the directories of gateway runs that were killed before they could (SIGKILL)."""
    for path in Path(tempfile.gettempdir()).glob(f"{_METRICS_DIR_PREFIX}*-*"):
        pid = path.name.removeprefix(_METRICS_DIR_PREFIX).split("-", 1)[0]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except PermissionError:
            continue  # alive, another user's


def _graphite_sender(settings: Any, ctx: Any, metrics_dir: str | None) -> Any:
    """The Graphite sender of ``settings.graphite``, started; None without one.

    With several workers it runs here in the parent over the workers' shared files (and the
    gauges read from the store); with one, over the registry the app updates.
    """
    if settings.graphite is None:
        return None
    from ingest_api.metrics import MultiprocessView
    from ops.graphite import GraphiteSender, graphite_address

    collector = (
        ctx.metrics.exposition
        if metrics_dir is None
        else MultiprocessView(metrics_dir, ctx.metrics.collected)
    )
    return GraphiteSender(
        graphite_address(settings.graphite),
        collector,
        prefix=settings.graphite_prefix,
        interval_s=settings.graphite_interval_s,
    ).start()
