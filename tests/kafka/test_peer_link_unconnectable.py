"""The peer link tells "no connection was made" (nothing sent) from a connection that broke.

A gateway whose host is powered off or cut from the network does not refuse connections: the
packets are dropped and each attempt waits for its connect timeout.  Such a forward was taken
for a slow owner and waited for until the gateways' group moved the partition (10 s and
more, every request carrying a section of it held); it is now ``PeerRefused`` like a refused
connection, so the owner is soon taken for dead and only its partitions' sections wait.

A listening socket that never accepts, its accept queue full, stands in for the dropped
packets: Linux drops the SYNs it cannot queue.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from ingest_api.peer_link import HttpPeerLink
from log_store.kafka.remote_transaction import PeerRefused, PeerUnreachable


@pytest.fixture
def unanswering_url() -> Iterator[str]:
    """An address whose connection attempts go unanswered."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    queued = []
    for _ in range(4):  # fill the accept queue: later SYNs are dropped
        client = socket.socket()
        client.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            client.connect(("127.0.0.1", port))
        queued.append(client)
    time.sleep(0.2)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        for client in queued:
            client.close()
        listener.close()


@pytest.fixture
def broken_url() -> Iterator[str]:
    """An address that takes the connection and closes it without an answer."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(10)
    port = listener.getsockname()[1]

    def serve() -> None:
        with contextlib.suppress(OSError):
            conn, _ = listener.accept()
            conn.recv(65536)
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        listener.close()
        thread.join(5)


def test_a_connection_attempt_nobody_answers_is_peer_refused(unanswering_url: str) -> None:
    link = HttpPeerLink(None, timeout_s=1.0)
    started = time.monotonic()
    try:
        with pytest.raises(PeerRefused):
            link.read_state(unanswering_url, "dc1.app", 0, ["k"])
    finally:
        link.close()
    assert time.monotonic() - started < 10.0


def test_a_connection_broken_after_the_request_went_out_is_not(broken_url: str) -> None:
    # the owner may have the request: waited for as a slow or lost answer, never "refused"
    link = HttpPeerLink(None, timeout_s=1.0)
    try:
        with pytest.raises(PeerUnreachable) as caught:
            link.read_state(broken_url, "dc1.app", 0, ["k"])
    finally:
        link.close()
    assert not isinstance(caught.value, PeerRefused)
