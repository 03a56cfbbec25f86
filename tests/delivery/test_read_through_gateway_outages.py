"""``logbroker read`` keeps retrying every request a gateway cannot answer (503, a connection
reset), its first group join and its look at the topics included, unless ``--idle-exit``."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from tests.delivery.conftest import wait_until

_UNAVAILABLE = b'{"error": "unavailable", "reason": "store unavailable"}'


class _Front:
    """A real gateway behind a front that answers 503 (as a gateway whose store is away
    does) to the requests ``refuse(method, path)`` picks, and forwards the others."""

    def __init__(self, upstream: str, refuse: Callable[[str, str], bool]) -> None:
        self.refuse = refuse
        self.refused: list[str] = []
        front = self
        http = httpx.Client(base_url=upstream, timeout=60)

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _serve(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if front.refuse(self.command, self.path):
                    front.refused.append(f"{self.command} {self.path}")
                    refused = {"Content-Type": "application/json", "Retry-After": "1"}
                    self._answer(503, refused, _UNAVAILABLE)
                    return
                headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                answer = http.request(self.command, self.path, content=body, headers=headers)
                kept = ("content-type", "retry-after")
                self._answer(
                    answer.status_code,
                    {k: v for k, v in answer.headers.items() if k.lower() in kept},
                    answer.content,
                )

            def _answer(self, status: int, headers: dict[str, str], body: bytes) -> None:
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_DELETE = _serve

            def log_message(self, format: str, *args: object) -> None:
                return

        self._http = http
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._http.close()


@pytest.fixture
def front() -> Iterator[Callable[[str, Callable[[str, str], bool]], _Front]]:
    fronts: list[_Front] = []

    def _make(upstream: str, refuse: Callable[[str, str], bool]) -> _Front:
        fronts.append(_Front(upstream, refuse))
        return fronts[-1]

    yield _make
    for f in fronts:
        f.close()


def _group_requests(method: str, path: str) -> bool:
    return path.startswith("/v1/groups/")


def test_a_group_reader_whose_first_join_meets_an_unavailable_gateway_retries_it(
    gateway: Any, writer_for: Any, start_reader: Any, front: Any
) -> None:
    writer_for(gateway.url).write("src0", [1, 2, 3])
    away = {"on": True}
    gw = front(gateway.url, lambda m, p: away["on"] and _group_requests(m, p))
    reader = start_reader(
        "--server", gw.url, "--topic", "dc1.app", "--group", "g", "--from-beginning",
        "--format", "jsonl",
    )  # fmt: skip
    wait_until(lambda: len(gw.refused) >= 2, 20, "the join to be tried again")
    assert reader.proc.poll() is None, reader.stderr()
    assert "gateway answered 503" in reader.stderr() and "; retrying" in reader.stderr()
    away["on"] = False
    wait_until(lambda: len(reader.records()) == 3, 20, "the lines once the gateway answers")
    assert reader.terminate() == 0, reader.stderr()
    assert [r["seqno"] for r in reader.records()] == [1, 2, 3]


def test_a_group_reader_with_idle_exit_gives_up_on_an_unavailable_gateway_with_1(
    gateway: Any, start_reader: Any, front: Any
) -> None:
    gw = front(gateway.url, _group_requests)
    reader = start_reader(
        "--server", gw.url, "--topic", "dc1.app", "--group", "g", "--idle-exit", "1"
    )
    assert reader.wait(30) == 1
    assert "was still unavailable after 1 s without new data" in reader.stderr()


def test_the_look_at_the_topics_behind_the_waiting_hint_is_retried(
    gateway: Any, writer_for: Any, start_reader: Any, front: Any
) -> None:
    """The reader's first look (is a gateway there?) is answered; its look at the topics to
    name them in the "waiting for topic" hint meets a gateway that is away for a while."""
    lists: list[float] = []

    def refuse(method: str, path: str) -> bool:
        if path.split("?")[0] != "/v1/topics":
            return False
        lists.append(time.monotonic())
        return len(lists) > 1 and lists[-1] - lists[1] < 2.0

    gw = front(gateway.url, refuse)
    reader = start_reader("--server", gw.url, "--topic", "dc1.later", "--format", "jsonl")
    wait_until(lambda: "waiting for topic 'dc1.later'" in reader.stderr(), 30, "the hint")
    assert reader.proc.poll() is None, reader.stderr()
    assert "GET /v1/topics: gateway answered 503" in reader.stderr()
    writer_for(gateway.url).write("src0", [1], log_type="later")
    wait_until(lambda: len(reader.records()) == 1, 20, "the topic's first line")
    assert reader.terminate() == 0, reader.stderr()
