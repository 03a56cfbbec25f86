"""One file the gateway refuses is parked; the other files of the host keep shipping."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, logbroker_cmd
from tests.metrics_text import sample, samples
from tests.push_client.conftest import (
    FAST_FLAGS,
    LineWriter,
    PushProcess,
    assert_exactly_once,
    read_delivered,
    wait_for_lines,
)

pytestmark = pytest.mark.slow

GATEWAY_CONFIG = """
[limits]
max_chunk_bytes = 65536

[tokens.app-only]
write = ["app"]

[tokens.app-and-secret]
write = ["app", "secret"]
"""


def _gateway_and_logs(tmp_path: Path, start_gateway) -> tuple[Any, Path]:  # type: ignore[no-untyped-def]
    """A gateway with the tokens above, and an empty directory for the logs."""
    config = tmp_path / "gateway.toml"
    config.write_text(GATEWAY_CONFIG)
    gateway = start_gateway(tmp_path / "data", "--config", str(config))
    logs = tmp_path / "logs"
    logs.mkdir()
    return gateway, logs


def _wait_for(predicate, timeout_s: float = 30.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def test_a_refused_file_is_parked_the_others_ship_and_a_new_token_ships_it_once(
    tmp_path: Path, start_gateway
) -> None:
    gateway, logs = _gateway_and_logs(tmp_path, start_gateway)
    app = [LineWriter(f"a{i:02d}") for i in range(49)]
    for i, writer in enumerate(app):
        writer.append(logs / f"f{i:02d}.log", 200)
    secret = LineWriter("secret")
    secret.append(logs / "secret.log", 200)
    # a 51st file, one line over the gateway's chunk limit: refused when written, not opened
    (logs / "huge.log").write_bytes(b"h" * 100_000 + b"\n")
    token = tmp_path / "token"
    token.write_text("app-only\n")
    token.chmod(0o600)  # one others may read is refused
    state = tmp_path / "state"
    push_config = tmp_path / "push.toml"
    push_config.write_text(
        f"""
[push]
servers = ["{gateway.url}"]
state_dir = "{state}"
token_file = "{token}"
park_retry_s = 600

[[entry]]
path = "{logs}/f*.log"
log_type = "app"

[[entry]]
path = "{logs}/huge.log"
log_type = "app"

[[entry]]
path = "{logs}/secret.log"
log_type = "secret"
"""
    )
    push = PushProcess(["--config", str(push_config), *FAST_FLAGS], tmp_path / "push.log")
    push.start()
    try:
        push.wait_started(state)
        started = time.monotonic()
        wait_for_lines(gateway.data_dir, "app", 49 * 200, timeout_s=30)
        # the 49 others are complete and on time, though two files of their requests are refused
        assert time.monotonic() - started < 30
        for i, writer in enumerate(app):
            writer.append(logs / f"f{i:02d}.log", 50)
        secret.append(logs / "secret.log", 50)
        delivered = wait_for_lines(gateway.data_dir, "app", 49 * 250, timeout_s=30)
        assert_exactly_once(delivered, *app)
        assert read_delivered(gateway.data_dir, "secret").count() == 0

        def parked_in_status() -> bool:
            out = subprocess.run(
                logbroker_cmd("push", "--status", "--state-dir", str(state)),
                capture_output=True,
                text=True,
                cwd=REPO,
                timeout=30,
            ).stdout
            return (
                f"PARKED {logs}/secret.log" in out
                and "HTTP 403 forbidden" in out
                and f"PARKED {logs}/huge.log" in out
                and "HTTP 413 chunk_too_large" in out
            )

        assert _wait_for(parked_in_status)
        metrics = (state / "metrics.prom").read_text()
        assert sample(metrics, "logbroker_push_parked_files") == 2
        parked = {
            (dict(labels)["file"], dict(labels)["error"]): value
            for (name, labels), value in samples(metrics).items()
            if name == "logbroker_push_file_parked"
        }
        assert parked[(f"{logs}/secret.log", "forbidden")] == 1
        assert "files parked, not shipping" in push.log()

        token.write_text("app-and-secret\n")  # the operator fixes the token
        shipped = wait_for_lines(gateway.data_dir, "secret", 250, timeout_s=30)
        assert_exactly_once(shipped, secret)
        assert push.stop() == 0
    finally:
        push.kill()
    assert_exactly_once(read_delivered(gateway.data_dir, "secret"), secret)
    assert_exactly_once(read_delivered(gateway.data_dir, "app"), *app)


def test_sighup_reloads_the_config_and_a_file_parked_under_its_old_entry_ships_once(
    tmp_path: Path, start_gateway
) -> None:
    gateway, logs = _gateway_and_logs(tmp_path, start_gateway)
    writer = LineWriter("moved")
    writer.append(logs / "audit.log", 300)
    other = LineWriter("other")
    other.append(logs / "other.log", 100)
    state = tmp_path / "state"
    push_config = tmp_path / "push.toml"

    def write_config(audit_log_type: str, broken: bool = False) -> None:
        push_config.write_text(
            f"""
