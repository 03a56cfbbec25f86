"""The start-up check of a gateway's advertised URL (``ops.advertised_url``), without Kafka:
what it says of HTTPS, of another server at the URL, and of a stop during its wait.

The gateway processes that refuse a shared or unreachable URL are in
``test_advertised_url.py``."""

from __future__ import annotations

import http.server
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ops.advertised_url import AdvertisedUrlWrong, check_advertised_url
from tests.conftest import free_port


@pytest.fixture
def bound() -> Iterator[socket.socket]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    yield sock
    sock.close()


def _url(sock: socket.socket, scheme: str = "http") -> str:
    return f"{scheme}://127.0.0.1:{sock.getsockname()[1]}"


def _certificate(tmp_path: Path) -> tuple[Path, Path]:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"),
            *("-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


def test_over_https_the_check_trusts_what_the_gateways_trust(
    bound: socket.socket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cert, key = _certificate(tmp_path)
    url = _url(bound, "https")
    tls = {"ssl_certfile": str(cert), "ssl_keyfile": str(key)}
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    with pytest.raises(
        AdvertisedUrlWrong, match=r"does not reach this gateway.*CERTIFICATE_VERIFY"
    ):
        check_advertised_url(bound, url, wait_s=0.5, stopped=threading.Event(), **tls)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # as the gateways' peer client honours it
    assert check_advertised_url(bound, url, wait_s=5, stopped=threading.Event(), **tls)


class _OldGateway(http.server.BaseHTTPRequestHandler):
    """A gateway of a release whose ``/healthz`` names no instance."""

    def do_GET(self) -> None:
        body = b'{"status":"ok","dc":"dc1"}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: object) -> None:
        return None


def test_another_gateway_at_the_url_is_refused_at_once(bound: socket.socket) -> None:
    other = http.server.HTTPServer(("127.0.0.1", 0), _OldGateway)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        began = time.monotonic()
        with pytest.raises(AdvertisedUrlWrong, match="another gateway answers at http"):
            check_advertised_url(
                bound,
                f"http://127.0.0.1:{other.server_address[1]}",
                wait_s=10,
                stopped=threading.Event(),
            )
        assert time.monotonic() - began < 3
    finally:
        other.shutdown()
        other.server_close()


def test_a_stop_during_the_wait_ends_it(bound: socket.socket) -> None:
    stopped = threading.Event()
    threading.Timer(0.5, stopped.set).start()
    began = time.monotonic()
    url = f"http://127.0.0.1:{free_port()}"
    assert not check_advertised_url(bound, url, wait_s=30, stopped=stopped)
    assert time.monotonic() - began < 3
