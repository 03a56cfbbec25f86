"""Long-running commands: a stop that comes while they start is a clean stop; the gateway says
it is up only once it listens."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, free_port, logbroker_cmd


def _start(args: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        logbroker_cmd(*args), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )


def _catches(pid: int, signum: int = signal.SIGTERM) -> bool:
    """Whether the process has a handler for ``signum`` (the kernel's view, /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) & (1 << (signum - 1)))
    return False


def _args(command: str, tmp_path: Path) -> list[str]:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens: the command keeps trying
    return {
        "push": [
            *("push", "--server", url, "--log-type", "app", "--state-dir", str(tmp_path)),
            str(tmp_path / "app.log"),
        ],
        "read": ["read", "--server", url, "--topic", "dc1.app"],
        "serve": ["serve", "--data-dir", str(tmp_path / "data"), "--port", str(free_port())],
        "mirror": [
            *("mirror", "--from", url, "--to", f"http://127.0.0.1:{free_port()}"),
            *("--prefix", "dc1."),
        ],
    }[command]


@pytest.mark.parametrize("delay_s", [0.0, 0.3])
@pytest.mark.parametrize("command", ["push", "read", "serve", "mirror"])
def test_sigterm_while_a_command_starts_is_a_clean_stop(
    tmp_path: Path, command: str, delay_s: float
) -> None:
    proc = _start(_args(command, tmp_path))
    # The interpreter's own start-up (before any of our code) cannot be helped; from the
    # first instruction on, a SIGTERM is a clean stop.
    deadline = time.monotonic() + 30
    while not _catches(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.001)
    time.sleep(delay_s)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()


@pytest.mark.parametrize("command", ["push", "read", "serve", "mirror"])
def test_a_sigterm_a_launcher_held_back_is_a_clean_stop(tmp_path: Path, command: str) -> None:
    """A launcher that must stop a command at once starts it with SIGTERM blocked (it stays
    pending across exec). Before: only ``push`` let it in; the others never saw it and ran
    until SIGKILL."""

    def launcher() -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})

    proc = subprocess.Popen(
        logbroker_cmd(*_args(command, tmp_path)),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=launcher,
    )
    proc.send_signal(signal.SIGTERM)  # at once: pending until the command lets it in
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail(f"{command} never saw the SIGTERM its launcher held back")
    assert proc.returncode == 0, err.decode()


@pytest.mark.parametrize("delay_s", [0.0, 0.3, 1.0])
def test_sighup_while_the_push_client_starts_is_a_reload_not_its_end(
    tmp_path: Path, delay_s: float
) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens: the client keeps trying
    (tmp_path / "app.log").write_text("a line\n")
    state = tmp_path / "state"
    log = str(tmp_path / "app.log")
    proc = _start(["push", "--server", url, "--log-type", "app", "--state-dir", str(state), log])
    deadline = time.monotonic() + 30
    while not _catches(proc.pid, signal.SIGHUP) and time.monotonic() < deadline:
        time.sleep(0.001)
    time.sleep(delay_s)
    proc.send_signal(signal.SIGHUP)
    # still running once it has started: its status file appears, and it is alive after it
    while not (state / "status.json").exists() and time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1].decode()
        time.sleep(0.05)
    time.sleep(0.5)
    assert proc.poll() is None, proc.communicate()[1].decode()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()
    assert "SIGHUP" in err.decode()  # the reload ran (and said so)


def test_a_follower_without_reload_still_ends_on_sighup() -> None:
    """``logbroker read`` in a terminal that closes ends, as a command does."""
    proc = _start(["read", "--server", f"http://127.0.0.1:{free_port()}", "--topic", "dc1.app"])
    deadline = time.monotonic() + 30
    while not _catches(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.001)
    time.sleep(1.0)
    proc.send_signal(signal.SIGHUP)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGHUP


def test_a_command_without_a_stop_handler_dies_by_a_sigterm_that_came_early() -> None:
    code = (
        "import os, signal\n"
        "from ops import stop_signals\n"
        "stop_signals.install()\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "print('recorded', stop_signals.stop_requested(), flush=True)\n"
        "stop_signals.restore_default()\n"
        "print('survived', flush=True)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, timeout=60)
    assert done.stdout.decode().split() == ["recorded", "True"]
    assert done.returncode == -signal.SIGTERM


def test_serve_on_a_port_in_use_says_so_and_prints_no_banner(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        done = subprocess.run(
            logbroker_cmd("serve", "--data-dir", str(tmp_path / "data"), "--port", str(port)),
            cwd=REPO,
            capture_output=True,
            timeout=60,
        )
    err = done.stderr.decode()
    assert done.returncode == 2  # the user's to fix, like a taken metrics_port
    assert f"cannot listen on 127.0.0.1:{port}: it is in use" in err
    assert "gateway on" not in err


def test_serve_prints_its_banner_once_it_accepts_connections(tmp_path: Path) -> None:
    port = free_port()
    proc = subprocess.Popen(
        logbroker_cmd("serve", "--data-dir", str(tmp_path / "data"), "--port", str(port)),
        cwd=REPO,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline().decode()
        assert f"logbroker gateway on http://127.0.0.1:{port}" in line
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass  # listening when the banner said so
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0


def test_a_command_imports_only_its_own_module() -> None:
    """``logbroker read`` starts without importing the gateway (uvicorn), the push-client's
    config or the loader: the CLI loads the named command's module alone, and ``--help``
    still lists every command."""
    probe = (
        "import sys\n"
        "from ops.cli import build_parser\n"
        "parser, modules = build_parser('read')\n"
        "print(sorted(m for m in modules), 'uvicorn' in sys.modules,"
        " 'push_client.config' in sys.modules, 'sqlite_utils' in sys.modules)\n"
        "print(parser.format_help())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    assert out.splitlines()[0] == "['read'] False False False"
    assert all(f"    {name} " in out for name in ("serve", "push", "load", "bench"))
    read_help = subprocess.run(
        logbroker_cmd("read", "--help"), cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    assert "--from-beginning" in read_help
