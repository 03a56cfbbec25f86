"""Fixtures of the push-client tests: line writers with unique ids, real client processes,
and a reader that checks what reached the log directly in the gateway's data dir."""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from log_store import open_store
from log_store.errors import UnknownTopic
from session_dedup.chunk_codecs import decompress
from session_dedup.envelope import decode
from tests.conftest import REPO, GatewayProcess, logbroker_cmd

FAST_FLAGS = [
    "--rotate-wait",
    "0.5",
    "--poll-interval",
    "0.1",
    "--linger-ms",
    "5",
    "--shutdown-timeout",
    "5",
    "--no-progress",
]


class LineWriter:
    """Appends lines ``<tag>:<n> <padding>`` with n counting up; remembers every id written."""

    def __init__(self, tag: str, pad: int = 60) -> None:
        self.tag = tag
        self.pad = "x" * pad
        self.next = 0
        self.ids: list[str] = []

    def lines(self, count: int) -> bytes:
        out = []
        for _ in range(count):
            line_id = f"{self.tag}:{self.next:09d}"
            self.next += 1
            self.ids.append(line_id)
            out.append(f"{line_id} {self.pad}\n")
        return "".join(out).encode()

    def append(self, path: Path, count: int) -> None:
        with open(path, "ab") as f:
            f.write(self.lines(count))


class BackgroundWriter:
    """Appends lines to one file from a thread at a steady pace until stopped."""

    def __init__(self, path: Path, writer: LineWriter, lines_per_tick: int = 50) -> None:
        self.path = path
        self.writer = writer
        self.lines_per_tick = lines_per_tick
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            with self.lock:
                self.writer.append(self.path, self.lines_per_tick)
            time.sleep(0.01)

    def rotate(self, new_name: str) -> None:
        with self.lock:
            os.rename(self.path, self.path.with_name(new_name))

    def __enter__(self) -> BackgroundWriter:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


@dataclass
class Delivered:
    """What the log holds for one topic: per source, its chunks' seqnos and lines."""

    seqnos: dict[str, list[int]] = field(default_factory=dict)
    lines: dict[str, list[bytes]] = field(default_factory=dict)
    codecs: set[str] = field(default_factory=set)
    handovers: dict[str, list[int]] = field(default_factory=dict)
    """Per source, the seqnos of its handover records (data acknowledged elsewhere)."""

    def ids(self) -> list[str]:
        return [line.split(b" ", 1)[0].decode() for lines in self.lines.values() for line in lines]

    def count(self) -> int:
        return sum(len(v) for v in self.lines.values())


def read_delivered(data_dir: Path, log_type: str, dc: str = "dc1") -> Delivered:
    """Every chunk of topic ``<dc>.<log_type>`` decoded, decompressed and split into lines."""
    out = Delivered()
    topic = f"{dc}.{log_type}"
    if not (data_dir).exists():
        return out
    store = open_store(data_dir)
    try:
        try:
            info = store.describe_topic(topic)
        except UnknownTopic:
            return out
        for part in info.partitions:
            offset = part.start_offset
            while True:
                result = store.read(topic, part.partition, offset, 8 * 1024 * 1024)
                if not result.records:
                    break
                for record in result.records:
                    env = decode(record.value)
                    if env.kind == "handover":
                        out.handovers.setdefault(env.source_id, []).append(env.seqno)
                        continue
                    out.codecs.add(env.codec)
                    out.seqnos.setdefault(env.source_id, []).append(env.seqno)
                    data = decompress(env.codec, env.data)
                    out.lines.setdefault(env.source_id, []).extend(data.splitlines())
                offset = result.next_offset
    finally:
        store.close()
    return out


