"""The push-client's configuration: one typed, frozen object built once (file, env, flags).

A TOML file describes many entries; flags of ``logbroker push`` override the ``[push]`` table
and add one entry for the paths given on the command line (``--log-type``, ``--codec``,
``--multiline`` and ``--olddir`` describe that entry only: without paths they are refused,
never ignored)::

    [push]
    servers = ["http://gw1:8080", "http://gw2:8080"]   # one installation, several gateways
    # servers = ["dc1=http://a:8080,http://b:8080", "dc2=http://c:8080"]   # installations
    state_dir = "/var/lib/logbroker-push"
    host = "web-17"              # default: the machine's host name
    token = "s3cr3t"             # or LOGBROKER_TOKEN
    token_file = "/etc/logbroker/token"   # or this: re-read when it changes
    chunk_bytes = 1048576        # largest chunk (one message of the log)
    request_bytes = 8388608      # largest request body, many chunks of many sources
    linger_ms = 5                # how long a small batch may wait for company
    max_in_flight = 4            # concurrent requests
    pipeline_depth = 2           # requests of one file in flight (guarded by prev_seqno)
    memory_bytes = 67108864      # read but unacknowledged bytes held in memory, at most
    rotate_wait_s = 2.0          # a deleted file quiet this long is let go
    rotated_grace_s = 300.0      # a renamed file quiet this long is let go
    park_retry_s = 60.0          # a file the gateway refused is tried again this often
    failover_after_s = 5.0       # an installation failing this long is left for the next
    probe_interval_s = 2.0       # first wait before a down installation (failing gateway) is probed
    probe_max_interval_s = 60.0  # the wait doubles with each failed try up to this
    position_wait_s = 300.0      # how long positions known only to a down installation wait
    metrics_port = 9109          # optional local /metrics endpoint
    graphite = "graphite1:2003"  # optional: also send the metrics to Graphite
    graphite_prefix = "logbroker.dc1.host1"
    direct_to_owner = ["http://gw*.example:8080"]   # send each source to its partition's owner
    owner_refresh_s = 30.0       # how often the owners' map is asked for again
    owner_timeout_s = 10.0       # an owner silent this long: the request goes to the gateways
    request_timeout_s = 60.0     # a gateway silent this long: the request is given up there
    stall_after_s = 10.0         # a request unanswered this long also goes to the next gateway

    [[entry]]
    path = "/var/log/nginx/*.log"
    log_type = "nginx-access"
    codec = "zstd"               # raw | gzip | zstd
    multiline = '^\\d{4}-\\d\\d-\\d\\d '   # optional: a line matching starts a record
    olddir = "old"               # optional: logrotate's olddir, where rotated files go
"""

from __future__ import annotations

import math
import os
import re
import socket
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from log_store.errors import BadRequest
from log_store.topic_names import LOG_TYPE_RULE, is_valid_log_type
from push_client.installations import InstallationSpec, parse_servers

CODECS = ("raw", "gzip", "zstd")
_PUSH_KEYS = {
    "servers",
    "state_dir",
    "host",
    "token",
    "chunk_bytes",
    "request_bytes",
    "linger_ms",
    "max_in_flight",
    "pipeline_depth",
    "memory_bytes",
    "rotate_wait_s",
    "rotated_grace_s",
    "park_retry_s",
    "failover_after_s",
    "probe_interval_s",
    "probe_max_interval_s",
    "position_wait_s",
    "token_file",
    "poll_interval_s",
    "rescan_interval_s",
    "multiline_timeout_s",
    "metrics_port",
    "inotify",
    "shutdown_timeout_s",
    "max_backoff_s",
    "max_line_bytes",
    "graphite",
    "graphite_prefix",
    "graphite_interval_s",
    "direct_to_owner",
    "owner_refresh_s",
    "owner_timeout_s",
    "request_timeout_s",
    "stall_after_s",
}
_ENTRY_KEYS = {"path", "log_type", "codec", "multiline", "olddir"}


class ConfigError(BadRequest):
    """The push-client's configuration (file, env or flags) is invalid."""