[push]
servers = ["{gateway.url}"]
state_dir = "{state}"
token = "app-only"
park_retry_s = 600
{"chunk_bytes = 'lots'" if broken else ""}

[[entry]]
path = "{logs}/other.log"
log_type = "app"

[[entry]]
path = "{logs}/audit.log"
log_type = "{audit_log_type}"
"""
        )

    write_config("secret")
    push = PushProcess(["--config", str(push_config), *FAST_FLAGS], tmp_path / "push.log")
    push.start()
    try:
        push.wait_started(state)
        wait_for_lines(gateway.data_dir, "app", 100)
        assert _wait_for(lambda: "parked" in push.log())
        assert push.proc is not None
        write_config("app", broken=True)
        push.proc.send_signal(signal.SIGHUP)
        assert _wait_for(lambda: "the configuration is invalid" in push.log())
        write_config("app")
        push.proc.send_signal(signal.SIGHUP)
        delivered = wait_for_lines(gateway.data_dir, "app", 400)
        assert push.stop() == 0
    finally:
        push.kill()
    assert_exactly_once(delivered, writer, other)
    assert read_delivered(gateway.data_dir, "secret").count() == 0


def test_idle_exit_with_a_file_parked_exits_1_and_names_it(tmp_path: Path, start_gateway) -> None:
    """A one-shot push (``--idle-exit``) whose token cannot write one file's topic ships the
    others and exits with status 1 naming the file, not 0 as if all had been shipped."""
    gateway, logs = _gateway_and_logs(tmp_path, start_gateway)
    app = LineWriter("app")
    app.append(logs / "app.log", 300)
    secret = LineWriter("secret")
    secret.append(logs / "secret.log", 300)
    token = tmp_path / "token"
    token.write_text("app-only\n")
    token.chmod(0o600)  # one others may read is refused
    push_config = tmp_path / "push.toml"
    push_config.write_text(
        f"""
[push]
servers = ["{gateway.url}"]
state_dir = "{tmp_path / "state"}"
token_file = "{token}"

[[entry]]
path = "{logs}/app.log"
log_type = "app"

[[entry]]
path = "{logs}/secret.log"
log_type = "secret"
"""
    )

    def push_once() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            logbroker_cmd("push", "--config", str(push_config), *FAST_FLAGS, "--idle-exit", "1"),
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=120,
        )

    done = push_once()
    assert done.returncode == 1, done.stderr[-2000:]
    assert f"{logs}/secret.log was not shipped: parked" in done.stderr
    assert "HTTP 403 forbidden" in done.stderr
    assert "of 2 files found, 1 shipped, 1 parked (refused by the gateway)" in done.stderr
    assert "everything acknowledged" not in done.stderr
    assert_exactly_once(read_delivered(gateway.data_dir, "app"), app)
    assert read_delivered(gateway.data_dir, "secret").count() == 0

    token.write_text("app-and-secret\n")  # fixed, the same command ships the rest and exits 0
    done = push_once()
    assert done.returncode == 0, done.stderr[-2000:]
    assert_exactly_once(read_delivered(gateway.data_dir, "secret"), secret)
    assert_exactly_once(read_delivered(gateway.data_dir, "app"), app)


def test_a_file_the_gateway_cannot_take_yet_is_asked_for_with_backoff_and_named(
    tmp_path: Path, start_gateway
) -> None:
    """A session refused with a 429 inside the batch answer (``limit_reached``: the partition
    holds as many sources as it may) is not a parking matter, it may pass. The client asked
    again at once, hundreds of times a second, forever, and said nothing at all."""
    config = tmp_path / "gateway.toml"
    config.write_text("[limits]\nmax_sources_per_partition = 2\n")
    gateway = start_gateway(tmp_path / "data", "--partitions", "1", "--config", str(config))
    logs = tmp_path / "logs"
    logs.mkdir()
    writers = [LineWriter(f"lim{i}") for i in range(3)]
    for i, writer in enumerate(writers):
        writer.append(logs / f"{i}.log", 10)
    state = tmp_path / "state"
    push = PushProcess(
        [
            "--server",
            gateway.url,
            "--log-type",
            "app",
            "--state-dir",
            str(state),
            *FAST_FLAGS,
            str(logs / "*.log"),
        ],
        tmp_path / "push.log",
    ).start()
    try:
        push.wait_started(state)
        wait_for_lines(gateway.data_dir, "app", 20)
        time.sleep(5)
        metrics = (state / "metrics.prom").read_text()
        requests = sum(
            value
            for (name, _), value in samples(metrics).items()
            if name == "logbroker_push_requests_total"
        )
        assert requests < 100, f"{requests} requests in about 6 s"
        assert push.log().count("limit_reached") == 1, push.log()
        status = subprocess.run(
            logbroker_cmd("push", "--status", "--state-dir", str(state)),
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=30,
        )
        assert "RETRYING" in status.stdout and "limit_reached" in status.stdout, status.stdout
        assert push.stop() == 0
    finally:
        push.kill()
    delivered = read_delivered(gateway.data_dir, "app")
    assert delivered.count() == 20
    assert_exactly_once(delivered, *[w for w in writers if w.ids[0] in delivered.ids()])
