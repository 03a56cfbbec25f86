"""A gateway URL whose host name does not resolve: said as such (naming the host), retried
with backoff without a traceback, nothing marked shipped; the data ships once the URL is
right, and with a second installation the client fails over to it.

``.invalid`` is reserved (RFC 6761): it never resolves, and resolvers answer it at once.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from push_client.transport import failure_text
from tests.conftest import REPO, logbroker_cmd
from tests.push_client.conftest import (
    LineWriter,
    assert_exactly_once,
    read_delivered,
    wait_for_lines,
)

UNRESOLVABLE = "http://no-such-host.invalid:8080"
SAID = "NameResolutionError: cannot resolve host no-such-host.invalid"


def _status(state: Path) -> dict[str, Any]:
    try:
        doc: dict[str, Any] = json.loads((state / "status.json").read_bytes())
    except (OSError, ValueError):
        return {}
    return doc


def _wait(predicate: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _retries(state: Path) -> int:
    return sum(
        gateway["retries"]
        for installation in _status(state).get("installations", [])
        for gateway in installation["failing_gateways"]
    )


def test_a_name_resolution_failure_names_the_host_not_a_connection_error() -> None:
    """httpx says ``ConnectError: [Errno -2] Name or service not known``, as for a refused
    connection and without the host; a refused connection is still said as it was."""
    with httpx.Client(timeout=5) as http:
        with pytest.raises(httpx.ConnectError) as unresolved:
            http.get(UNRESOLVABLE + "/readyz")
        assert failure_text(unresolved.value, UNRESOLVABLE).startswith(SAID + ": ")
        with pytest.raises(httpx.ConnectError) as refused:
            http.get("http://127.0.0.1:9/readyz")
        assert failure_text(refused.value, "http://127.0.0.1:9").startswith("ConnectError: ")


def test_an_unresolvable_gateway_is_retried_said_once_and_ships_nothing_until_the_url_is_right(
    tmp_path: Path, start_gateway, start_push
) -> None:
    path = tmp_path / "app.log"
    writer = LineWriter("d")
    writer.append(path, 200)
    state = tmp_path / "state"
    push = start_push(UNRESOLVABLE, state, path).wait_started(state)
    _wait(lambda: _retries(state) >= 3, "three retries")
    first = _retries(state)
    _wait(lambda: _retries(state) > first, "the client to keep retrying")
    assert push.proc is not None and push.proc.poll() is None, push.log()
    status = _status(state)
    assert SAID in status["last_error"], status["last_error"]
    (gateway,) = status["installations"][0]["failing_gateways"]
    assert gateway["error"] == "NameResolutionError", gateway
    assert [f["acked"] for f in status["files"]] == [0], status["files"]
    printed = subprocess.run(
        logbroker_cmd("push", "--status", "--state-dir", str(state)),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=30,
    ).stdout
    assert SAID in printed, printed
    assert push.stop() == 0, push.log()
    log = push.log()
    assert "Traceback" not in log, log
    # said once when it starts failing, not at every retry
    assert log.count(f"request failed, retrying: {UNRESOLVABLE}: {SAID}") == 1, log
    saved = json.loads((state / "state.json").read_bytes().split(b"\nsha256:")[0])
    assert all(source["acked"] == 0 for source in saved["sources"]), saved

    # The URL is corrected: the same state dir ships every line once.
    real = start_gateway(tmp_path / "data")
    again = start_push(real.url, state, path).wait_started(state)
    writer.append(path, 100)
    wait_for_lines(real.data_dir, "app", 300)
    time.sleep(0.3)
    assert again.stop() == 0, again.log()
    assert_exactly_once(read_delivered(real.data_dir, "app"), writer)


def test_an_installation_whose_host_does_not_resolve_is_left_for_the_next(
    tmp_path: Path, start_gateway, start_push
) -> None:
    dc2 = start_gateway(tmp_path / "data-dc2", "--dc", "dc2")
    path = tmp_path / "app.log"
    writer = LineWriter("f")
    writer.append(path, 200)
    state = tmp_path / "state"
    flags = ["--failover-after", "0.5", "--position-wait", "0.5", "--probe-interval", "0.3"]
    push = start_push(
        f"dc1={UNRESOLVABLE}", state, path, extra=["--server", f"dc2={dc2.url}", *flags]
    ).wait_started(state)
    _wait(lambda: read_delivered(dc2.data_dir, "app", "dc2").count() >= 200, "the file in dc2")

    def dc1() -> dict[str, Any]:
        return next(i for i in _status(state).get("installations", []) if i["name"] == "dc1")

    _wait(lambda: not dc1()["up"], "the status to show dc1 down")
    assert SAID in dc1()["last_error"], dc1()
    assert f"installation dc1 is down ({UNRESOLVABLE}: {SAID}" in push.log(), push.log()
    writer.append(path, 100)
    _wait(lambda: read_delivered(dc2.data_dir, "app", "dc2").count() >= 300, "new lines in dc2")
    assert push.stop() == 0, push.log()
    assert "Traceback" not in push.log(), push.log()
    assert_exactly_once(read_delivered(dc2.data_dir, "app", "dc2"), writer)


def test_a_gateway_whose_host_does_not_resolve_is_passed_over_for_the_next_of_its_installation(
    tmp_path: Path, gateway, start_push
) -> None:
    path = tmp_path / "app.log"
    writer = LineWriter("g")
    writer.append(path, 200)
    state = tmp_path / "state"
    push = start_push(f"{UNRESOLVABLE},{gateway.url}", state, path).wait_started(state)
    wait_for_lines(gateway.data_dir, "app", 200)

    def failing() -> list[dict[str, Any]]:
        return [g for i in _status(state).get("installations", []) for g in i["failing_gateways"]]

    # the status is written every second: the first to name it may still show it current
    _wait(
        lambda: [not g["current"] for g in failing()] == [True],
        "the status to name the failing gateway, passed over",
    )
    (row,) = failing()
    assert row["server"] == UNRESOLVABLE and row["error"] == "NameResolutionError", row
    assert push.stop() == 0, push.log()
    assert f"now sending to {gateway.url}" in push.log(), push.log()
    assert_exactly_once(read_delivered(gateway.data_dir, "app"), writer)