@dataclass(frozen=True)
class Entry:
    """One path or glob to tail and how to ship what it holds."""

    path: str
    log_type: str
    codec: str = "raw"
    multiline: str | None = None
    olddir: tuple[str, ...] = ()
    """Where rotation moves the files this entry matches, besides their own directory
    (logrotate's ``olddir``): directories or globs of directories, each relative to the
    file's directory unless absolute.  Looked through for the files rotated while the client
    was stopped, and for a file renamed away there (``push_client.rotation.rotated_dirs``)."""

    def multiline_pattern(self) -> re.Pattern[bytes] | None:
        if self.multiline is None:
            return None
        return re.compile(self.multiline.encode("utf-8"))


@dataclass(frozen=True)
class PushConfig:
    """Everything ``logbroker push`` needs, immutable once built."""

    servers: tuple[str, ...]
    """As given: URLs, or ``name=URL[,URL...]`` installations (see :attr:`installations`)."""
    state_dir: Path
    entries: tuple[Entry, ...]
    host: str = field(default_factory=socket.gethostname)
    token: str | None = None
    token_file: Path | None = None
    chunk_bytes: int = 1024 * 1024
    request_bytes: int = 8 * 1024 * 1024
    linger_ms: float = 5.0
    max_in_flight: int = 4
    pipeline_depth: int = 2
    memory_bytes: int = 64 * 1024 * 1024
    rotate_wait_s: float = 2.0
    rotated_grace_s: float = 300.0
    park_retry_s: float = 60.0
    failover_after_s: float = 5.0
    probe_interval_s: float = 2.0
    """The first wait before an installation that is down, or a gateway that fails while no
    request tries it, is probed (``GET /readyz``); see ``push_client.backoff``."""
    probe_max_interval_s: float = 60.0
    """The longest wait between two probes of one target: the wait doubles from
    ``probe_interval_s`` with each failed try up to this (never below ``probe_interval_s``).
    Also how long an installation that is up may answer nothing (an idle client) before it is
    probed, see ``push_client.installations``."""
    position_wait_s: float = 300.0
    poll_interval_s: float = 0.25
    rescan_interval_s: float = 1.0
    multiline_timeout_s: float = 1.0
    metrics_port: int | None = None
    inotify: bool = True
    shutdown_timeout_s: float = 10.0
    max_backoff_s: float = 5.0
    max_line_bytes: int = 4 * 1024 * 1024
    graphite: str | None = None
    """``HOST:PORT`` of a Graphite plaintext listener the metrics are also sent to."""
    graphite_prefix: str = "logbroker"
    graphite_interval_s: float = 60.0
    direct_to_owner: tuple[str, ...] = ()
    """Globs of owner origins (``scheme://host[:port]``) the client may send each source's
    sections to directly (see ``push_client.owner_routes``); empty: off, the default."""
    owner_refresh_s: float = 30.0
    owner_timeout_s: float = 10.0
    """How long a write at a partition's owner may wait for its answer before the same body
    goes to the configured gateways (an owner that accepts and never answers, e.g. frozen or
    unreachable past a proxy, would otherwise hold its sources for the full request timeout)."""
    request_timeout_s: float = 60.0
    """How long a request to a gateway may wait for its answer (connecting: at most 2 s)
    before it gives up on it.  A gateway that accepts and never answers (frozen) is left
    sooner, after ``stall_after_s``.  A gateway answers 503 by itself after its own
    ``limits.request_timeout_s`` (30 s)."""
    stall_after_s: float = 10.0
    """A request unanswered this long counts as a failure of its gateway: it is sent again
    to the next gateway of the installation (the first copy is still awaited; the gateways
    answer the second ``duplicate``), and an installation whose gateways all fail or hang
    for ``failover_after_s`` is left for the next.  A frozen gateway, or one waiting for its
    Kafka, is thus left after this, not ``request_timeout_s``.  Above the time the largest
    request takes on a loaded gateway (3.7 s at most, measured, see docs/push-client.md); at
    least 1; ``request_timeout_s`` or more turns it off."""

    @property
    def installations(self) -> tuple[InstallationSpec, ...]:
        """The installations to write to, most preferred first (one when none is named)."""
        return parse_servers(self.servers)

    def validated(self) -> PushConfig:
        """Return self if every field makes sense, else raise :class:`ConfigError`."""
        if not self.servers:
            raise ConfigError("no gateway given: use --server URL[,URL...] or push.servers")
        try:
            installations = self.installations
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        for spec in installations:
            for url in spec.servers:
                if not re.fullmatch(r"https?://[^\s/]+(/[^\s]*)?", url):
                    raise ConfigError(f"server {url!r} is not an http:// or https:// URL")
        if not self.entries:
            raise ConfigError("nothing to tail: give PATH_OR_GLOB arguments or [[entry]] tables")
        for entry in self.entries:
            if not is_valid_log_type(entry.log_type):
                raise ConfigError(f"log type {entry.log_type!r} is invalid: use {LOG_TYPE_RULE}")
            if entry.codec not in CODECS:
                raise ConfigError(f"codec {entry.codec!r} is unknown; use {', '.join(CODECS)}")
            if not entry.path:
                raise ConfigError("an entry has an empty path")
            for olddir in entry.olddir:
                if not olddir.strip() or "\0" in olddir:
                    raise ConfigError(
                        f"entry {entry.path}: olddir {olddir!r} is not a directory path"
                    )
            if entry.multiline is not None:
                try:
                    entry.multiline_pattern()
                except re.error as exc:
                    raise ConfigError(f"multiline regex {entry.multiline!r}: {exc}") from exc
        if not self.host or not self.host.isprintable():
            # it is every chunk's server and part of every source id, where the gateway
            # refuses control, separator and format characters (400 bad_meta for every file)
            raise ConfigError(
                f"host name {self.host!r} is empty or has characters that are not printable "
                "(control, separator or format characters)"
            )
        for setting in fields(self):
            # nan passes every bound below (each comparison with it is false), inf waits for
            # ever; TOML and the command line both spell them
            value = getattr(self, setting.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"{setting.name} must be a finite number, not {value}")
        if self.chunk_bytes < 4096 or self.chunk_bytes > 8 * 1024 * 1024:
            raise ConfigError("chunk_bytes must be between 4096 and 8388608")
        if self.request_bytes < self.chunk_bytes or self.request_bytes > 64 * 1024 * 1024:
            raise ConfigError("request_bytes must be between chunk_bytes and 67108864")
        if self.max_in_flight < 1 or self.pipeline_depth < 1:
            raise ConfigError("max_in_flight and pipeline_depth must be at least 1")
        if self.memory_bytes < 2 * self.request_bytes:
            raise ConfigError("memory_bytes must be at least twice request_bytes")
        if self.linger_ms < 0 or self.rotate_wait_s < 0 or self.poll_interval_s <= 0:
            raise ConfigError("linger_ms and rotate_wait_s must be >= 0, poll_interval_s > 0")
        if self.rotated_grace_s < self.rotate_wait_s:
            raise ConfigError("rotated_grace_s must be at least rotate_wait_s")
        for name in (
            "park_retry_s",
            "failover_after_s",
            "probe_interval_s",
            "probe_max_interval_s",
        ):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive")
        if self.position_wait_s < 0:
            raise ConfigError("position_wait_s must be >= 0")
        for name in ("rescan_interval_s", "max_backoff_s", "graphite_interval_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive")
        for name in ("multiline_timeout_s", "shutdown_timeout_s"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0")
        # a line cut at max_line_bytes is one chunk: the protocol's largest is 8 MiB
        if self.max_line_bytes < 4096 or self.max_line_bytes > 8 * 1024 * 1024:
            raise ConfigError("max_line_bytes must be between 4096 and 8388608")
        if self.metrics_port is not None and not 1 <= self.metrics_port <= 65535:
            raise ConfigError(f"metrics_port must be a TCP port (1-65535), not {self.metrics_port}")
        for glob in self.direct_to_owner:
            if not re.fullmatch(r"https?://[^\s/?#@]+", glob):
                raise ConfigError(
                    f"direct_to_owner {glob!r} is not a scheme://host[:port] glob "
                    "(e.g. https://gw*.example.org:8080)"
                )
        if self.owner_refresh_s <= 0:
            raise ConfigError("owner_refresh_s must be positive")
        if self.owner_timeout_s <= 0:
            raise ConfigError("owner_timeout_s must be positive")
        if not 1 <= self.request_timeout_s < float("inf"):
            raise ConfigError("request_timeout_s must be a number of seconds, at least 1")
        if not 1 <= self.stall_after_s < float("inf"):
            raise ConfigError("stall_after_s must be a number of seconds, at least 1")
        return self


def _entry_from_table(table: Any, where: str) -> Entry:
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: must be a table ([[entry]]), not {table!r}")
    unknown = set(table) - _ENTRY_KEYS
    if unknown:
        raise ConfigError(f"{where}: unknown keys {sorted(unknown)}")
    if "path" not in table or "log_type" not in table:
        raise ConfigError(f"{where}: needs 'path' and 'log_type'")
    olddir = table.get("olddir", [])
    if isinstance(olddir, str):
        olddir = [olddir]
    if not isinstance(olddir, list) or not all(isinstance(d, str) for d in olddir):
        raise ConfigError(f"{where}: olddir must be a string or a list of strings, not {olddir!r}")
    for key, value in table.items():
        if key != "olddir" and not isinstance(value, str):
            raise ConfigError(f"{where}: {key} must be a string, not {value!r}")
    return Entry(
        path=table["path"],
        log_type=table["log_type"],
        codec=table.get("codec", "raw"),
        multiline=table.get("multiline"),
        olddir=tuple(olddir),
    )


def load_file(path: Path) -> tuple[dict[str, Any], list[Entry]]:
    """The ``[push]`` settings and the ``[[entry]]`` list of a TOML file."""
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror}") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config {path} is not valid TOML: {exc}") from exc
    unknown_top = set(doc) - {"push", "entry"}
    if unknown_top:
        raise ConfigError(f"config {path}: unknown tables {sorted(unknown_top)}")
    push = doc.get("push", {})
    if not isinstance(push, dict):
        raise ConfigError(f"config {path}: [push] must be a table, not {push!r}")
    unknown = set(push) - _PUSH_KEYS
    if unknown:
        raise ConfigError(f"config {path}: unknown keys in [push]: {sorted(unknown)}")
    tables = doc.get("entry", [])
    if not isinstance(tables, list):
        raise ConfigError(f"config {path}: entry must be [[entry]] tables, not {tables!r}")
    entries = [
        _entry_from_table(t, f"config {path} [[entry]] #{i + 1}") for i, t in enumerate(tables)
    ]
    return dict(push), entries


