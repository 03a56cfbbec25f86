"""A gateway survives a group coordinator that is found late, and an abort leaves its stacks.

Seen on a fresh 3-node cluster: a gateway's process aborted at start, with only librdkafka's
line ``rdkafka_queue.h:1086: rd_kafka_enq_once_del_source_return: Assertion 'eonce->refcnt
> 0' failed.``  The start-up probe asked the broker (DescribeConsumerGroups, a 1 s
``request_timeout``, every 0.2 s) whether it listed the probe's member while the group
coordinator was still loading.  librdkafka (2.16, issue #4605) frees such a request's state
when its timeout expires before the coordinator is known, and the lookup that ends later uses
the freed state.  The probe (and the gateways' group, joining again) now reads the member's
epoch from the consumer itself; no gateway sends an admin request to a group coordinator.

The window is made here, not waited for: the probe starts with its broker unreachable (a
proxy in front of the session broker's ``PROXIED`` listener, not listening yet), so its
first looks find no coordinator; the proxy then opens.  The old probe aborted each time.
"""

from __future__ import annotations

import ast
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer

from log_store.kafka import bootstrap
from tests.conftest import REPO
from tests.kafka.conftest import serve_patched
from tests.kafka.tcp_proxy import TcpProxy

_PROBE = """
import sys
from log_store.kafka import bootstrap
from log_store.kafka.settings import KafkaSettings
settings = KafkaSettings(sys.argv[1], namespace=sys.argv[2], librdkafka_log="debug")
print("took:", bootstrap.check_group_protocol(settings, timeout_s=30.0), flush=True)
"""

# the admin requests librdkafka sends to a group coordinator (RD_KAFKA_ADMIN_TARGET_COORDINATOR)
_TO_GROUP_COORDINATOR = {
    "describe_consumer_groups",
    "list_consumer_group_offsets",
    "alter_consumer_group_offsets",
    "delete_consumer_groups",
    "delete_consumer_group_offsets",
}
_GATEWAY_PACKAGES = ("log_store", "session_dedup", "ingest_api", "delivery", "ops")


def test_the_probe_outlives_a_coordinator_found_after_its_first_looks(
    kafka_cluster: Any, kafka_namespace: str
) -> None:
    node = kafka_cluster.nodes[0]
    proxy = TcpProxy(node.proxied_advertised_port, node.proxied_port)  # not listening yet
    probe = subprocess.Popen(
        [sys.executable, "-c", _PROBE, kafka_cluster.proxied_bootstrap, kafka_namespace],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        time.sleep(2.5)  # the probe looks several times, its coordinator unknown
        proxy.start()
        out, _ = probe.communicate(timeout=60)
    finally:
        if probe.poll() is None:
            probe.kill()
        proxy.cut()
    assert probe.returncode == 0, out[-3000:]
    assert "took: True" in out
    assert "enq_once" not in out


def test_a_member_is_joined_once_its_epoch_is_set(kafka_cluster: Any, kafka_namespace: str) -> None:
    """The epoch is read from librdkafka's serialized group metadata: this holds its form to
    the installed library."""
    group = f"{kafka_namespace}epoch"
    consumer = Consumer(
        {
            "bootstrap.servers": kafka_cluster.bootstrap,
            "group.id": group,
            "group.protocol": "consumer",
            "log_level": 0,
        }
    )
    try:
        assert consumer.consumer_group_metadata().startswith(b"CGMDv2:")
        assert not bootstrap.member_joined(consumer)  # not heard by the broker yet
        consumer.subscribe([group])
        deadline = time.monotonic() + 20
        while not bootstrap.member_joined(consumer):
            assert time.monotonic() < deadline, "the broker did not take the member"
            consumer.poll(0.1)
    finally:
        consumer.close()


class _Metadata:
    def __init__(self, metadata: object) -> None:
        self.metadata = metadata

    def consumer_group_metadata(self) -> object:
        return self.metadata


def test_only_an_epoch_above_zero_in_a_known_form_is_joined() -> None:
    def form(epoch: int) -> bytes:
        return b"CGMDv2:" + epoch.to_bytes(4, sys.byteorder, signed=True) + b"g\x00m\x00\x01"

    assert bootstrap.member_joined(_Metadata(form(3)))
    assert not bootstrap.member_joined(_Metadata(form(0)))
    assert not bootstrap.member_joined(_Metadata(form(-1)))
    assert not bootstrap.member_joined(_Metadata(b"CGMDv3:" + form(3)[7:]))
    assert not bootstrap.member_joined(_Metadata(b"CGMDv2:"))
    assert not bootstrap.member_joined(_Metadata(None))


def test_no_gateway_module_asks_a_group_coordinator_through_the_admin_api() -> None:
    calls = []
    for package in _GATEWAY_PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Attribute) and node.attr in _TO_GROUP_COORDINATOR:
                    calls.append(f"{path.relative_to(REPO)}:{node.lineno} {node.attr}")
    assert calls == []


_SERVE_ABORTING = """
import os, sys
from log_store.kafka import gateway_group
def check_group_protocol(settings):
    os.abort()  # as librdkafka's assertion does
gateway_group.check_group_protocol = check_group_protocol
from ops.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_gateway_aborted_in_a_library_call_writes_its_stacks(
    tmp_path: Path, kafka_cluster: Any, kafka_namespace: str
) -> None:
    done = serve_patched(_SERVE_ABORTING, tmp_path, kafka_cluster, kafka_namespace)
    assert done.returncode == -signal.SIGABRT, done.stderr[-3000:]
    assert "Fatal Python error: Aborted" in done.stderr
    assert "gateway_group.py" in done.stderr and "in start" in done.stderr, done.stderr[-3000:]
