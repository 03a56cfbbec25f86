"""Helpers of the delivery tests: writing through a real gateway, readers as real processes,
and a real HTTP endpoint for push delivery whose behaviour a test scripts."""

from __future__ import annotations

import base64
import gzip
import json
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import zstandard

from tests.conftest import REPO, logbroker_cmd


class Writer:
    """Writes chunks through ``POST /v1/write`` (NDJSON), one line per chunk."""

    def __init__(self, url: str, token: str | None = None) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=url, timeout=30.0, headers=headers)

    def close(self) -> None:
        self.http.close()

    def write(
        self,
        source_id: str,
        seqnos: Sequence[int],
        *,
        log_type: str = "app",
        server: str = "host1",
        file: str = "/var/log/app.log",
        codec: str = "raw",
    ) -> list[dict[str, Any]]:
        lines = []
        for seqno in seqnos:
            data = line_for(source_id, seqno).encode()
            item: dict[str, Any] = {
                "log_type": log_type,
                "source_id": source_id,
                "seqno": seqno,
                "server": server,
                "file": file,
                "codec": codec,
            }
            if codec == "raw":
                item["data"] = data.decode()
            else:
                packed = gzip.compress(data) if codec == "gzip" else zstd_compress(data)
                item["data_b64"] = base64.b64encode(packed).decode()
            lines.append(json.dumps(item))
        response = self.http.post(
            "/v1/write",
            content="\n".join(lines).encode(),
            headers={"content-type": "application/x-ndjson"},
        )
        assert response.status_code == 200, response.text
        acks: list[dict[str, Any]] = []
        for result in response.json()["results"]:
            acks.extend(result["acks"])
        return acks


PUSH_TO_LOOPBACK = ("--push-allow", "127.0.0.1/32")
"""Gateway flags for tests whose push endpoints listen on loopback, which push delivery
refuses unless an operator allows it."""


def zstd_compress(data: bytes) -> bytes:
    return zstandard.ZstdCompressor().compress(data)


def line_for(source_id: str, seqno: int) -> str:
    return f"{source_id} line {seqno}\n"


@pytest.fixture
def writer_for() -> Iterator[Callable[[str], Writer]]:
    writers: list[Writer] = []

    def _make(url: str) -> Writer:
        w = Writer(url)
        writers.append(w)
        return w

    yield _make
    for w in writers:
        w.close()


class ReaderProcess:
    """``logbroker read`` as a real process, its stdout in a file."""

    def __init__(self, args: Sequence[str], out_path: Path) -> None:
        self.out_path = out_path
        self.err_path = out_path.with_suffix(".err")
        self._out = open(out_path, "wb")  # noqa: SIM115 - the child writes it until it exits
        self._err = open(self.err_path, "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            logbroker_cmd("read", *args), stdout=self._out, stderr=self._err, cwd=REPO
        )

    def records(self) -> list[dict[str, Any]]:
        """The jsonl records printed so far (a line cut by SIGKILL is left out)."""
        out = []
        for line in self.out_path.read_bytes().splitlines(keepends=True):
            if line.endswith(b"\n"):
                out.append(json.loads(line))
        return out

    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def terminate(self, timeout_s: float = 20.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout_s)

    def wait(self, timeout_s: float) -> int:
        return self.proc.wait(timeout_s)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._out.close()
        self._err.close()


@pytest.fixture
def start_reader(tmp_path: Path) -> Iterator[Callable[..., ReaderProcess]]:
    readers: list[ReaderProcess] = []

    def _start(*args: str) -> ReaderProcess:
        reader = ReaderProcess(args, tmp_path / f"reader-{len(readers)}.out")
        readers.append(reader)
        return reader

    yield _start
    for reader in readers:
        reader.close()


def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


@dataclass
class PushEndpoint:
    """A real HTTP endpoint: answers each POST as ``behaviour(n)`` says for the n-th request.

    ``behaviour`` returns ("ok", 200), ("fail", 500), ("hang", seconds) or ("redirect", 302)
    (to ``location``).  Only batches answered "ok" are recorded, as a receiver that had
    processed them would.
    """

    behaviour: Callable[[int], tuple[str, float]]
    accepted: list[dict[str, Any]] = field(default_factory=list)
    requests: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    server: ThreadingHTTPServer | None = None
    location: str = ""

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def messages(self) -> list[dict[str, Any]]:
        with self.lock:
            return [m for batch in self.accepted for m in batch["messages"]]

    def start(self) -> PushEndpoint:
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                with endpoint.lock:
                    n = endpoint.requests
                    endpoint.requests += 1
                action, arg = endpoint.behaviour(n)
                if action == "hang":
                    time.sleep(arg)
                    status = 200  # too late: the sender gave up and will send it again
                elif action in ("fail", "redirect"):
                    status = int(arg)
                else:
                    with endpoint.lock:
                        endpoint.accepted.append(json.loads(body))
                    status = 200
                try:
                    self.send_response(status)
                    if action == "redirect":
                        self.send_header("Location", endpoint.location)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                except OSError:
                    pass  # the sender timed out and closed the connection

            def log_message(self, format: str, *args: object) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


@pytest.fixture
def push_endpoint() -> Iterator[Callable[[Callable[[int], tuple[str, float]]], PushEndpoint]]:
    endpoints: list[PushEndpoint] = []

    def _make(behaviour: Callable[[int], tuple[str, float]]) -> PushEndpoint:
        endpoint = PushEndpoint(behaviour).start()
        endpoints.append(endpoint)
        return endpoint

    yield _make
    for endpoint in endpoints:
        endpoint.stop()
