"""``logbroker push``: the host daemon that tails log files and ships every line exactly once."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from log_store.errors import BadRequest, LogbrokerError
from ops import stop_signals
from ops.commands.arg_types import add_log_level, seconds
from ops.graphite import add_graphite_options, graphite_from
from ops.token_options import TokenFileError, read_token_file
from push_client.config import CODECS, ConfigError, PushConfig, build_config, load_file
from push_client.daemon import CannotStart, PushDaemon
from push_client.status import NoStatus, print_status, read_status

HANDLES_STOP_SIGNALS = True
HANDLES_RELOAD = True  # SIGHUP reloads the configuration


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "paths", nargs="*", metavar="PATH_OR_GLOB", help="files to tail (globs are re-scanned)"
    )
    parser.add_argument(
        "--server",
        action="append",
        metavar="[NAME=]URL[,URL...]",
        help="gateway URLs of one installation (the next takes over when one fails); "
        "repeat as NAME=URL,... for installations in order of preference",
    )
    parser.add_argument("--log-type", help="log type of the PATH_OR_GLOB arguments")
    parser.add_argument("--state-dir", help="where positions, status and metrics are kept")
    parser.add_argument("--codec", choices=CODECS, help="compression of each chunk (raw)")
    parser.add_argument("--multiline", metavar="REGEX", help="a line matching starts a record")
    parser.add_argument(
        "--olddir",
        action="append",
        metavar="DIR",
        help="where rotation moves the PATH_OR_GLOB files (logrotate's olddir; relative to "
        "each file's directory unless absolute; repeat for several)",
    )
    parser.add_argument("--config", type=Path, help="TOML file with [push] and [[entry]] tables")
    parser.add_argument("--host-name", help="host name sent as 'server' (default: this host)")
    parser.add_argument("--token", help="bearer token (or LOGBROKER_TOKEN)")
    parser.add_argument(
        "--token-file", help="read the bearer token from this file (re-read when it changes)"
    )
    parser.add_argument("--chunk-bytes", type=int, help="largest chunk (1 MiB)")
    parser.add_argument("--request-bytes", type=int, help="largest request body (8 MiB)")
    parser.add_argument("--linger-ms", type=float, help="how long a small batch waits (5)")
    parser.add_argument("--max-in-flight", type=int, help="concurrent requests (4)")
    parser.add_argument(
        "--pipeline-depth", type=int, help="requests of one file in flight at once (2)"
    )
    parser.add_argument("--memory-bytes", type=int, help="read-ahead bound (64 MiB)")
    parser.add_argument(
        "--rotate-wait", type=float, help="seconds a deleted file must be quiet (2)"
    )
    parser.add_argument(
        "--rotated-grace",
        type=float,
        help="seconds a renamed file must be quiet before it is let go (300)",
    )
    parser.add_argument(
        "--park-retry", type=float, help="seconds between tries of a refused file (60)"
    )
    parser.add_argument(
        "--failover-after",
        type=float,
        help="seconds an installation may fail before the next one takes over (5)",
    )
    parser.add_argument(
        "--probe-interval",
        type=float,
        help="seconds before the first health probe of an installation that is down, and of a "
        "failing gateway no request tries (2); the wait doubles with each failed probe",
    )
    parser.add_argument(
        "--probe-max-interval",
        type=float,
        help="seconds the wait between probes grows to at most (60)",
    )
    parser.add_argument(
        "--position-wait",
        type=float,
        help="seconds to wait for a down installation's positions when they are needed (300)",
    )
    parser.add_argument(
        "--direct-to-owner",
        metavar="GLOB[,GLOB...]",
        help="send each source to its partition's owner gateway when its URL "
        "(scheme://host[:port]) matches a glob (off)",
    )
    parser.add_argument(
        "--owner-refresh", type=float, help="seconds between asks for the owners' map (30)"
    )
    parser.add_argument(
        "--owner-timeout",
        type=float,
        help="seconds a write waits for a partition owner's answer before it goes to the "
        "configured gateways (10)",
    )
    parser.add_argument(
        "--request-timeout",
        type=float,
        help="seconds a request waits for a gateway's answer before it is tried again, at the "
        "next gateway (60)",
    )
    parser.add_argument(
        "--stall-after",
        type=float,
        help="seconds a request may go unanswered before it is also sent to the next gateway "
        "and its gateway counts as failing (10)",
    )
    parser.add_argument("--poll-interval", type=float, help="polling period in seconds (0.25)")
    parser.add_argument("--no-inotify", action="store_true", help="poll instead of inotify")
    parser.add_argument("--metrics-port", type=int, help="serve /metrics on 127.0.0.1:PORT")
    add_graphite_options(parser)
    parser.add_argument(
        "--shutdown-timeout", type=float, help="seconds SIGTERM waits for in-flight acks (10)"
    )
    parser.add_argument(
        "--idle-exit",
        type=seconds,
        metavar="SECONDS",
        help="exit once everything read is acknowledged and nothing new came for SECONDS "
        "(status 1 if a file was not shipped: parked, unreadable, or an entry is a directory; "
        "also 1 once no gateway answered for max(SECONDS, 2 x max_backoff_s), every request "
        "failing, and when stopped by a signal before everything was acknowledged: a rerun "
        "with the same state dir resumes exactly)",
    )
    parser.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bar while catching up (default: when stderr is a terminal)",
    )
    parser.add_argument(
        "--status", action="store_true", help="print per-file lag of a running client and exit"
    )
    add_log_level(parser, "info")


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # One line per request would drown the client's own messages.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if args.status:
        return _print_status(args)
    try:
        config = _config(args)
    except ConfigError as exc:
        print(f"logbroker push: {exc}", file=sys.stderr)
        return 2
    if args.config is not None:
        _say_relative_paths(args.config)
    if config.token_file is not None and config.token_file.exists():
        # The same check as every command's (one others may read is refused); a file that is
        # not there yet is waited for (a secret agent may write it later), see BearerToken.
        try:
            read_token_file(config.token_file)
        except TokenFileError as exc:
            print(f"logbroker push: {exc}", file=sys.stderr)
            return 2
    daemon = PushDaemon(
        config,
        idle_exit_s=args.idle_exit,
        progress=args.progress,
        reload=lambda: _config(args),
        read_token=read_token_file,
    )
    try:
        graphite = graphite_from(config, daemon.metrics_collector())
    except BadRequest as exc:
        print(f"logbroker push: {exc}", file=sys.stderr)
        return 2
    # A stop that came while starting makes the daemon flush nothing and exit at once.
    stop_signals.on_stop(daemon.stop)
    # A reload asked for while it started is applied once it runs (SIGHUP does not kill it).
    stop_signals.on_reload(daemon.request_reload)
    try:
        code = daemon.run()
    except CannotStart as exc:
        print(f"logbroker push: {exc}", file=sys.stderr)
        return 2
    except LogbrokerError as exc:
        print(f"logbroker push: {exc}", file=sys.stderr)
        return 1
    finally:
        if graphite is not None:
            graphite.stop()
    if daemon.requests_abandoned():
        # A request to a hung gateway may block its thread until the HTTP timeout; the
        # positions are saved, so exit now instead of waiting for it.
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def _say_relative_paths(file: Path) -> None:
    """Warn once, naming what they resolve to, when ``file`` holds relative paths and is not
    in the working directory: they are taken from the working directory (as on the command
    line), not from the file's (a unit file without ``WorkingDirectory=`` runs in /)."""
    if Path(file).absolute().parent == Path.cwd():
        return
    settings, entries = load_file(file)
    named = [(key, settings.get(key)) for key in ("state_dir", "token_file")]
    named += [("path", entry.path) for entry in entries]
    relative = [
        f"{key} {value} is {os.path.abspath(os.path.expanduser(value))}"
        for key, value in named
        if isinstance(value, str) and value and not os.path.isabs(os.path.expanduser(value))
    ]
    if relative:
        print(
            f"logbroker push: warning: {file} gives relative paths, taken from the working "
            f"directory {os.getcwd()}, not the file's: {'; '.join(relative)}",
            file=sys.stderr,
        )


