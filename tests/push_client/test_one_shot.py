"""One-shot runs (``--idle-exit``): they end, and their exit status says what was not shipped.

A cron job or a CI step must not hang for ever on a gateway that does not answer, must not
exit 0 when an entry named a directory, and must say counts that add up.
"""

from __future__ import annotations

import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from push_client.stall import StallWatch
from tests.conftest import REPO, free_port, logbroker_cmd
from tests.push_client.conftest import (
    FAST_FLAGS,
    LineWriter,
    assert_exactly_once,
    read_delivered,
)
from tests.push_client.test_odd_files import _WITHOUT_ROOT_RIGHTS

BACKOFF = "max_backoff_s = 0.5\n"
"""Two retries at the longest backoff are the least a run waits for a gateway: 1 s here."""
SMALL_REQUESTS = ("--chunk-bytes", "8192", "--request-bytes", "16384", "--pipeline-depth", "1")


class _Quiet(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        """A client that hung up on a slow answer is no news."""


class _Gateway:
    """Forwards to a real gateway; after ``fail_after`` writes (None: never) it answers
    every request 503; ``delay_s`` holds the first forwarded request back that long."""

    def __init__(self, target: str) -> None:
        self.fail_after: int | None = None
        self.delay_s = 0.0
        self.forwarded = 0
        self.fail_first = 0
        """Requests answered 503 before any is forwarded."""
        self.writes = 0
        self.seen = 0
        lock = threading.Lock()
        proxy = self
        http = httpx.Client(timeout=30)

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                """Silent."""

            def _answer(self, status: int, body: bytes, content_type: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _forward(self, method: str) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length) if length else None
                with lock:
                    proxy.seen += 1
                    early = proxy.seen <= proxy.fail_first
                    if self.path == "/v1/write":
                        proxy.writes += 1
                    broken = proxy.fail_after is not None and proxy.writes > proxy.fail_after
                if early or broken:
                    self._answer(503, b'{"error": "unavailable", "reason": "test"}', "text/json")
                    return
                with lock:
                    proxy.forwarded += 1
                    first = proxy.forwarded == 1
                if first:
                    time.sleep(proxy.delay_s)
                headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                answer = http.request(method, target + self.path, content=body, headers=headers)
                self._answer(
                    answer.status_code,
                    answer.content,
                    answer.headers.get("Content-Type", "application/json"),
                )

            def do_GET(self) -> None:
                self._forward("GET")

            def do_POST(self) -> None:
                self._forward("POST")

        self.server = _Quiet(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._http = http
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._http.close()


def _push_once(
    tmp_path: Path,
    server: str,
    *paths: Path | str,
    extra: tuple[str, ...] = (),
    timeout_s: float = 60,
) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "push.toml"
    config.write_text("[push]\n" + BACKOFF)
    args = ["--config", str(config), "--server", server, "--log-type", "app", *extra]
    args += ["--state-dir", str(tmp_path / "state"), *FAST_FLAGS, "--idle-exit", "1"]
    return subprocess.run(
        logbroker_cmd("push", *args, *(str(p) for p in paths)),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=timeout_s,
    )


@pytest.mark.fault
def test_a_one_shot_run_gives_up_on_gateways_that_fail_and_a_rerun_ships_every_line_once(
    tmp_path: Path, gateway
) -> None:
    """``--idle-exit`` with an unreachable gateway retried until killed: a cron job hung
    for ever.  It gives up with status 1 once no gateway answered for max(N, 2 backoffs),
    naming the gateway and the error, with the acknowledged positions saved."""
    path = tmp_path / "app.log"
    writer = LineWriter("once", pad=200)
    writer.append(path, 600)
    proxy = _Gateway(gateway.url)
    proxy.fail_after = 3  # a gateway whose store fails mid-run: 503 from then on
    try:
        started = time.monotonic()
        first = _push_once(tmp_path, proxy.url, path, extra=SMALL_REQUESTS)
        took = time.monotonic() - started
    finally:
        proxy.close()
    assert first.returncode == 1, first.stderr[-3000:]
    assert took < 30, f"gave up after {took:.1f} s"
    said = first.stderr
    assert "no gateway answered for " in said and f"({proxy.url})" in said, said[-3000:]
    assert "HTTP 503" in said and "a rerun with the same state dir resumes there" in said
    shipped = read_delivered(gateway.data_dir, "app").count()
    assert 0 < shipped < 600, shipped  # some acknowledged before the store failed

    # nothing answers at all (the reviewer's case): the same, quickly
    dead = f"http://127.0.0.1:{free_port()}"
    second = _push_once(tmp_path, dead, path, extra=SMALL_REQUESTS, timeout_s=30)
    assert second.returncode == 1, second.stderr[-3000:]
    assert f"({dead})" in second.stderr and "ConnectError" in second.stderr

    # the rerun ships the rest, once
    writer.append(path, 100)
    third = _push_once(tmp_path, gateway.url, path, extra=SMALL_REQUESTS)
    assert third.returncode == 0, third.stderr[-3000:]
    assert_exactly_once(read_delivered(gateway.data_dir, "app"), writer)


@pytest.mark.fault
def test_a_slow_gateway_after_failures_does_not_make_a_one_shot_run_give_up(
    tmp_path: Path, gateway
) -> None:
    """A gateway that answers late is not failing: a request it took holds the verdict."""
    path = tmp_path / "app.log"
    writer = LineWriter("slow")
    writer.append(path, 50)
    proxy = _Gateway(gateway.url)
    proxy.fail_first = 1  # the first request fails: the clock of the give-up starts
    proxy.delay_s = 3.0  # then an answer takes three times the 1 s the run may fail for
    try:
        done = _push_once(tmp_path, proxy.url, path)
    finally:
        proxy.close()
    assert done.returncode == 0, done.stderr[-3000:]
    assert "no gateway answered" not in done.stderr
    assert_exactly_once(read_delivered(gateway.data_dir, "app"), writer)


def test_the_give_up_waits_for_a_request_that_may_still_be_answered_one_timeout_at_most() -> None:
    clock = [100.0]
    watch = StallWatch(lambda: clock[0])
    check = dict(after_s=10.0, connect_s=2.0, request_timeout_s=60.0)
    assert watch.stalled(clock[0], **check) is None
    watch.ended(watch.started(), "http://gw: ConnectError: refused")
    clock[0] = 109.0
    assert watch.stalled(clock[0], **check) is None  # failing for 9 s only
    clock[0] = 110.0
    assert watch.stalled(clock[0], **check) == "http://gw: ConnectError: refused"
    slow = watch.started()  # made after the last failure: it may be answered, late
    assert watch.stalled(clock[0], **check) is None
    clock[0] = 111.0
    watch.ended(watch.started(), "http://gw: HTTP 503: unavailable")  # another one fails
    assert watch.stalled(clock[0], **check) == "http://gw: HTTP 503: unavailable"
    clock[0] = 112.5
    assert watch.stalled(clock[0], **check) is None  # past connecting: a gateway took it
    clock[0] = 169.0
    assert watch.stalled(clock[0], **check) is None
    clock[0] = 170.0  # one request timeout more: the request has failed too by now
    assert watch.stalled(clock[0], **check) is not None
    watch.ended(slow, None)  # it answered: progress, the clock starts again
    assert watch.stalled(clock[0], **check) is None
    watch.ended(watch.started(), "http://gw: HTTP 503: unavailable")
    clock[0] = 179.0
    assert watch.stalled(clock[0], **check) is None
    watch.answered()  # a partition's owner answered
    clock[0] = 200.0
    assert watch.stalled(clock[0], **check) is None
    watch.dropped(watch.started())  # stopping: no verdict
    assert watch.failing_since is None and watch.stalled(clock[0], **check) is None


def test_a_directory_entry_fails_a_one_shot_run_and_the_counts_add_up(
    tmp_path: Path, gateway
) -> None:
    """``push ... '/nope/*.log' /var/log`` shipped nothing and exited 0; and "0 of 2 files
    parked and 1 unreadable" was said of three files found."""
    logs = tmp_path / "logs"
    logs.mkdir()
    readable, other, secret = LineWriter("r"), LineWriter("o"), LineWriter("s")
    readable.append(logs / "readable.log", 20)
    other.append(logs / "other.log", 20)
    secret.append(logs / "secret.log", 20)
    (logs / "secret.log").chmod(0)
    config = tmp_path / "push.toml"
    config.write_text("[push]\n" + BACKOFF)
    args = ["--server", gateway.url, "--log-type", "app", "--state-dir", str(tmp_path / "state")]
    args += [*FAST_FLAGS, "--idle-exit", "1", str(tmp_path / "nope" / "*.log"), str(tmp_path)]
    done = subprocess.run(
        [*_WITHOUT_ROOT_RIGHTS, *logbroker_cmd("push", *args, str(logs / "*.log"))],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert done.returncode == 1, done.stderr[-3000:]
    said = done.stderr
    assert f"entry {tmp_path} was not shipped: it is a directory" in said, said[-3000:]
    assert "of 3 files found, 2 shipped, 1 unreadable; 1 entry is a directory" in said
    assert f"no file matched {tmp_path / 'nope' / '*.log'} (not an error" in said
    assert_exactly_once(read_delivered(gateway.data_dir, "app"), readable, other)


def test_a_glob_matching_no_file_is_named_and_the_run_exits_0(tmp_path: Path, gateway) -> None:
    """No rotated file yet is normal for a one-shot run: status 0, and the exit says so."""
    path = tmp_path / "app.log"
    writer = LineWriter("g")
    writer.append(path, 10)
    done = _push_once(tmp_path, gateway.url, path, str(tmp_path / "app.log.*.gz"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "everything acknowledged and idle for 1.0 s: of 1 file found, 1 shipped" in done.stderr
    assert f"no file matched {tmp_path / 'app.log.*.gz'}" in done.stderr
    assert_exactly_once(read_delivered(gateway.data_dir, "app"), writer)
