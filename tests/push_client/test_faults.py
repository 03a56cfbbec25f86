"""Crashes and outages: SIGKILL of the client and of the gateway, gateways down and failing
over, memory while the gateway is away.  Each run checks every line arrived exactly once."""

from __future__ import annotations

import json
import random
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, logbroker_cmd
from tests.metrics_text import sample, samples
from tests.push_client.conftest import (
    BackgroundWriter,
    LineWriter,
    assert_exactly_once,
    read_delivered,
    wait_for_lines,
)

pytestmark = [pytest.mark.slow, pytest.mark.fault]


def _total(data_dir: Path) -> int:
    return read_delivered(data_dir, "app").count()


def test_client_killed_at_twenty_random_points_ships_every_line_once(
    tmp_path: Path, gateway, start_push
) -> None:
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    logs = tmp_path / "logs"
    logs.mkdir()
    path = logs / "app.log"
    state = tmp_path / "state"
    writer = LineWriter("k")
    writer.append(path, 500)
    rotations = 0
    with BackgroundWriter(path, writer) as background:
        for kill in range(20):
            push = start_push(gateway.url, state, logs / "*.log").wait_started(state)
            time.sleep(rng.uniform(0.0, 1.2))
            if kill % 4 == 3:
                # A rotation while the client runs (at most one per client life: a file both
                # created and rotated away while no client runs is never seen by any).
                rotations += 1
                background.rotate(f"app.log.{rotations}")
                time.sleep(rng.uniform(0.0, 0.3))
            push.kill()
    final = start_push(gateway.url, state, logs / "*.log")
    wait_for_lines(gateway.data_dir, "app", len(writer.ids), timeout_s=60)
    time.sleep(1.0)
    assert final.stop() == 0, final.log()
    delivered = read_delivered(gateway.data_dir, "app")
    assert_exactly_once(delivered, writer), f"seed {seed}"
    assert len(delivered.lines) == rotations + 1


def test_gateway_killed_mid_stream_loses_and_repeats_nothing(
    tmp_path: Path, gateway, start_push
) -> None:
    path = tmp_path / "app.log"
    writer = LineWriter("g")
    writer.append(path, 1_000)
    push = start_push(gateway.url, tmp_path / "state", path)
    wait_for_lines(gateway.data_dir, "app", 1_000)
    with BackgroundWriter(path, writer, lines_per_tick=200):
        for _ in range(3):
            time.sleep(0.7)
            gateway.kill()
            time.sleep(0.5)
            gateway.start()  # the same port: the client's --server URL is still right
        time.sleep(0.5)
    wait_for_lines(gateway.data_dir, "app", len(writer.ids), timeout_s=60)
    time.sleep(0.5)
    assert push.stop() == 0
    assert_exactly_once(read_delivered(gateway.data_dir, "app"), writer)


def test_gateway_down_for_seconds_then_back_resumes_without_loss(
    tmp_path: Path, gateway, start_push
) -> None:
    # The scenario says 30 s; 6 s exercises the same backoff and resumption path
    # (several retries at the capped backoff) and keeps the suite fast.
    path = tmp_path / "app.log"
    writer = LineWriter("d")
    writer.append(path, 1_000)
    state = tmp_path / "state"
    push = start_push(gateway.url, state, path)
    wait_for_lines(gateway.data_dir, "app", 1_000)
    gateway.stop()
    for _ in range(12):
        writer.append(path, 500)
        time.sleep(0.5)
    status = (state / "status.json").read_text()
    assert "ConnectError" in status or "Connect" in status
    gateway.start()
    wait_for_lines(gateway.data_dir, "app", len(writer.ids), timeout_s=60)
    time.sleep(1.5)  # a status written since
    # Recovered: the error is history.  --status kept printing it as "last error" (and
    # status.json kept it) until another error replaced it, however long the gateway had
    # been answering.
    shown = _push_status(state)
    assert "last error" not in shown and "GATEWAY FAILING" not in shown, shown
    assert f"no gateway fails: {gateway.url} answers again since " in shown, shown
    doc = json.loads((state / "status.json").read_bytes())
    assert doc["last_error"] == "" and doc["last_recovery"]["server"] == gateway.url, doc
    assert doc["installations"][0]["failing_gateways"] == [], doc
    metrics = (state / "metrics.prom").read_text()
    assert not [k for k in samples(metrics) if k[0] == "logbroker_push_gateway_failing"]
    assert push.stop() == 0
    assert_exactly_once(read_delivered(gateway.data_dir, "app"), writer)
    # The outage is said when it starts (again only if the failure changes: a reset
    # connection, then refused ones) and when it ends, not at every retry of every request.
    text = push.log()
    said = text.count("request failed, retrying")
    assert 1 <= said <= 3, text
    assert text.count(f"{gateway.url} answers again, after ") == 1, text


