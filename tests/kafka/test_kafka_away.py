"""A running gateway while its connection to Kafka is cut (a TCP proxy between them): it
sees the outage within seconds, says so at ``/readyz`` and at the routes that ask Kafka for
metadata at once, without waiting out ``operation_timeout_s``; it is back as soon as Kafka
is; and its stderr carries its own lines about it, not librdkafka's."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.conftest import REPO, GatewayProcess
from tests.gateway.conftest import Client
from tests.kafka.conftest import wait_until
from tests.kafka.tcp_proxy import TcpProxy

pytestmark = [pytest.mark.kafka, pytest.mark.fault, pytest.mark.slow]

_RAW_LIBRDKAFKA = re.compile(r"^%\d\|\d+\.\d+\|", re.MULTILINE)
"""A line librdkafka prints itself: ``%3|1764316800.123|FAIL|ns.logbroker#consumer-3| ...``."""


def _started_through(
    proxy: TcpProxy,
    start_kafka_gateway: Callable[..., GatewayProcess],
    kafka_cluster: Any,
    **options: Any,
) -> tuple[GatewayProcess, Client]:
    """A gateway that reaches Kafka only through ``proxy``, with a topic written once."""
    gateway = start_kafka_gateway(bootstrap=kafka_cluster.proxied_bootstrap, **options)
    client = Client(gateway.url, timeout_s=60)
    written = client.write("away", [1, 2, 3])
    assert written.status_code == 200, written.text
    assert httpx.get(f"{gateway.url}/readyz", timeout=30).status_code == 200
    return gateway, client


def _until_status(url: str, status: int, within_s: float) -> float:
    """Seconds until ``GET url`` answered ``status`` (asked every 0.1 s), at most ``within_s``."""
    started = time.monotonic()
    while True:
        if httpx.get(url, timeout=30).status_code == status:
            return time.monotonic() - started
        assert time.monotonic() - started < within_s, f"{url} did not answer {status}"
        time.sleep(0.1)


def test_a_cut_turns_readyz_503_within_seconds_and_200_as_soon_as_kafka_is_back(
    start_kafka_gateway: Callable[..., GatewayProcess], kafka_cluster: Any
) -> None:
    """It used to stay 200 for 10 s after the cut (the grace a single broker's loss needs)."""
    node = kafka_cluster.nodes[0]
    proxy = TcpProxy(node.proxied_advertised_port, node.proxied_port).start()
    try:
        gateway, client = _started_through(proxy, start_kafka_gateway, kafka_cluster)
        proxy.cut()
        not_ready_after = _until_status(f"{gateway.url}/readyz", 503, 30)
        answer = httpx.get(f"{gateway.url}/readyz", timeout=30)
        assert answer.status_code == 503
        assert answer.headers.get("Retry-After")
        assert answer.json()["error"] == "not_ready"
        assert "Kafka" in answer.json()["reason"], answer.json()
        assert not_ready_after < 4.0, f"/readyz turned 503 {not_ready_after:.1f} s after the cut"
        # writes keep their meaning: refused, nothing acknowledged
        refused = client.write("away", [4, 5])
        assert refused.status_code == 503, refused.text
        assert refused.headers.get("Retry-After")
        proxy.restore()
        ready_after = _until_status(f"{gateway.url}/readyz", 200, 30)
        assert ready_after < 5.0, f"/readyz turned 200 {ready_after:.1f} s after the restore"
        wait_until(lambda: client.write("away", [4, 5]).status_code == 200, 60, "a write")
        client.close()
    finally:
        proxy.close()


