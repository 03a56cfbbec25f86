"""Signals that come while the client starts: no moment after ``exec`` where a SIGHUP kills it
when its launcher blocks or ignores SIGHUP, or (systemd) waits for it to say it is ready."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import REPO, GatewayProcess, logbroker_cmd
from tests.push_client.conftest import (
    FAST_FLAGS,
    LineWriter,
    assert_exactly_once,
    wait_for_lines,
)

pytestmark = pytest.mark.slow

DELAYS_S = (0.0, 0.01, 0.03, 0.1)


def _blocking_sighup() -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})


def _ignoring_sighup() -> None:
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # what `nohup` and `trap '' HUP` do


def _start(
    args: list[str],
    log: Path,
    launcher: Callable[[], None] | None,
    env: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(
            logbroker_cmd("push", *args),
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            preexec_fn=launcher,
            env=env,
        )


def _handles(pid: int, signum: int) -> bool:
    """Whether the process has a handler for ``signum`` (the kernel's view)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) & (1 << (signum - 1)))
    return False


def test_sighups_from_the_first_instant_on_never_kill_a_client_whose_launcher_holds_them(
    tmp_path: Path, gateway: GatewayProcess
) -> None:
    # Several clients at once (each its file and state dir), signalled at once and after a
    # few milliseconds: long before the interpreter runs a line of logbroker.
    runs = [(_blocking_sighup, d) for d in DELAYS_S] + [(_ignoring_sighup, d) for d in (0, 0.03)]
    started = []
    for run, (launcher, delay_s) in enumerate(runs):
        app = tmp_path / f"app{run}.log"
        writer = LineWriter(f"r{run}")
        writer.append(app, 20)
        args = ["--server", gateway.url, "--log-type", "app", *FAST_FLAGS]
        log = tmp_path / f"push-{run}.log"
        proc = _start(
            [*args, "--state-dir", str(tmp_path / f"state{run}"), str(app)], log, launcher
        )
        started.append((proc, log, app, writer, launcher, delay_s))
    begun = time.monotonic()
    for proc, _, _, _, _, delay_s in sorted(started, key=lambda s: s[5]):
        time.sleep(max(0.0, begun + delay_s - time.monotonic()))
        for _ in range(3):  # a burst, as a tool that reloads on every change sends
            proc.send_signal(signal.SIGHUP)
    try:
        for _, _, app, writer, _, _ in started:
            writer.append(app, 20)
        writers = [s[3] for s in started]
        total = sum(len(w.ids) for w in writers)
        delivered = wait_for_lines(gateway.data_dir, "app", total, timeout_s=30)
        for proc, log, _, _, launcher, delay_s in started:
            assert proc.poll() is None, f"died of a SIGHUP at {delay_s} s: {log.read_text()}"
            if launcher is _blocking_sighup:
                # held back, not lost: applied once the client can
                assert "SIGHUP: configuration reloaded" in log.read_text(), log.read_text()
        assert_exactly_once(delivered, *writers)
        for proc, _, _, _, _, _ in started:
            proc.send_signal(signal.SIGTERM)
        for proc, log, _, _, _, _ in started:
            assert proc.wait(30) == 0, log.read_text()
    finally:
        for proc, _, _, _, _, _ in started:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_a_sigterm_the_launcher_blocked_still_stops_the_client_cleanly(tmp_path: Path) -> None:
    def blocking_stops() -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP, signal.SIGTERM, signal.SIGINT})

    (tmp_path / "app.log").write_text("a line\n")
    state = tmp_path / "state"
    url = "http://127.0.0.1:9"  # nothing answers: the client keeps trying until stopped
    args = ["--server", url, "--log-type", "app", "--state-dir", str(state), *FAST_FLAGS]
    log = tmp_path / "push.log"
    proc = _start([*args, str(tmp_path / "app.log")], log, blocking_stops)
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        pytest.fail(f"a SIGTERM blocked at exec never stopped the client: {log.read_text()}")
    assert code == 0, log.read_text()
    assert "Traceback" not in log.read_text()


def test_the_client_tells_systemd_it_is_ready_once_a_sighup_is_a_reload(tmp_path: Path) -> None:
    name = f"@logbroker-test-{uuid.uuid4().hex}"
    manager = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    manager.bind("\0" + name[1:])
    manager.settimeout(30)
    (tmp_path / "app.log").write_text("a line\n")
    state = tmp_path / "state"
    url = "http://127.0.0.1:9"
    args = ["--server", url, "--log-type", "app", "--state-dir", str(state), *FAST_FLAGS]
    log = tmp_path / "push.log"
    env = dict(os.environ, NOTIFY_SOCKET=name)
    proc = _start([*args, str(tmp_path / "app.log")], log, None, env)
    try:
        assert manager.recv(4096) == b"READY=1", log.read_text()
        assert _handles(proc.pid, signal.SIGHUP)  # what systemd's ExecReload may now send
        proc.send_signal(signal.SIGHUP)
        time.sleep(0.5)
        assert proc.poll() is None, log.read_text()
        proc.send_signal(signal.SIGTERM)
        assert manager.recv(4096) == b"STOPPING=1"
        assert proc.wait(30) == 0, log.read_text()
        assert "SIGHUP: configuration reloaded" in log.read_text()
    finally:
        manager.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