_INT_KEYS = {
    "chunk_bytes",
    "request_bytes",
    "max_in_flight",
    "pipeline_depth",
    "memory_bytes",
    "max_line_bytes",
}
_OPTIONAL_INT_KEYS = {"metrics_port"}
_BOOL_KEYS = {"inotify"}
_LIST_KEYS = {"direct_to_owner"}
_TEXT_KEYS = {"host", "token", "graphite", "graphite_prefix"}


def _typed(key: str, value: Any) -> Any:
    """``value`` if it has the type ``key`` needs (an int also does for a float)."""
    if key in _TEXT_KEYS or key == "token_file":
        if isinstance(value, (str, Path)):
            return value
        raise ConfigError(f"{key} must be a string, not {value!r}")
    if key in _LIST_KEYS:
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, (list, tuple)) or not all(isinstance(i, str) for i in items):
            raise ConfigError(f"{key} must be a list of strings, not {value!r}")
        return tuple(i.strip() for i in items if i.strip())
    if key in _BOOL_KEYS:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key} must be true or false, not {value!r}")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{key} must be a number, not {value!r}")
    if key in _INT_KEYS or key in _OPTIONAL_INT_KEYS:
        if not isinstance(value, int):
            raise ConfigError(f"{key} must be a whole number, not {value!r}")
        return value
    return float(value)


