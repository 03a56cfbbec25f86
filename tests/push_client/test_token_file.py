"""The push-client's token file: refused at start when others may read it, like every
command's; not used, and said, when it becomes so while the client runs."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import time
from pathlib import Path

import pytest

from ops.token_options import read_token_file
from push_client.status import print_status
from push_client.token import BearerToken
from tests.conftest import REPO, free_port, logbroker_cmd
from tests.push_client.conftest import (
    LineWriter,
    assert_exactly_once,
    wait_for_lines,
)


def test_push_refuses_a_token_file_others_may_read_as_read_does(tmp_path: Path) -> None:
    """``logbroker read`` refused a token file of mode 644; ``push`` shipped with it."""
    token = tmp_path / "tok644"
    token.write_text("s3cr3t\n")
    token.chmod(0o644)
    (tmp_path / "app.log").write_text("a line\n")
    args = ["--server", f"http://127.0.0.1:{free_port()}", "--log-type", "app"]
    args += ["--state-dir", str(tmp_path / "state"), "--token-file", str(token)]
    done = subprocess.run(
        logbroker_cmd("push", *args, "--idle-exit", "1", str(tmp_path / "app.log")),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip() == (
        f"logbroker push: token file {token} may be read by other users (mode 644); "
        f"run: chmod 600 {token}"
    )
    assert not (tmp_path / "state").exists()  # refused before anything was started


def test_a_token_file_that_others_may_read_when_re_read_is_not_used_and_said(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="logbroker.push")
    path = tmp_path / "token"
    path.write_text("one\n")
    path.chmod(0o600)
    token = BearerToken(None, path, read_token_file)
    assert token.value == "one" and token.problem is None
    path.write_text("two\n")
    path.chmod(0o644)  # rotated by hand, with the wrong umask
    assert not token.refresh() and token.value == "one"
    assert token.problem is not None
    assert f"run: chmod 600 {path}" in token.problem["error"]
    assert token.problem["requests_go"] == "with the token read last"
    said = [r.getMessage() for r in caplog.records if "is not used" in r.getMessage()]
    assert len(said) == 1 and "may be read by other users (mode 644)" in said[0]
    assert "requests go with the token read last until it is fixed" in said[0]
    assert not token.refresh()  # said once
    assert len([r for r in caplog.records if "is not used" in r.getMessage()]) == 1
    path.chmod(0o600)  # a chmod changes neither size nor mtime: still seen
    assert token.refresh() and token.value == "two" and token.problem is None
    assert any("can be used again" in r.getMessage() for r in caplog.records)


def test_status_names_a_token_file_not_used_and_a_file_without_partition_as_dash() -> None:
    now = time.time()
    row = {
        "path": "/var/log/x.log",
        "phase": "parked",
        "acked": 0,
        "size": 10,
        "lag_bytes": 10,
        "lag_s": 1.0,
        "topic": "",
        "partition": -1,
    }
    doc = {
        "pid": 1,
        "running": True,
        "checked_at": now,
        "changed_at": now,
        "servers": ["http://gw:8080"],
        "files": [row, {**row, "path": "/var/log/y.log", "topic": "dc1.app", "partition": 3}],
        "token_problem": {
            "file": "/etc/logbroker/token",
            "error": "token file /etc/logbroker/token may be read by other users (mode 644); "
            "run: chmod 600 /etc/logbroker/token",
            "since": now,
            "requests_go": "with the token read last",
        },
    }
    out = io.StringIO()
    print_status(doc, out)
    text = out.getvalue()
    assert "TOKEN FILE NOT USED since " in text
    assert "run: chmod 600 /etc/logbroker/token (requests go with the token read last)" in text
    lines = {line.split()[0]: line for line in text.splitlines() if line.startswith("/var")}
    assert lines["/var/log/x.log"].endswith("  -"), text
    assert "/-1" not in text
    assert lines["/var/log/y.log"].endswith("  dc1.app/3")


@pytest.mark.slow
def test_a_running_client_shows_a_token_file_others_may_read_and_loses_nothing(
    tmp_path: Path, gateway, start_push
) -> None:
    token = tmp_path / "token"
    token.write_text("s3cr3t\n")
    token.chmod(0o600)
    path = tmp_path / "app.log"
    writer = LineWriter("tok")
    writer.append(path, 100)
    state = tmp_path / "state"
    push = start_push(gateway.url, state, path, extra=["--token-file", str(token)])
    push.wait_started(state)
    wait_for_lines(gateway.data_dir, "app", 100)
    token.chmod(0o644)

    def problem() -> object:
        return json.loads((state / "status.json").read_bytes()).get("token_problem")

    deadline = time.monotonic() + 15
    while problem() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert problem() is not None, push.log()
    shown = subprocess.run(
        logbroker_cmd("push", "--status", "--state-dir", str(state)),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=30,
    )
    assert "TOKEN FILE NOT USED since" in shown.stdout, shown.stdout
    assert f"run: chmod 600 {token}" in shown.stdout
    assert "the token in it is not used" in push.log()
    writer.append(path, 100)  # still shipped, with the token read last
    delivered = wait_for_lines(gateway.data_dir, "app", 200)
    token.chmod(0o600)
    deadline = time.monotonic() + 15
    while problem() is not None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert problem() is None, push.log()
    assert push.stop() == 0, push.log()
    assert_exactly_once(delivered, writer)