def test_while_kafka_is_cut_the_metadata_routes_answer_503_at_once_and_recover(
    start_kafka_gateway: Callable[..., GatewayProcess], kafka_cluster: Any
) -> None:
    """``GET /v1/topics`` and a topic's description, once the gateway knows Kafka is away:
    503 with ``Retry-After`` and the reason at once (they used to wait the whole
    ``operation_timeout_s``, 30 s here); and ``logbroker read --idle-exit 2`` gives up soon
    after its 2 s (it used to wait for that 503).  Back to 200 as soon as Kafka is."""
    node = kafka_cluster.nodes[0]
    proxy = TcpProxy(node.proxied_advertised_port, node.proxied_port).start()
    try:
        gateway, client = _started_through(
            proxy, start_kafka_gateway, kafka_cluster, kafka={"operation_timeout_s": 30.0}
        )
        assert httpx.get(f"{gateway.url}/v1/topics", timeout=30).status_code == 200
        proxy.cut()
        # the gateway knows it once /readyz says it (the test above bounds that)
        _until_status(f"{gateway.url}/readyz", 503, 30)
        for path in ("/v1/topics", "/v1/topics/dc1.app"):
            asked = time.monotonic()
            answer = httpx.get(f"{gateway.url}{path}", timeout=30)
            took = time.monotonic() - asked
            assert answer.status_code == 503, answer.text
            assert answer.headers.get("Retry-After")
            assert answer.json()["error"] == "store_unavailable"
            assert "Kafka" in answer.json()["reason"], answer.json()
            assert took < 2.0, f"GET {path} took {took:.1f} s while Kafka was cut"
        asked = time.monotonic()
        read = subprocess.run(
            [sys.executable, "-m", "ops", "read", "--server", gateway.url,
             "--topic", "dc1.app", "--from-beginning", "--idle-exit", "2"],
            capture_output=True, text=True, cwd=REPO, timeout=120,
        )  # fmt: skip
        took = time.monotonic() - asked
        assert read.returncode == 1, read.stderr
        assert "Kafka" in read.stderr, read.stderr
        assert took < 15.0, f"logbroker read --idle-exit 2 took {took:.1f} s"
        proxy.restore()
        back_after = _until_status(f"{gateway.url}/v1/topics", 200, 30)
        assert back_after < 5.0, f"GET /v1/topics answered 200 {back_after:.1f} s after"
        listed = httpx.get(f"{gateway.url}/v1/topics", timeout=30).json()
        assert "dc1.app" in str(listed)
        client.close()
    finally:
        proxy.close()


def test_a_cut_puts_the_gateways_own_lines_on_stderr_not_librdkafkas(
    start_kafka_gateway: Callable[..., GatewayProcess], kafka_cluster: Any
) -> None:
    """Every librdkafka client of a running gateway (its group member, readers, admin
    client, owners' directory, the partition writers) printed each failed connection on
    stderr, several lines a second; now they go to the debug log and the gateway says, now
    and then, that Kafka is away and what librdkafka last gave as the reason."""
    node = kafka_cluster.nodes[0]
    proxy = TcpProxy(node.proxied_advertised_port, node.proxied_port).start()
    try:
        gateway, client = _started_through(proxy, start_kafka_gateway, kafka_cluster)
        # a reader's consumer and a long-poll's follower are made too
        read = httpx.get(
            f"{gateway.url}/v1/topics/dc1.app/partitions/0/messages?offset=0", timeout=30
        )
        assert read.status_code == 200, read.text
        before = gateway.log_path.read_text(errors="replace")
        proxy.cut()
        time.sleep(8)
        client.write("away", [4])  # a writer fails too (503)
        time.sleep(2)
        during = gateway.log_path.read_text(errors="replace")[len(before) :]
        proxy.restore()
        _until_status(f"{gateway.url}/readyz", 200, 60)
        client.close()
    finally:
        proxy.close()
    raw = _RAW_LIBRDKAFKA.findall(during)
    assert not raw, f"{len(raw)} librdkafka lines on stderr during the cut:\n{during[-3000:]}"
    assert "Kafka is unreachable from this gateway" in during, during[-3000:]
    assert "Connection refused" in during, during[-3000:]
    said = during.count("Kafka is unreachable from this gateway")
    assert said <= 3, f"said {said} times in 10 s:\n{during[-3000:]}"