def _normalized_servers(values: list[str]) -> tuple[str, ...]:
    """One installation: its URLs.  Several: ``NAME=URL,...`` each, in order of preference."""
    try:
        specs = parse_servers(values)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if len(specs) == 1 and not any("=" in v.split("://", 1)[0] for v in values):
        return specs[0].servers
    return tuple(f"{spec.name}={','.join(spec.servers)}" for spec in specs)


def _refuse_entry_flags_without_paths(file: Path | None, **flags: str | None) -> None:
    """``--log-type``, ``--codec``, ``--multiline`` and ``--olddir`` describe the entry that the
    PATH_OR_GLOB arguments add: without paths they describe nothing.  With ``--config`` they
    were ignored in silence (a user who asked for ``--codec zstd`` shipped raw): refused,
    naming the flag and where the setting goes instead."""
    given = [f"--{name.replace('_', '-')}" for name, value in flags.items() if value]
    if not given:
        return
    what = " and ".join(given)
    if file is None:
        raise ConfigError(f"give at least one PATH_OR_GLOB to tail ({what} applies to them)")
    keys = ", ".join(name for name, value in flags.items() if value)
    raise ConfigError(
        f"{what} applies only to PATH_OR_GLOB arguments, and none is given: the entries of "
        f"{file} keep their own settings; set {keys} in its [[entry]] tables, or give the "
        "paths on the command line"
    )