def _config(args: argparse.Namespace) -> PushConfig:
    """The configuration from the file, the environment and the flags (again on SIGHUP)."""
    return build_config(
        file=args.config,
        servers=args.server,
        state_dir=args.state_dir,
        log_type=args.log_type,
        codec=args.codec,
        multiline=args.multiline,
        olddir=args.olddir,
        paths=args.paths,
        overrides={
            "host": args.host_name,
            "token": args.token,
            "token_file": args.token_file,
            "chunk_bytes": args.chunk_bytes,
            "request_bytes": args.request_bytes,
            "linger_ms": args.linger_ms,
            "max_in_flight": args.max_in_flight,
            "pipeline_depth": args.pipeline_depth,
            "memory_bytes": args.memory_bytes,
            "rotate_wait_s": args.rotate_wait,
            "rotated_grace_s": args.rotated_grace,
            "park_retry_s": args.park_retry,
            "failover_after_s": args.failover_after,
            "position_wait_s": args.position_wait,
            "probe_interval_s": args.probe_interval,
            "probe_max_interval_s": args.probe_max_interval,
            "poll_interval_s": args.poll_interval,
            "direct_to_owner": args.direct_to_owner,
            "owner_refresh_s": args.owner_refresh,
            "owner_timeout_s": args.owner_timeout,
            "request_timeout_s": args.request_timeout,
            "stall_after_s": args.stall_after,
            "inotify": False if args.no_inotify else None,
            "metrics_port": args.metrics_port,
            "graphite": args.graphite,
            "graphite_prefix": args.graphite_prefix,
            "graphite_interval_s": args.graphite_interval_s,
            "shutdown_timeout_s": args.shutdown_timeout,
        },
    )


def _print_status(args: argparse.Namespace) -> int:
    state_dir = args.state_dir
    if state_dir is None and args.config is not None:
        try:
            state_dir = build_config(file=args.config).state_dir
        except ConfigError as exc:
            print(f"logbroker push --status: {exc}", file=sys.stderr)
            return 2
    if state_dir is None:
        print("logbroker push --status: give --state-dir DIR or --config FILE", file=sys.stderr)
        return 2
    try:
        doc = read_status(Path(state_dir))
    except NoStatus as exc:
        print(f"logbroker push --status: {exc}", file=sys.stderr)
        return 1
    print_status(doc, sys.stdout)
    return 0
