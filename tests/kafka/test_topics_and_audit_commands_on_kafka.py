"""``logbroker topics`` and ``logbroker audit`` reaching Kafka themselves (``--kafka-bootstrap``).

They list what a gateway lists (``--server``), refuse to touch the internal topics a gateway
refuses (and Kafka's ``__`` topics, reachable through a namespace, and the audit topic's
records), and with no broker to reach say so in one line within seconds: they used to wait
15 s, printing about 120 lines of librdkafka's ``%3|...|FAIL|`` on stderr.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from subprocess import PIPE
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from log_store import LogStore, TopicConfig, UnknownTopic
from log_store.kafka import KafkaSettings, open_kafka_store
from tests.conftest import REPO, GatewayProcess, free_port, logbroker_cmd
from tests.gateway.conftest import Client

QUICK_S = 25.0
"""Four commands started at once, each giving up after 5 s without a broker: far below
librdkafka's own minutes.  At a load average of 30 they took 16.7 s (Python's start-up and
imports, four times, on two shared cores)."""
"""Less than the 15 s the commands waited for an unreachable broker (each gives up after 5
s now; the rest is a Python start, which a loaded host stretches: 11.7 s at load 40)."""


def test_commands_that_cannot_reach_kafka_say_so_in_one_line_within_seconds(
    tmp_path: Path,
) -> None:
    bootstrap = f"127.0.0.1:{free_port()}"  # nothing listens there
    commands = [
        ("topics", "--kafka-bootstrap", bootstrap, "list"),
        ("topics", "--kafka-bootstrap", bootstrap, "delete", "dc1.app"),
        ("audit", "--kafka-bootstrap", bootstrap),
        ("audit", "--windows", "--kafka-bootstrap", bootstrap, "--db", str(tmp_path / "a.db")),
    ]
    started = time.monotonic()
    running = {
        args: subprocess.Popen(logbroker_cmd(*args), cwd=REPO, stdout=PIPE, stderr=PIPE, text=True)
        for args in commands
    }
    for args, proc in running.items():
        _out, err = proc.communicate(timeout=60)
        assert proc.returncode == 2, (args, err)
        assert err.count("\n") == 1 and "%3|" not in err, (args, err)
        assert re.fullmatch(
            rf"logbroker {args[0]}: cannot reach Kafka at {bootstrap}: "
            r".*Connection refused.* \(no broker answered within 5 s\)\n",
            err,
        ), (args, err)
    assert time.monotonic() - started < QUICK_S


def _topics(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        logbroker_cmd("topics", *args), cwd=REPO, capture_output=True, text=True, timeout=60
    )


@pytest.mark.kafka
def test_topics_on_kafka_lists_what_a_gateway_lists(
    start_kafka_gateway: Callable[..., GatewayProcess],
    kafka_store: LogStore,
    kafka_cluster: Any,
    kafka_namespace: str,
) -> None:
    gateway = start_kafka_gateway()
    client = Client(gateway.url)
    try:
        assert client.write("s1", [10, 20]).status_code == 200
    finally:
        client.close()
    kafka_store.create_topic("dc1.logbroker-audit", TopicConfig(partitions=1), exist_ok=True)
    kafka = ["--kafka-bootstrap", kafka_cluster.bootstrap, "--kafka-namespace", kafka_namespace]

    through_gateway = _topics("--server", gateway.url, "list")
    direct = _topics(*kafka, "list")
    assert through_gateway.returncode == 0, through_gateway.stderr
    assert direct.returncode == 0, direct.stderr
    # the same lines (partitions, offsets, sizes unknown: "-"), but for the settings the
    # gateway's read API does not show; no audit or internal topic in either
    settings = re.compile(r"  retention_ms=\S+  retention_bytes=\S+$", re.MULTILINE)
    assert settings.sub("", direct.stdout) == through_gateway.stdout
    assert through_gateway.stdout.startswith("dc1.app  id=")
    assert through_gateway.stdout.count("id=") == 1
    for where in (kafka, ["--server", gateway.url]):
        assert "dc1.logbroker-audit" in _topics(*where, "list", "--all").stdout


@pytest.mark.kafka
def test_topics_on_kafka_keeps_off_internal_topics_and_the_audit_topic(
    kafka_store: LogStore, kafka_cluster: Any, kafka_namespace: str
) -> None:
    kafka_store.create_topic("dc1.logbroker-audit", TopicConfig(partitions=1))
    owners = f"__{kafka_namespace}logbroker-owners"  # as the namespace's gateways make it
    admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap, "log_level": 0})
    admin.create_topics([NewTopic(owners, num_partitions=1)])[owners].result(timeout=30)
    kafka = ["--kafka-bootstrap", kafka_cluster.bootstrap, "--kafka-namespace"]

    audit = _topics(*kafka, kafka_namespace, "delete", "dc1.logbroker-audit")
    assert audit.returncode == 2, audit.stdout + audit.stderr
    assert "dc1.logbroker-audit is the audit topic" in audit.stderr
    assert kafka_store.describe_topic("dc1.logbroker-audit").config.partitions == 1
    # its retention may be bounded all the same
    bounded = _topics(*kafka, kafka_namespace, "alter", "dc1.logbroker-audit",
                      "--retention-hours", "48")  # fmt: skip
    assert bounded.returncode == 0, bounded.stderr

    # the owners topic, reached through a namespace starting with "__"
    for namespace, args in (
        (f"__{kafka_namespace}", ("delete", "logbroker-owners")),
        (f"__{kafka_namespace}", ("alter", "logbroker-owners", "--retention-hours", "1")),
        ("__", ("create", "x.y")),
    ):
        refused = _topics(*kafka, namespace, *args)
        assert refused.returncode == 2, (args, refused.stdout + refused.stderr)
        assert "an internal topic (of Kafka or of a logbroker installation)" in refused.stderr
    assert owners in admin.list_topics(timeout=10).topics
    # and the library below refuses it too
    store = open_kafka_store(
        KafkaSettings(kafka_cluster.bootstrap, namespace=f"__{kafka_namespace}")
    )
    try:
        with pytest.raises(UnknownTopic, match="is an internal topic"):
            store.describe_topic("logbroker-owners")
    finally:
        store.close()


@pytest.mark.kafka
def test_audit_of_a_namespace_without_logbroker_topics_is_not_ok(
    kafka_cluster: Any, kafka_namespace: str, tmp_path: Path
) -> None:
    kafka = ["--kafka-bootstrap", kafka_cluster.bootstrap, "--kafka-namespace", kafka_namespace]
    for args in (kafka, ["--windows", *kafka, "--db", str(tmp_path / "a.db")]):
        done = subprocess.run(
            logbroker_cmd("audit", *args), cwd=REPO, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 2, (args, done.stdout + done.stderr)
        assert "audit: OK" not in done.stdout and done.stderr.count("\n") == 1, done.stderr
        assert f"namespace {kafka_namespace!r}" in done.stderr, done.stderr