def build_config(
    *,
    file: Path | None = None,
    servers: list[str] | None = None,
    state_dir: str | None = None,
    log_type: str | None = None,
    codec: str | None = None,
    multiline: str | None = None,
    olddir: list[str] | None = None,
    paths: list[str] | None = None,
    overrides: dict[str, Any] | None = None,
) -> PushConfig:
    """Build the config: defaults, then the file, then the environment, then flags."""
    settings: dict[str, Any] = {}
    entries: list[Entry] = []
    if file is not None:
        settings, entries = load_file(file)
    if os.environ.get("LOGBROKER_TOKEN"):
        settings["token"] = os.environ["LOGBROKER_TOKEN"]
    if servers:
        settings["servers"] = [s.strip() for s in servers if s.strip()]
    if state_dir:
        settings["state_dir"] = state_dir
    for key, value in (overrides or {}).items():
        if value is not None:
            settings[key] = value
    if paths:
        if not log_type:
            raise ConfigError("--log-type is required with PATH_OR_GLOB arguments")
        for p in paths:
            entries.append(Entry(p, log_type, codec or "raw", multiline, tuple(olddir or ())))
    else:
        _refuse_entry_flags_without_paths(
            file,
            log_type=log_type,
            codec=codec,
            multiline=multiline,
            olddir=",".join(olddir or ()) or None,
        )
    if "state_dir" not in settings:
        raise ConfigError("no state directory: use --state-dir DIR or push.state_dir")
    raw_servers = settings.pop("servers", [])
    if isinstance(raw_servers, str):
        raw_servers = [raw_servers]
    if not isinstance(raw_servers, list) or not all(isinstance(u, str) for u in raw_servers):
        raise ConfigError(f"servers must be a list of URL strings, not {raw_servers!r}")
    state_dir_value = settings.pop("state_dir")
    if not isinstance(state_dir_value, str) or not state_dir_value.strip():
        # "" would be the working directory: positions kept wherever the client was started
        raise ConfigError(f"state_dir must be a directory path, not {state_dir_value!r}")
    state = Path(state_dir_value).expanduser()
    if settings.get("token_file") is not None:
        token_file = _typed("token_file", settings["token_file"])
        if not str(token_file).strip():
            raise ConfigError("token_file must be a file path, not ''")
        settings["token_file"] = Path(token_file).expanduser()
    for key, value in settings.items():
        settings[key] = _typed(key, value)
    try:
        config = PushConfig(
            servers=_normalized_servers(raw_servers),
            state_dir=state,
            entries=tuple(entries),
            **settings,
        )
    except TypeError as exc:
        raise ConfigError(f"bad setting: {exc}") from exc
    return config.validated()
