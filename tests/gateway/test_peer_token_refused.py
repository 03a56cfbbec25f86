"""A peer that refuses this gateway's peer token: a configuration mistake, said as one."""

from __future__ import annotations

import http.server
import logging
import threading
from collections.abc import Iterator

import pytest

from ingest_api.peer_link import HttpPeerLink
from log_store.kafka.remote_transaction import PeerUnreachable


class _RefusesEveryToken(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = b'{"error": "unauthorized", "reason": "internal calls need the peer token"}'
        self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def peer_url() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _RefusesEveryToken)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_refused_peer_token_names_peer_token_and_is_logged_once(
    peer_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: "... answered 401: ...: internal calls need the peer token", logged only as a
    retry of the push supervisor, with nothing naming the setting to look at."""
    link = HttpPeerLink("not-the-peers-token", timeout_s=5.0)
    try:
        with caplog.at_level(logging.ERROR, logger="ingest_api.peers"):
            for _ in range(3):
                with pytest.raises(PeerUnreachable) as refused:
                    link.read_state(peer_url, "dc1.app", 0, ["k"])
                assert "refused this gateway's peer token (401)" in str(refused.value)
                assert "the same peer_token" in str(refused.value)
    finally:
        link.close()
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1, [r.getMessage() for r in errors]
    assert peer_url in errors[0].getMessage()
