"""A gateway on Kafka stopped (SIGTERM) while Kafka is unreachable: it exits promptly, with
status 0, and what it acknowledged before is in the log.  A real gateway process, a real
Kafka broker, the connection between them cut by a TCP proxy."""

from __future__ import annotations

import signal
import socket
import subprocess
import threading
import time
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from audit.publisher import INTERVAL_ENV
from log_store import LogStore
from tests.conftest import REPO, GatewayProcess, free_port, logbroker_cmd
from tests.gateway.conftest import Client
from tests.kafka.conftest import source_seqnos
from tests.kafka.tcp_proxy import TcpProxy

pytestmark = [pytest.mark.kafka, pytest.mark.fault, pytest.mark.slow]

STOP_GRACE_S = 5.0
"""What a stop may take beyond one operation timeout (an audit publish, which fails with
Kafka unreachable, takes that one)."""


@pytest.mark.parametrize(
    "audit_interval_s",
    [
        # the audit publishes only at the stop: its last publish has counts to write
        3600,
        # an audit publish of the writes' counts is under way (blocked) when the stop comes
        2,
    ],
    ids=["last-audit-publish", "audit-publish-under-way"],
)
def test_gateway_stopped_with_kafka_unreachable_exits_within_one_operation_timeout(
    start_kafka_gateway: Callable[..., GatewayProcess],
    kafka_store: LogStore,
    kafka_cluster: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    audit_interval_s: int,
) -> None:
    monkeypatch.setenv(INTERVAL_ENV, str(audit_interval_s))
    node = kafka_cluster.nodes[0]
    proxy = TcpProxy(node.proxied_advertised_port, node.proxied_port).start()
    try:
        gateway = start_kafka_gateway(bootstrap=kafka_cluster.proxied_bootstrap)
        config = tomllib.loads((tmp_path / "gateway-0.toml").read_text())
        bound_s = config["kafka"]["operation_timeout_s"] + STOP_GRACE_S
        client = Client(gateway.url, timeout_s=60)
        sources = [f"stop-{n}" for n in range(4)]
        for source in sources:
            acks = client.acks(source, [1, 2, 3])
            assert [a["status"] for a in acks] == ["written"] * 3, acks
        client.close()
        proxy.cut()
        time.sleep(2.5)  # the gateway's clients notice; an audit publish may start and block
        assert gateway.proc is not None
        started = time.monotonic()
        gateway.proc.send_signal(signal.SIGTERM)
        try:
            status = gateway.proc.wait(bound_s + 30)
        except subprocess.TimeoutExpired:
            status = None
        took = time.monotonic() - started
        print(f"stopped in {took:.1f} s (bound {bound_s:.1f} s)")
    finally:
        proxy.close()
    assert status == 0, f"exit status {status} after {took:.1f} s: {gateway.log()}"
    assert took <= bound_s, f"the stop took {took:.1f} s, more than {bound_s:.1f} s"
    per_source = source_seqnos(kafka_store, "dc1.app")
    for source in sources:
        assert per_source[source][1] == [1, 2, 3], f"{source}: acknowledged chunks lost"


def test_a_gateway_waiting_for_kafka_at_its_start_stops_at_once_on_sigterm(
    tmp_path: Path,
) -> None:
    """Started with its cluster away, the gateway waits for it (saying so); a stop asked for
    meanwhile ends it within one look (5 s), with status 0."""
    closed = socket.socket()  # a port where no broker will ever answer
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    proc = subprocess.Popen(
        logbroker_cmd(
            "serve", "--data-dir", str(tmp_path / "data"), "--port", str(free_port()),
            "--store", "kafka", "--kafka-bootstrap", f"127.0.0.1:{port}",
        ),
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + 60
        for line in proc.stderr:
            if f"waiting for Kafka at 127.0.0.1:{port}" in line:
                break
            assert time.monotonic() < deadline, "it never said it waits"
        # the rest of what it says is read on, so that a full pipe never holds its stop up
        said: list[str] = []
        reader = threading.Thread(target=lambda: said.extend(proc.stderr or ()), daemon=True)
        reader.start()
        stopped_at = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            status = proc.wait(30)
        except subprocess.TimeoutExpired:
            # where it is held: the gateway writes every thread's stack on SIGABRT
            proc.send_signal(signal.SIGABRT)
            proc.wait(30)
            reader.join(10)
            stacks = "".join(line for line in said if not line.startswith("%"))
            raise AssertionError(f"no stop within 30 s; its threads: {stacks[-6000:]}") from None
        assert status == 0, "".join(said)[-3000:]
        assert time.monotonic() - stopped_at < 5 + STOP_GRACE_S
    finally:
        proc.kill()
        proc.wait(30)
