"""A Kafka bootstrap host whose name does not resolve is a mistake told at once, not a
cluster waited for: ``logbroker serve`` exits 2 naming the host.  No broker is needed: the
names are under ``.invalid``, which no resolver knows (RFC 6761)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from log_store.errors import BadRequest
from log_store.kafka.bootstrap import BootstrapServer, bootstrap_servers, check_bootstrap_names
from tests.conftest import REPO, free_port, logbroker_cmd

QUICK_S = 20.0
"""Far less than a wait for an unreachable broker, which never ends by itself."""


def _serve(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        logbroker_cmd(
            "serve", "--data-dir", str(tmp_path / "data"), "--port", str(free_port()), *args
        ),
        cwd=REPO, capture_output=True, text=True, timeout=QUICK_S,
    )  # fmt: skip


def test_serve_with_a_bootstrap_host_that_does_not_resolve_exits_2_naming_it(
    tmp_path: Path,
) -> None:
    try:
        done = _serve(tmp_path, "--store", "kafka", "--kafka-bootstrap", "kafka1.invalid:9092")
    except subprocess.TimeoutExpired:
        pytest.fail(f"serve was still waiting after {QUICK_S:g} s, as for a broker that is down")
    assert done.returncode == 2, done.stderr
    assert "no such host: kafka1.invalid" in done.stderr, done.stderr
    assert "waiting for Kafka" not in done.stderr


def test_serve_refuses_an_unknown_bootstrap_host_from_its_configuration_file(
    tmp_path: Path,
) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text('store = "kafka"\nkafka_bootstrap = "kafka1.invalid:9092,kafka2.invalid"\n')
    done = _serve(tmp_path, "--config", str(config))
    assert done.returncode == 2, done.stderr
    assert "no such host: kafka1.invalid, kafka2.invalid" in done.stderr, done.stderr


def test_an_unknown_host_beside_known_ones_is_named_but_not_refused() -> None:
    """The others may be a working cluster: a broker container that is down has no name."""
    assert check_bootstrap_names("localhost:9092,kafka2.invalid:9092") == ["kafka2.invalid"]
    assert check_bootstrap_names("localhost:9092,127.0.0.1:9093,[::1]:9094") == []


def test_a_bootstrap_port_that_is_no_number_is_refused() -> None:
    with pytest.raises(BadRequest, match="port must be a number"):
        check_bootstrap_names("localhost:90x2")


def test_bootstrap_servers_are_read_as_librdkafka_reads_them() -> None:
    assert bootstrap_servers("SASL_SSL://k1:9093, k2,[::1]:9094,") == [
        BootstrapServer("k1", 9093),
        BootstrapServer("k2", 9092),
        BootstrapServer("::1", 9094),
    ]


def test_the_offline_commands_refuse_an_unknown_bootstrap_host_at_once() -> None:
    """``topics`` (like ``audit``) opens the store on Kafka itself: it said "Broker transport
    failure" after waiting 15 s."""
    started = time.monotonic()
    done = subprocess.run(
        logbroker_cmd("topics", "--kafka-bootstrap", "kafka1.invalid:9092", "list"),
        cwd=REPO, capture_output=True, text=True, timeout=QUICK_S,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "no such host: kafka1.invalid" in done.stderr, done.stderr
    assert time.monotonic() - started < 10


@pytest.mark.parametrize(
    ("prop", "said"),
    [
        ('"no.such.property" = "1"', 'No such configuration property: "no.such.property"'),
        ('"linger.ms" = "abc"', "Invalid value for configuration property"),
    ],
)
def test_a_kafka_property_librdkafka_refuses_is_a_message_and_exit_2(
    tmp_path: Path, prop: str, said: str
) -> None:
    """``[kafka.properties]`` are passed to librdkafka as they are: one it refuses used to end
    ``serve`` (and ``topics``, ``audit``) with a traceback and exit 1."""
    config = tmp_path / "gateway.toml"
    config.write_text(
        f'store = "kafka"\nkafka_bootstrap = "127.0.0.1:9"\n[kafka.properties]\n{prop}\n'
    )
    done = _serve(tmp_path, "--config", str(config))
    assert done.returncode == 2, done.stderr
    assert f"logbroker serve: Kafka client settings: {said}" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    listed = subprocess.run(
        logbroker_cmd(
            "topics", "--kafka-bootstrap", "127.0.0.1:9", "--kafka-property",
            prop.replace('"', "").replace(" = ", "="), "list",
        ),
        cwd=REPO, capture_output=True, text=True, timeout=QUICK_S,
    )  # fmt: skip
    assert listed.returncode == 2, listed.stderr
    assert f"Kafka client settings: {said}" in listed.stderr, listed.stderr