def test_two_servers_with_one_dying_fails_over_without_loss(
    tmp_path: Path, start_gateway, start_push
) -> None:
    data = tmp_path / "data"
    first = start_gateway(data)
    second = start_gateway(data)
    path = tmp_path / "app.log"
    writer = LineWriter("f")
    writer.append(path, 1_000)
    push = start_push(f"{first.url},{second.url}", tmp_path / "state", path)
    wait_for_lines(data, "app", 1_000)
    with BackgroundWriter(path, writer, lines_per_tick=200):
        time.sleep(1.0)
        first.kill()
        time.sleep(2.0)
    wait_for_lines(data, "app", len(writer.ids), timeout_s=60)
    time.sleep(1.5)  # a status written since
    # The dead gateway is not tried again while the other answers: --status and the metrics
    # name it (it was only an old "last error" line, an operator could not tell it was down).
    status = _push_status(tmp_path / "state")
    assert f"GATEWAY FAILING {first.url} since " in status, status
    assert "not in use while another gateway of it answers" in status, status
    assert f"GATEWAY FAILING {second.url}" not in status, status
    metrics = (tmp_path / "state" / "metrics.prom").read_text()
    failing = [
        s for (name, _), s in samples(metrics).items() if name == "logbroker_push_gateway_failing"
    ]
    assert failing == [1.0], metrics
    assert push.stop() == 0
    assert_exactly_once(read_delivered(data, "app"), writer)
    assert "now sending to " + second.url in push.log()


def test_a_gateway_left_after_it_failed_is_shown_answering_once_it_is_back(
    tmp_path: Path, start_gateway, start_push
) -> None:
    """A gateway the client moved away from is never sent to again while the other answers,
    so it stayed "failing" in --status, status.json and the metrics for good, long after it
    was back: an alert on it could never clear.  It is probed (waits growing from
    ``probe_interval_s``) while no request tries it, and the status says when it was last
    tried and when it is next."""
    data = tmp_path / "data"
    first = start_gateway(data)
    second = start_gateway(data)
    path = tmp_path / "app.log"
    writer = LineWriter("p")
    writer.append(path, 200)
    state = tmp_path / "state"
    # Probes back off from 0.5 s; capped at 2 s, the restarted gateway is seen within the
    # deadline below however long it took to start (at the default 60 s it might not be).
    extra = ["--probe-interval", "0.5", "--probe-max-interval", "2"]
    push = start_push(f"{first.url},{second.url}", state, path, extra=extra)
    wait_for_lines(data, "app", 200)
    first.kill()
    writer.append(path, 200)
    wait_for_lines(data, "app", 400)
    time.sleep(2.0)  # probed meanwhile, and a status written since
    status = _push_status(state)
    assert f"GATEWAY FAILING {first.url} since " in status, status
    assert re.search(
        r"by a probe; (next probe in [0-9.]+ s|probe due); not in use while another gateway "
        "of it answers",
        status,
    ), status
    first.start()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        doc = json.loads((state / "status.json").read_bytes())
        if not doc["installations"][0]["failing_gateways"]:
            break
        time.sleep(0.2)
    assert doc["installations"][0]["failing_gateways"] == [], doc
    assert doc["last_error"] == "", doc
    time.sleep(1.2)  # the metrics are written with the status
    metrics = (state / "metrics.prom").read_text()
    assert not [k for k in samples(metrics) if k[0] == "logbroker_push_gateway_failing"]
    assert "GATEWAY FAILING" not in _push_status(state)
    writer.append(path, 100)
    wait_for_lines(data, "app", 500)
    assert push.stop() == 0
    assert_exactly_once(read_delivered(data, "app"), writer)
    text = push.log()
    said = [line for line in text.splitlines() if f"{first.url} answers again, after " in line]
    assert len(said) == 1 and said[0].endswith("; a probe saw it)"), text
    # Probing does not move the client back: the gateway it writes to answers.
    assert f"now sending to {first.url}" not in text, text


