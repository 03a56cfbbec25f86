"""A URL of ``--server A,B`` (or a mirror's end) whose ``/healthz`` answers as no logbroker
gateway does (a 404 or 403 of a proxy with nothing behind it, a page that is no gateway's
JSON) is refused, naming the URL and what it answered: before, it was taken unchecked as a
gateway too old to name its installation, and a request A could not answer went there.

Every gateway, the oldest included, answers ``/healthz`` 200 with ``{"status": "ok", ...}``:
only that is taken as an older gateway."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler

import httpx
import pytest

from delivery.installations import NotAGateway
from delivery.mirror import Mirror
from tests.conftest import REPO, GatewayProcess, logbroker_cmd
from tests.scripted_http import LoopbackServer, running
from yt_loader.log_source import SourceSpec


class _Front(LoopbackServer):
    """What answers in front of no gateway: ``status`` and ``body`` to every request."""

    def __init__(self, status: int, body: bytes) -> None:
        self.status = status
        self.body = body
        self.seen: list[str] = []
        super().__init__(_FrontHandler)


class _FrontHandler(BaseHTTPRequestHandler):
    server: _Front

    def _serve(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.seen.append(f"{self.command} {self.path}")
        self.send_response(self.server.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.server.body)))
        self.end_headers()
        self.wfile.write(self.server.body)

    do_GET = do_POST = _serve

    def log_message(self, *args: object) -> None:
        """Nothing on stderr for each request."""


_NOT_FOUND = json.dumps({"message": "no route"}).encode()
_OLD_HEALTHZ = json.dumps({"status": "ok", "dc": "dc1"}).encode()


@pytest.fixture
def front(request: pytest.FixtureRequest) -> Iterator[_Front]:
    status, body = request.param
    with running(_Front(status, body)) as server:
        yield server


def _topics(url: str) -> list[str]:
    return [t["name"] for t in httpx.get(f"{url}/v1/topics", timeout=30).json()["topics"]]


@pytest.mark.parametrize("front", [(404, _NOT_FOUND), (403, b"forbidden")], indirect=True)
def test_a_topics_command_refuses_a_url_whose_healthz_answers_4xx(
    gateway: GatewayProcess, front: _Front
) -> None:
    """Before, the command went on through A (exit 0): the front was taken as an older
    gateway, and a create A answered 503 would have gone to it."""
    done = subprocess.run(
        logbroker_cmd("topics", "create", "dc1.fronted", "--server", f"{gateway.url},{front.url}"),
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"logbroker topics: {front.url} answered {front.status} to GET "), last
    assert "/healthz" in last and "not a gateway" in last, last
    assert front.seen == ["GET /healthz"]
    assert "dc1.fronted" not in _topics(gateway.url)


@pytest.mark.parametrize("front", [(404, _NOT_FOUND)], indirect=True)
def test_a_reader_refuses_a_url_whose_healthz_answers_4xx(
    gateway: GatewayProcess, front: _Front
) -> None:
    done = subprocess.run(
        logbroker_cmd("read", "--server", f"{gateway.url},{front.url}", "--topic", "dc1.app",
                      "--idle-exit", "1"),
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"logbroker read: {front.url} answered 404 to GET /healthz"), last


@pytest.mark.parametrize(
    "front", [(404, _NOT_FOUND), (200, b"<html>welcome</html>"), (200, b"{}")], indirect=True
)
def test_the_loader_refuses_a_url_whose_healthz_is_no_gateways_answer(
    gateway: GatewayProcess, front: _Front
) -> None:
    """A 200 that is no gateway's JSON (a proxy's page) is no older gateway either."""
    with pytest.raises(NotAGateway) as caught:
        SourceSpec(server=f"{gateway.url},{front.url}").pinned()
    assert str(caught.value).startswith(f"{front.url} answered {front.status} to GET /healthz")


@pytest.mark.parametrize("front", [(200, _OLD_HEALTHZ)], indirect=True)
def test_an_older_gateway_is_still_taken_unchecked(gateway: GatewayProcess, front: _Front) -> None:
    """``{"status": "ok"}`` without ``installation`` is a gateway from before installations."""
    spec = SourceSpec(server=f"{gateway.url},{front.url}").pinned()
    assert spec.installation is not None and spec.installation[0] == gateway.url


@pytest.mark.parametrize("front", [(404, _NOT_FOUND)], indirect=True)
def test_a_mirror_refuses_a_destination_whose_healthz_answers_4xx(
    gateway: GatewayProcess, front: _Front
) -> None:
    """Before, the mirror took the 404 for an older gateway and only compared the URLs."""
    mirror = Mirror(gateway.url, front.url, "dc1.")
    try:
        with pytest.raises(NotAGateway, match=f"the destination {front.url} answered 404"):
            mirror.check_ends()
    finally:
        mirror.close()
