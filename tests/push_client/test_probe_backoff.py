"""Probing what fails backs off: the waits between two probes of one failing gateway (or
installation) double up to a cap, are jittered, and start again once it answers."""

from __future__ import annotations

import io
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from push_client.backoff import ProbeSchedule
from push_client.installations import InstallationSet, InstallationSpec
from push_client.status import installation_rows, print_status
from push_client.token import BearerToken
from push_client.transport import GatewayClient, TransportStats


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _waits(schedule: ProbeSchedule, clock: _Clock, key: str, tries: int) -> list[float]:
    """The waits drawn for ``tries`` failed probes, each made when it was due."""
    waits = []
    for _ in range(tries):
        wait = schedule.failed(key)
        waits.append(wait)
        clock.now += wait
        assert schedule.due([key]) == [key]
    return waits


def test_probe_waits_double_up_to_the_cap_each_drawn_from_its_upper_half() -> None:
    clock = _Clock()
    schedule = ProbeSchedule(2.0, 60.0, clock=clock)
    for n in range(200):
        waits = _waits(schedule, clock, f"gw{n}", 9)
        ceilings = [2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0, 60.0, 60.0]
        for wait, ceiling in zip(waits, ceilings, strict=True):
            assert ceiling / 2 <= wait <= ceiling, waits
    # the jitter spreads a fleet: waits at the cap are not all the same
    capped = [_waits(schedule, clock, f"spread{n}", 7)[-1] for n in range(50)]
    assert max(capped) - min(capped) > 5.0, capped


def test_a_target_that_answers_waits_the_first_interval_again() -> None:
    clock = _Clock()
    schedule = ProbeSchedule(2.0, 60.0, clock=clock)
    assert _waits(schedule, clock, "gw", 6)[-1] >= 30.0
    schedule.answered("gw")
    assert schedule.due(["gw"]) == ["gw"]  # not known as failing: nothing holds it
    assert 1.0 <= schedule.failed("gw") <= 2.0


def test_tries_before_the_probe_is_due_restart_the_wait_without_doubling_it() -> None:
    """A request that went to the gateway anyway is a try: the probe waits a whole wait
    after it; but ten requests failing at once are one try, not ten doublings."""
    clock = _Clock()
    schedule = ProbeSchedule(2.0, 60.0, clock=clock)
    first = schedule.failed("gw")
    for _ in range(10):
        clock.now += first / 4
        assert schedule.failed("gw") == first
        assert schedule.due(["gw"]) == []
    assert schedule.until_due(["gw"], 60.0) == pytest.approx(first)
    assert schedule.until_due(["gw"], 0.5) == 0.5  # a prober wakes at least that often


def test_the_wall_clock_time_of_the_next_probe_is_the_schedules_and_holds_until_a_try() -> None:
    """The status's ``next_probe_at`` comes from the schedule (kept beside it, it was a
    second record of the same time); read again with nothing tried, it is the same value,
    so a status showing it is not rewritten every second for nothing."""
    clock, wall = _Clock(), _Clock()
    wall.now = 1_790_000_000.0
    schedule = ProbeSchedule(2.0, 60.0, clock=clock, wall_clock=wall)
    assert schedule.next_probe_at("gw") is None
    first = schedule.failed("gw")
    assert schedule.next_probe_at("gw") == wall.now + first
    clock.now += 0.5
    wall.now += 0.5
    assert schedule.next_probe_at("gw") == wall.now - 0.5 + first  # nothing tried: unchanged
    assert schedule.failed("gw") == first  # a request's try restarts the same wait
    assert schedule.next_probe_at("gw") == wall.now + first
    clock.now += first
    wall.now += first
    assert schedule.due(["gw"]) == ["gw"] and schedule.next_probe_at("gw") == wall.now
    second = schedule.failed("gw")
    assert schedule.next_probe_at("gw") == wall.now + second
    schedule.answered("gw")
    assert schedule.next_probe_at("gw") is None


def test_a_cap_below_the_first_interval_keeps_the_first_interval() -> None:
    clock = _Clock()
    schedule = ProbeSchedule(5.0, 1.0, clock=clock)
    assert all(2.5 <= w <= 5.0 for w in _waits(schedule, clock, "gw", 5))


