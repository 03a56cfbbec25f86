"""The deployment files in ops/deploy are what the docs say: they load and name every part."""

from __future__ import annotations

from pathlib import Path

import yaml

from ingest_api.settings import load_settings

DEPLOY = Path(__file__).resolve().parents[2] / "ops" / "deploy"


def test_gateway_config_of_the_deployment_loads_as_a_kafka_gateway() -> None:
    settings = load_settings(
        config_file=DEPLOY / "gateway.toml",
        env={},
        flags={"advertised_url": "http://gateway1:8080"},  # each gateway's own, as compose gives it
    )
    kafka = settings.kafka_settings()
    assert settings.store == "kafka" and settings.peer_token
    assert kafka.replication_factor == 3 and kafka.min_insync_replicas == 2
    assert kafka.bootstrap.count(",") == 2


def test_compose_file_runs_three_brokers_three_gateways_and_a_balancer() -> None:
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"kafka1", "kafka2", "kafka3", "gateway1", "gateway2", "gateway3", "balancer"} <= set(
        services
    )
    for i in (1, 2, 3):
        assert f"http://gateway{i}:8080" in services[f"gateway{i}"]["command"]
    haproxy = (DEPLOY / "haproxy.cfg").read_text()
    assert all(f"server gateway{i} gateway{i}:8080" in haproxy for i in (1, 2, 3))


def test_the_balancer_may_open_as_many_connections_to_a_gateway_as_it_accepts() -> None:
    """Behind haproxy every client has its address: the per-address cap must not be below
    what haproxy accepts (its global maxconn)."""
    haproxy = (DEPLOY / "haproxy.cfg").read_text()
    maxconn = next(int(line.split()[1]) for line in haproxy.splitlines() if "maxconn" in line)
    settings = load_settings(
        config_file=DEPLOY / "gateway.toml", env={}, flags={"advertised_url": "http://g1:8080"}
    )
    per_client = settings.limits.max_connections_per_client
    assert per_client == 0 or per_client >= maxconn


def test_brokers_of_the_deployment_allow_the_gateways_session_timeout() -> None:
    """The gateways' group asks the brokers for its session timeout (KIP-848 keeps it per
    group); a broker whose floor is above it would keep 45 s and dead gateways' partitions
    would wait that long."""
    session = load_settings(
        config_file=DEPLOY / "gateway.toml",
        env={},
        flags={"advertised_url": "http://gateway1:8080"},
    ).kafka_settings()
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    for i in (1, 2, 3):
        env = compose["services"][f"kafka{i}"]["environment"]
        floor = int(env["KAFKA_GROUP_CONSUMER_MIN_SESSION_TIMEOUT_MS"])
        heartbeat_floor = int(env["KAFKA_GROUP_CONSUMER_MIN_HEARTBEAT_INTERVAL_MS"])
        assert floor <= session.session_timeout_ms
        assert heartbeat_floor <= session.session_timeout_ms // 5
