"""Failover across installations (separate data dirs, separate gateways): each line lands in
exactly one of them, and new data goes back to the preferred one when it returns."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, logbroker_cmd
from tests.push_client.conftest import (
    BackgroundWriter,
    Delivered,
    LineWriter,
    assert_exactly_once_across,
    read_delivered,
)

pytestmark = [pytest.mark.slow, pytest.mark.fault]

FAILOVER_FLAGS = ["--failover-after", "1", "--probe-interval", "0.3", "--probe-max-interval", "2"]


def _both(dc1, dc2) -> tuple[Delivered, Delivered]:  # type: ignore[no-untyped-def]
    return read_delivered(dc1.data_dir, "app", "dc1"), read_delivered(dc2.data_dir, "app", "dc2")


def _wait(predicate, what: str, timeout_s: float = 40.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _audit_ok(data_dir: Path) -> None:
    result = subprocess.run(
        logbroker_cmd("audit", "--data-dir", str(data_dir)),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_installation_killed_mid_stream_fails_over_and_back_with_each_line_in_one(
    tmp_path: Path, start_gateway, start_push
) -> None:
    dc1 = start_gateway(tmp_path / "data-dc1", "--dc", "dc1")
    dc2 = start_gateway(tmp_path / "data-dc2", "--dc", "dc2")
    path = tmp_path / "app.log"
    writer = LineWriter("x")
    writer.append(path, 500)
    state = tmp_path / "state"
    servers = f"dc1={dc1.url}"
    push = start_push(
        servers, state, path, extra=["--server", f"dc2={dc2.url}", *FAILOVER_FLAGS]
    ).wait_started(state)
    with BackgroundWriter(path, writer, lines_per_tick=20):
        _wait(lambda: _both(dc1, dc2)[0].count() > 2_000, "lines in dc1")
        dc1.kill()  # mid-stream: requests in flight, their answers lost
        _wait(lambda: _both(dc1, dc2)[1].count() > 2_000, "lines in dc2 after the failover")
        dc1.start()  # the same data dir and port: the preferred installation is back
        in_dc1 = _both(dc1, dc2)[0].count()
        _wait(lambda: _both(dc1, dc2)[0].count() > in_dc1 + 2_000, "new lines in dc1 again")
    _wait(lambda: sum(d.count() for d in _both(dc1, dc2)) >= len(writer.ids), "every line")
    assert push.stop() == 0, push.log()
    first, second = _both(dc1, dc2)
    assert_exactly_once_across([first, second], writer)
    # dc2 took over from where dc1 had acknowledged, and dc1 from where dc2 had
    assert second.handovers and first.handovers, (first.handovers, second.handovers)
    _audit_ok(dc1.data_dir)
    _audit_ok(dc2.data_dir)


def test_lost_state_and_a_down_installation_wait_for_its_position_then_ship_once(
    tmp_path: Path, start_gateway, start_push
) -> None:
    dc1 = start_gateway(tmp_path / "data-dc1", "--dc", "dc1")
    dc2 = start_gateway(tmp_path / "data-dc2", "--dc", "dc2")
    path = tmp_path / "app.log"
    writer = LineWriter("s")
    writer.append(path, 1_000)
    state = tmp_path / "state"
    extra = ["--server", f"dc2={dc2.url}", *FAILOVER_FLAGS]
    push = start_push(f"dc1={dc1.url}", state, path, extra=extra).wait_started(state)
    _wait(lambda: _both(dc1, dc2)[0].count() == 1_000, "the file in dc1")
    push.kill()
    shutil.rmtree(state)  # the client's positions are lost ...
    dc1.kill()  # ... and so, for now, is the installation that holds them
    writer.append(path, 500)
    again = start_push(f"dc1={dc1.url}", state, path, extra=extra).wait_started(state)

    def waiting() -> bool:
        out = subprocess.run(
            logbroker_cmd("push", "--status", "--state-dir", str(state)),
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=30,
        ).stdout
        return f"WAITING {path}: for dc1" in out

    _wait(waiting, "the client to wait for dc1's position")
    assert _both(dc1, dc2)[1].count() == 0, "shipped before knowing what dc1 holds"
    dc1.start()
    _wait(lambda: sum(d.count() for d in _both(dc1, dc2)) >= 1_500, "every line")
    assert again.stop() == 0, again.log()
    assert_exactly_once_across(list(_both(dc1, dc2)), writer)


def test_a_frozen_installation_is_left_after_request_timeout_s(
    tmp_path: Path, start_gateway, start_push
) -> None:
    """A gateway that takes connections and never answers fails a request only when it times
    out: with ``--request-timeout 2`` the client leaves it within seconds, not after the 60 s
    default.  (What the frozen one may have written decides nothing here: its positions are
    waited for ``--position-wait`` 1 s, then given up.)"""
    frozen = socket.socket()
    frozen.bind(("127.0.0.1", 0))
    frozen.listen(64)  # the kernel completes the handshakes; nobody ever reads or answers
    dc2 = start_gateway(tmp_path / "data-dc2", "--dc", "dc2")
    path = tmp_path / "app.log"
    writer = LineWriter("f")
    writer.append(path, 200)
    state = tmp_path / "state"
    push = start_push(
        f"dc1=http://127.0.0.1:{frozen.getsockname()[1]}",
        state,
        path,
        extra=[
            *("--server", f"dc2={dc2.url}", "--request-timeout", "2", "--position-wait", "1"),
            *FAILOVER_FLAGS,
        ],
    )
    try:
        push.wait_started(state)
        started = time.monotonic()
        _wait(lambda: read_delivered(dc2.data_dir, "app", "dc2").count() == 200, "dc2", 40)
        assert time.monotonic() - started < 30, push.log()
        assert "installation dc1 is down" in push.log()
    finally:
        push.kill()
        frozen.close()
    assert_exactly_once_across([read_delivered(dc2.data_dir, "app", "dc2")], writer)


@pytest.mark.parametrize(
    ("value", "named"),
    [("64000", "'64000'"), (640.5, "640.5")],
    ids=["offset-string", "offset-float"],
)
def test_a_state_file_with_an_offset_of_the_wrong_type_is_lost_state_not_trusted(
    tmp_path: Path, start_gateway, start_push, value: object, named: str
) -> None:
    """With several installations the state's positions are trusted (no gateway knows where
    a file went): an offset read back as a string or a float was taken as it was, and
    the client crashed, or sent seqnos that are not byte offsets.  Such a file is corrupt:
    set aside with the field named, and every installation is asked instead (the
    lost-state path), so each line still lands once."""
    dc1 = start_gateway(tmp_path / "data-dc1", "--dc", "dc1")
    dc2 = start_gateway(tmp_path / "data-dc2", "--dc", "dc2")
    path = tmp_path / "app.log"
    writer = LineWriter("t")
    writer.append(path, 1_000)
    state = tmp_path / "state"
    extra = ["--server", f"dc2={dc2.url}", *FAILOVER_FLAGS]
    push = start_push(f"dc1={dc1.url}", state, path, extra=extra).wait_started(state)
    _wait(lambda: _both(dc1, dc2)[0].count() == 1_000, "the file in dc1")
    assert push.stop() == 0, push.log()
    body = (state / "state.json").read_bytes().split(b"\nsha256:")[0]
    payload = json.loads(body)
    payload["sources"][0]["acked"] = value
    body = json.dumps(payload).encode()
    digest = hashlib.sha256(body).hexdigest().encode()
    (state / "state.json").write_bytes(body + b"\nsha256:" + digest + b"\n")
    writer.append(path, 500)
    again = start_push(f"dc1={dc1.url}", state, path, extra=extra).wait_started(state)
    _wait(lambda: sum(d.count() for d in _both(dc1, dc2)) >= 1_500, "every line", 20)
    time.sleep(0.5)
    assert again.stop() == 0, again.log()
    assert_exactly_once_across(list(_both(dc1, dc2)), writer)
    assert list(state.glob("state.json.corrupt-*")), "the wrong file was not set aside"
    assert f"sources[0].acked must be a non-negative integer, not {named}" in again.log()


def _log_time(line: str) -> float:
    stamp = line[:23]  # 2026-11-26 13:16:23,363
    clock = time.strptime(stamp[:19], "%Y-%m-%d %H:%M:%S")
    return time.mktime(clock) + int(stamp[20:23]) / 1000


def test_a_dead_installation_is_left_failover_after_s_after_it_failed_not_a_backoff_later(
    tmp_path: Path, start_gateway, start_push
) -> None:
    """The docs say an installation failing for ``failover_after_s`` is left for the next; a
    request asleep in its backoff (up to ``max_backoff_s``, 5 s) noticed only when it woke,
    so with the default 5 s a dead DC was left after 6 to 10 s, its lines waiting."""
    dc1 = start_gateway(tmp_path / "data-dc1", "--dc", "dc1")
    dc2 = start_gateway(tmp_path / "data-dc2", "--dc", "dc2")
    path = tmp_path / "app.log"
    writer = LineWriter("t")
    writer.append(path, 100)
    state = tmp_path / "state"
    extra = ["--server", f"dc2={dc2.url}", "--failover-after", "3", "--probe-interval", "0.3"]
    push = start_push(f"dc1={dc1.url}", state, path, extra=extra).wait_started(state)
    _wait(lambda: _both(dc1, dc2)[0].count() == 100, "the file in dc1")
    with BackgroundWriter(path, writer, lines_per_tick=5):
        dc1.kill()
        _wait(lambda: "installation dc1 is down" in push.log(), "dc1 to be left", 20)
    assert push.stop() == 0, push.log()
    lines = (tmp_path / "push-0.log").read_text().splitlines()
    failed = next(line for line in lines if f"request failed, retrying: {dc1.url}" in line)
    down = next(line for line in lines if "installation dc1 is down" in line)
    took = _log_time(down) - _log_time(failed)
    assert 2.9 <= took <= 3.8, f"dc1 was left {took:.2f} s after it failed"
    # what was in flight to dc1 is in doubt until it is back: then every line is in one
    dc1.start()
    again = start_push(f"dc1={dc1.url}", state, path, extra=extra).wait_started(state)
    _wait(lambda: sum(d.count() for d in _both(dc1, dc2)) >= len(writer.ids), "every line")
    assert again.stop() == 0, again.log()
    assert_exactly_once_across(list(_both(dc1, dc2)), writer)


def test_bytes_in_doubt_at_an_installation_removed_for_good_are_said_to_be_lost(
    tmp_path: Path, start_gateway, start_push
) -> None:
    """docs/push-client.md: bytes in flight to an installation that never comes back stay in
    doubt, and "after a restart with that installation removed from servers, the client logs
    them as possibly lost". With the one installation left alone in the servers (the usual
    way to remove one of two) they were forgotten without a word."""
    dc1 = start_gateway(tmp_path / "data-dc1", "--dc", "dc1")
    dc2 = start_gateway(tmp_path / "data-dc2", "--dc", "dc2")
    path = tmp_path / "app.log"
    writer = LineWriter("d")
    writer.append(path, 100)
    state = tmp_path / "state"
    extra = ["--server", f"dc2={dc2.url}", "--request-timeout", "2", *FAILOVER_FLAGS]
    push = start_push(f"dc1={dc1.url}", state, path, extra=extra).wait_started(state)
    _wait(lambda: _both(dc1, dc2)[0].count() == 100, "the file in dc1")
    assert dc1.proc is not None
    os.killpg(dc1.proc.pid, signal.SIGSTOP)  # frozen: what is sent to it is never answered
    writer.append(path, 100)  # sent to dc1, never answered: in doubt; the file goes to dc2
    _wait(lambda: "handed over from dc1 to dc2" in push.log(), "the failover to dc2", 30)
    dc1.kill()  # and gone for good
    assert push.stop() == 0, push.log()
    status = json.loads((state / "status.json").read_text())
    (row,) = status["files"]
    assert row.get("doubts"), status  # the 100 lines sent to dc1 before it froze
    again = start_push(f"dc2={dc2.url}", state, path).wait_started(state)
    _wait(lambda: "may be lost" in again.log(), "the bytes in doubt to be said lost", 15)
    assert "which is no longer configured: they may be lost" in again.log()
    assert "in flight to installation dc1" in again.log()
    assert again.stop() == 0, again.log()