class _Gateway:
    """A gateway on loopback whose answers a test sets; it notes when ``/readyz`` is asked."""

    def __init__(self) -> None:
        self.write_status = 200
        self.ready_status = 200
        self.failing_writes = 0
        """Writes to fail (503) before ``write_status`` applies again."""
        self.probes: list[float] = []
        gateway = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                """Silent: the test's output is its assertions, not an access log."""

            def _answer(self, status: int) -> None:
                body = b"{}"
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                if self.path == "/readyz":
                    gateway.probes.append(time.monotonic())
                    self._answer(gateway.ready_status)
                else:
                    self._answer(404)

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if gateway.failing_writes:
                    gateway.failing_writes -= 1
                    self._answer(503)
                else:
                    self._answer(gateway.write_status)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def gateways() -> Iterator[tuple[_Gateway, _Gateway]]:
    first, second = _Gateway(), _Gateway()
    yield first, second
    first.close()
    second.close()


def _wait_for(predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_failing_gateway_no_request_tries_is_probed_less_and_less_often_until_it_answers(
    gateways: tuple[_Gateway, _Gateway],
) -> None:
    """Probed every probe_interval_s for as long as it failed, a half-alive gateway had a
    fleet of clients ask it every 2 s each; now the waits double up to the cap, and start
    again from probe_interval_s once it answered."""
    half_alive, other = gateways
    half_alive.write_status = half_alive.ready_status = 503
    stop = threading.Event()
    client = GatewayClient(
        (half_alive.url, other.url),
        token=BearerToken(None, None),
        stop=stop,
        stats=TransportStats(),
        probe_interval_s=0.05,
        probe_max_interval_s=0.8,
    )
    try:
        client.post("/v1/write", b"x", "application/octet-stream")
        assert client.current_server == other.url
        started = time.monotonic()
        time.sleep(2.0)
        gaps = _backing_off([t - started for t in half_alive.probes])
        assert max(gaps) > 0.4, gaps

        (row,) = client.failing()
        assert row["server"] == half_alive.url and row["tried_by"] == "probe", row
        assert row["tried_at"] < row["next_probe_at"] <= row["tried_at"] + 0.8 + 0.01, row
        out = io.StringIO()
        doc = {
            "pid": 1,
            "running": True,
            "checked_at": time.time(),
            "changed_at": time.time(),
            "servers": [half_alive.url, other.url],
            "installations": [{"name": "default", "up": True, "failing_gateways": [row]}],
            "files": [],
        }
        print_status(doc, out)
        assert "by a probe; next probe in " in out.getvalue() or "probe due" in out.getvalue()

        half_alive.ready_status = 200
        _wait_for(lambda: not client.failing())

        # it fails again (a request went there while the other failed once): the waits
        # start again from probe_interval_s, not from where they were
        half_alive.ready_status = 503
        other.failing_writes = 1
        before = len(half_alive.probes)
        client.post("/v1/write", b"x", "application/octet-stream")
        failed_at = time.monotonic()
        assert client.current_server == other.url
        _wait_for(lambda: len(half_alive.probes) > before)
        assert half_alive.probes[before] - failed_at < 0.3, half_alive.probes[before:]
    finally:
        stop.set()
        client.close()


def _backing_off(probes: list[float]) -> list[float]:
    """Assert that probes 0.05 s apart at first, doubling up to 0.8 s, were made in 2 s; the
    gaps between them."""
    gaps = [b - a for a, b in itertools.pairwise(probes)]
    # at a fixed 0.05 s, 2 s held 20 to 40 probes; doubling to 0.8 s holds 6 to 9
    assert 4 <= len(probes) <= 12, probes
    # each wait is at least half of its step's ceiling (0.05, 0.1, ... 0.8)
    for n, gap in enumerate(gaps):
        assert gap >= min(0.8, 0.05 * 2 ** (n + 1)) / 2 - 0.01, gaps
    return gaps


def test_an_installation_that_is_down_is_probed_less_and_less_often_until_it_is_back(
    gateways: tuple[_Gateway, _Gateway],
) -> None:
    down, other = gateways
    down.ready_status = 503
    installations = InstallationSet(
        [InstallationSpec("dc1", (down.url,)), InstallationSpec("dc2", (other.url,))],
        probe_interval_s=0.05,
        probe_max_interval_s=0.8,
        wake=lambda: None,
    )
    try:
        dc1 = installations.members[0]
        installations.mark_down(dc1, f"{down.url}: ConnectError: refused")
        marked = time.monotonic()
        row = installation_rows(installations)[0]
        assert row["next_probe_at"] is not None and row["next_probe_at"] > time.time(), row
        time.sleep(2.0)
        _backing_off([t - marked for t in down.probes])
        assert not dc1.up
        down.ready_status = 200
        _wait_for(lambda: dc1.up)
        assert installation_rows(installations)[0]["next_probe_at"] is None
    finally:
        installations.close()
