"""A broker that is shutting down never takes a gateway's process down with it.

Once, in eight broker outages of a review, a gateway was aborted inside librdkafka as the
broker stopped: ``rdkafka_admin.c:960: rd_kafka_admin_response_parse: Assertion
'rko_result' failed``.  A single broker that is shutting down has been fenced: asked for the
brokers only (what librdkafka's DescribeCluster asks), it answers naming neither a broker
nor a topic; librdkafka's metadata parser refuses that answer without setting the reply's
error, so ``rd_kafka_DescribeClusterResponse_parse`` returns success with no result, and the
assertion aborts the process.  ``/readyz`` asked DescribeCluster every time; a loop of them
across ``scripts/kafka.sh restart`` aborted in 4 of 5 outages.

The broker here is a stand-in speaking Kafka's protocol on loopback: the session's real one
answers so only for a few milliseconds of a restart, which a quick test cannot aim at.  It
answers as that broker did (its Metadata answers, with itself in them while it is up, with
nothing once it is "shutting down"), and the asks run in a child process, which librdkafka
would abort.
"""

from __future__ import annotations

import socketserver
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from tests.conftest import REPO

_API_VERSIONS = 18
_METADATA = 3
_METADATA_MAX = 4
"""The only Metadata version the stand-in speaks: not flexible (those are 9+), and with the
cluster's id and its controller, which DescribeCluster needs."""
_CLUSTER_ID = "stand-in-cluster"

_ASKS = """
import sys
from log_store.errors import StoreUnavailable
from log_store.kafka import topic_admin
from log_store.kafka.bootstrap import check_reachable
from log_store.kafka.settings import KafkaSettings

settings = KafkaSettings(sys.argv[1], operation_timeout_s=2.0, librdkafka_log="debug")
admin = topic_admin.TopicAdmin(settings)
print("up:", admin.reachable(10.0), flush=True)
sys.stdin.readline()  # the broker is shutting down now


def readiness():
    admin.reachable(1.0)


def renewal_look():
    failure = topic_admin._unreached(admin.client)
    if failure is not None:
        raise StoreUnavailable(str(failure))


def command():
    check_reachable(settings, 1.0)


for ask in (readiness, renewal_look, command):
    try:
        ask()
        print(ask.__name__, "answered", flush=True)
    except StoreUnavailable as exc:
        print(ask.__name__, "unavailable:", exc, flush=True)
"""


def _string(text: str | None) -> bytes:
    if text is None:
        return struct.pack(">h", -1)
    data = text.encode()
    return struct.pack(">h", len(data)) + data


class _Broker(socketserver.ThreadingTCPServer):
    """Node 1 of a one-node cluster: answers ApiVersions and Metadata, nothing else."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Connection)
        self.port = self.server_address[1]
        self.shutting_down = threading.Event()
        self.empty_answers = 0

    def metadata(self) -> bytes:
        """A Metadata v4 answer: itself and no topic while up; nothing once shutting down
        (fenced: not among the live brokers it reports; no controller it knows)."""
        if self.shutting_down.is_set():
            self.empty_answers += 1
            brokers: list[tuple[int, str, int]] = []
            controller = -1
        else:
            brokers, controller = [(1, "127.0.0.1", self.port)], 1
        body = struct.pack(">ii", 0, len(brokers))  # throttle_time_ms, brokers
        for node_id, host, port in brokers:
            body += struct.pack(">i", node_id) + _string(host) + struct.pack(">i", port)
            body += _string(None)  # rack
        body += _string(_CLUSTER_ID) + struct.pack(">i", controller)
        return body + struct.pack(">i", 0)  # topics


class _Connection(socketserver.BaseRequestHandler):
    server: _Broker

    def handle(self) -> None:
        stream = self.request.makefile("rb")
        while True:
            size = stream.read(4)
            if len(size) < 4:
                return
            request = stream.read(struct.unpack(">i", size)[0])
            api_key, api_version, correlation_id = struct.unpack(">hhi", request[:8])
            if api_key == _API_VERSIONS:
                body = self._api_versions(api_version)
            elif api_key == _METADATA:
                body = self.server.metadata()
            else:
                return  # librdkafka asks nothing else of a broker that offers nothing else
            answer = struct.pack(">i", correlation_id) + body  # response header v0
            self.request.sendall(struct.pack(">i", len(answer)) + answer)

    @staticmethod
    def _api_versions(version: int) -> bytes:
        keys = [(_API_VERSIONS, 0, 3), (_METADATA, 0, _METADATA_MAX)]
        if version >= 3:  # flexible: compact array, tagged fields
            body = struct.pack(">hB", 0, len(keys) + 1)
            body += b"".join(struct.pack(">hhhB", *key, 0) for key in keys)
            return body + struct.pack(">iB", 0, 0)
        body = struct.pack(">hi", 0, len(keys)) + b"".join(struct.pack(">hhh", *k) for k in keys)
        return body + (struct.pack(">i", 0) if version >= 1 else b"")


@pytest.fixture
def broker() -> Iterator[_Broker]:
    server = _Broker()
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def test_readiness_asked_of_a_broker_shutting_down_is_unavailable_not_an_abort(
    broker: _Broker,
) -> None:
    started = time.monotonic()
    asks = subprocess.Popen(
        [sys.executable, "-c", _ASKS, f"127.0.0.1:{broker.port}"],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert asks.stdin is not None and asks.stdout is not None
    up = asks.stdout.readline()
    assert up == f"up: {_CLUSTER_ID}\n", up + asks.communicate(timeout=30)[1]
    broker.shutting_down.set()
    out, err = asks.communicate("\n", timeout=60)
    assert asks.returncode == 0, f"the process ended with {asks.returncode}: {err[-2000:]}"
    assert broker.empty_answers > 0, "the broker was never asked while shutting down"
    lines = out.splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "readiness unavailable",
        "renewal_look unavailable",
        "command unavailable",
    ], out
    # refused for what the broker said, not for a time-out
    assert "Partial response" in lines[0] or "named no broker" in lines[0], lines[0]
    assert time.monotonic() - started < 15