def _push_status(state: Path) -> str:
    out = subprocess.run(
        logbroker_cmd("push", "--status", "--state-dir", str(state)),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_absent_gateway_adds_lag_not_memory(tmp_path: Path, gateway, start_push) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    writers = [LineWriter(f"m{i}", pad=180) for i in range(5)]
    for i, w in enumerate(writers):
        w.append(logs / f"{i}.log", 10)
    push = start_push(
        gateway.url, tmp_path / "state", logs / "*.log", extra=["--memory-bytes", "33554432"]
    )
    wait_for_lines(gateway.data_dir, "app", 50)
    gateway.kill()
    for _ in range(5):  # 5 files x 5 x 40,000 lines x ~200 bytes: about 200 MB of backlog
        for i, w in enumerate(writers):
            w.append(logs / f"{i}.log", 40_000)
    time.sleep(3.0)
    rss = _rss_bytes(push.proc.pid)
    assert rss < 160 * 1024 * 1024, f"client holds {rss / 1e6:.0f} MB with the gateway away"
    gateway.start()
    total = sum(len(w.ids) for w in writers)
    wait_for_lines(gateway.data_dir, "app", total, timeout_s=90)
    assert push.stop() == 0
    assert_exactly_once(read_delivered(gateway.data_dir, "app"), *writers)


def test_sigterm_with_a_hung_gateway_exits_in_time_and_loses_nothing(
    tmp_path: Path, gateway, start_push
) -> None:
    path = tmp_path / "app.log"
    writer = LineWriter("h")
    writer.append(path, 1_000)
    state = tmp_path / "state"
    push = start_push(gateway.url, state, path)
    wait_for_lines(gateway.data_dir, "app", 1_000)
    gateway.proc.send_signal(signal.SIGSTOP)  # accepts connections, never answers
    try:
        writer.append(path, 1_000)
        time.sleep(1.0)
        started = time.monotonic()
        assert push.stop() == 0
        # --shutdown-timeout 5: the client gives up on the hung request, not on the data.
        assert time.monotonic() - started < 9
    finally:
        gateway.proc.send_signal(signal.SIGCONT)
    second = start_push(gateway.url, state, path).wait_started(state)
    wait_for_lines(gateway.data_dir, "app", 2_000)
    time.sleep(0.5)
    assert second.stop() == 0
    assert_exactly_once(read_delivered(gateway.data_dir, "app"), writer)


def test_two_clients_shipping_one_file_fence_each_other_and_write_each_line_once(
    tmp_path: Path, gateway, start_push
) -> None:
    # A misconfiguration (two state dirs, one file) and, in small, what a restart does to a
    # request of the killed incarnation still in flight: the newer session fences the older.
    path = tmp_path / "app.log"
    writer = LineWriter("two")
    writer.append(path, 1_000)
    first = start_push(gateway.url, tmp_path / "state-1", path)
    wait_for_lines(gateway.data_dir, "app", 1_000)
    with BackgroundWriter(path, writer, lines_per_tick=100):
        second = start_push(gateway.url, tmp_path / "state-2", path)
        # The file grows until one client's write meets the other's newer session (however
        # long a loaded machine takes to start the second).
        deadline = time.monotonic() + 120
        while "the gateway holds another session" not in first.log() + second.log():
            assert time.monotonic() < deadline, "neither client was fenced within 120 s"
            time.sleep(0.2)
        # they go on fencing each other, each resuming where the other left off
        deadline = time.monotonic() + 60
        while _fenced(tmp_path / "state-1") + _fenced(tmp_path / "state-2") < 10:
            assert time.monotonic() < deadline, "the clients stopped fencing each other"
            time.sleep(0.2)
    wait_for_lines(gateway.data_dir, "app", len(writer.ids), timeout_s=60)
    time.sleep(1.0)
    assert first.stop() == 0
    assert second.stop() == 0
    assert_exactly_once(read_delivered(gateway.data_dir, "app"), writer)
    assert "the gateway holds another session" in first.log() + second.log()
    # said once per client within a minute, not at each of the fences (dozens a second)
    for push in (first, second):
        text = push.log_path.read_text()
        assert text.count("were fenced") <= 1, text[-3000:]


def _fenced(state: Path) -> float:
    """The client's ``logbroker_push_fenced_total`` as its state dir's metrics file says."""
    try:
        text = (state / "metrics.prom").read_text()
    except FileNotFoundError:
        return 0
    return sample(text, "logbroker_push_fenced_total") or 0