def until(predicate: Callable[[], object], timeout_s: float = 20.0) -> bool:
    """Whether ``predicate()`` came true within ``timeout_s`` (looked at every 0.1 s)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def wait_for_lines(data_dir: Path, log_type: str, count: int, timeout_s: float = 30.0) -> Delivered:
    """Poll the log until it holds at least ``count`` lines (or the timeout passes)."""
    deadline = time.monotonic() + timeout_s
    while True:
        delivered = read_delivered(data_dir, log_type)
        if delivered.count() >= count or time.monotonic() > deadline:
            return delivered
        time.sleep(0.2)


def assert_exactly_once(delivered: Delivered, *writers: LineWriter) -> None:
    """Every written id arrived exactly once; seqnos and ids increase within each source.

    Lines starting with ``#`` are headers without ids (several files may share one).
    """
    assert_exactly_once_across([delivered], *writers)


def assert_exactly_once_across(logs: list[Delivered], *writers: LineWriter) -> None:
    """Every written id is in exactly one of ``logs`` (installations), once; within each,
    seqnos and ids increase per source."""
    for delivered in logs:
        _assert_in_order(delivered)
    counts = collections.Counter(i for delivered in logs for i in delivered.ids())
    duplicated = [i for i, c in counts.items() if c > 1]
    assert not duplicated, f"{len(duplicated)} lines arrived twice, e.g. {duplicated[:5]}"
    expected = [i for w in writers for i in w.ids]
    missing = [i for i in expected if i not in counts]
    assert not missing, f"{len(missing)} of {len(expected)} lines missing, e.g. {missing[:5]}"
    extra = set(counts) - set(expected)
    assert not extra, f"{len(extra)} lines nobody wrote, e.g. {sorted(extra)[:5]}"


def _assert_in_order(delivered: Delivered) -> None:
    for source_id, lines in delivered.lines.items():
        delivered.lines[source_id] = [line for line in lines if not line.startswith(b"#")]
    for source_id, seqnos in delivered.seqnos.items():
        assert seqnos == sorted(set(seqnos)), f"seqnos of {source_id} not strictly increasing"
        assert seqnos[0] >= 1
    for source_id, lines in delivered.lines.items():
        last: dict[str, int] = {}
        for line in lines:
            tag, _, number = line.split(b" ", 1)[0].decode().partition(":")
            n = int(number)
            assert n > last.get(tag, -1), f"line {tag}:{n} out of order in {source_id}"
            last[tag] = n


class PushProcess:
    """A real ``logbroker push`` process."""

    def __init__(self, args: list[str], log_path: Path) -> None:
        self.args = args
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> PushProcess:
        log = open(self.log_path, "ab")  # noqa: SIM115 - kept open for the child's lifetime
        self.proc = subprocess.Popen(
            logbroker_cmd("push", *self.args), stdout=log, stderr=subprocess.STDOUT, cwd=REPO
        )
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:]

    def wait_started(self, state_dir: Path, timeout_s: float = 30.0) -> PushProcess:
        """Wait until the client runs its loop (it published a status with its pid).

        Starting Python takes seconds on a loaded machine: a test that kills or stops a
        client "after a while" must count that while from here.
        """
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                status = json.loads((state_dir / "status.json").read_bytes())
            except (OSError, ValueError):
                status = {}
            if status.get("pid") == self.proc.pid and status.get("running"):
                return self
            if self.proc.poll() is not None:
                raise AssertionError(f"push exited with {self.proc.returncode}: {self.log()}")
            time.sleep(0.05)
        raise AssertionError(f"push did not start within {timeout_s} s: {self.log()}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout_s: float = 30.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout_s)

    def wait(self, timeout_s: float = 60.0) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout_s)


@pytest.fixture
def start_push(tmp_path: Path) -> Iterator[object]:
    """Factory: ``start_push(servers, state_dir, *paths, log_type="app", extra=[...])``."""
    started: list[PushProcess] = []

    def _start(
        servers: str,
        state_dir: Path,
        *paths: str | Path,
        log_type: str = "app",
        extra: list[str] | None = None,
    ) -> PushProcess:
        args = [
            "--server",
            servers,
            "--log-type",
            log_type,
            "--state-dir",
            str(state_dir),
            *FAST_FLAGS,
            *(extra or []),
            *(str(p) for p in paths),
        ]
        proc = PushProcess(args, tmp_path / f"push-{len(started)}.log")
        started.append(proc)
        return proc.start()

    yield _start
    for proc in started:
        proc.kill()


def delete_keeping_inode(path: Path) -> Path:
    """Delete ``path`` but keep its inode allocated under a name outside the tailed directory.

    ext4 hands a freed inode out again only when its allocator gets to it, which a test cannot
    force; holding the inode and later giving it new contents under the old name is, for the
    client, the same event: the same device and inode with other bytes in them.
    """
    keep = path.parent.parent / f"{path.parent.name}-held-inode"
    os.link(path, keep)
    path.unlink()
    return keep


def recreate_with_inode(keep: Path, path: Path, content: bytes) -> None:
    """Give the held inode ``content`` and put it back at ``path`` (the reused inode)."""
    with open(keep, "r+b") as f:
        f.truncate(0)
        f.write(content)
    os.link(keep, path)
    keep.unlink()


@dataclass
class Shipped:
    """A push-client tailing ``logs/*.log`` whose first 100 lines of ``app`` reached
    ``gateway``, which was then SIGKILLed (see :func:`ship_then_kill_gateway`)."""

    gateway: GatewayProcess
    logs: Path
    app: Path
    writer: LineWriter
    state: Path
    push: PushProcess


def ship_then_kill_gateway(
    tmp_path: Path,
    start_gateway: Callable[[], GatewayProcess],
    start_push: object,
    writer: LineWriter,
) -> Shipped:
    """Start a gateway and a push-client on ``logs/*.log``, ship 100 lines of ``app.log``
    written by ``writer``, then SIGKILL the gateway: what follows happens while it is down."""
    gateway = start_gateway()
    logs = tmp_path / "logs"
    logs.mkdir()
    app = logs / "app.log"
    writer.append(app, 100)
    state = tmp_path / "state"
    push = start_push(gateway.url, state, str(logs / "*.log")).wait_started(state)  # type: ignore[operator]
    wait_for_lines(gateway.data_dir, "app", 100)
    gateway.kill()
    return Shipped(gateway, logs, app, writer, state, push)
