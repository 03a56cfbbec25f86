"""Scripted HTTP endpoints for tests of clients: each POST is answered with the status (and
after the delay) a function of its path gives, with a JSON error body unless 200."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TypeVar


def send_json(handler: BaseHTTPRequestHandler, status: int, body: bytes) -> None:
    """Answer ``handler``'s request with ``status`` and the JSON ``body``."""
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def read_head(sock: socket.socket) -> bytes:
    """What a raw client socket received up to the end of an answer's head (or the close)."""
    answer = b""
    while b"\r\n\r\n" not in answer:
        piece = sock.recv(65536)
        if not piece:
            break
        answer += piece
    return answer


class LoopbackServer(ThreadingHTTPServer):
    """A threaded HTTP server of a test on a free loopback port (``url``)."""

    daemon_threads = True

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        super().__init__(("127.0.0.1", 0), handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class ScriptedServer(LoopbackServer):
    def __init__(self, answer: Callable[[str], tuple[int, float]]) -> None:
        self.answer = answer
        """path -> (status, seconds to wait before answering)."""
        self.paths: list[str] = []
        super().__init__(_Handler)


class _Handler(BaseHTTPRequestHandler):
    server: ScriptedServer

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.server.paths.append(self.path)
        status, delay = self.server.answer(self.path)
        time.sleep(delay)
        body = b"{}" if status == 200 else b'{"error": "x", "reason": "scripted refusal"}'
        send_json(self, status, body)

    def log_message(self, *args: object) -> None:
        """Nothing on stderr for each request: the tests read what the client logs."""


_Server = TypeVar("_Server", bound=LoopbackServer)


@contextlib.contextmanager
def running(server: _Server) -> Iterator[_Server]:
    """``server`` answering on a thread of its own while the block runs; closed after it."""
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def serving(
    answer: Callable[[str], tuple[int, float]],
) -> contextlib.AbstractContextManager[ScriptedServer]:
    """A :class:`ScriptedServer` answering while the block runs."""
    return running(ScriptedServer(answer))
