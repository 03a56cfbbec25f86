"""A gateway on Kafka SIGKILLed between two audit publications: the next one started on its
data dir publishes what it had counted (see tests/audit/test_count_journal.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.audit.test_count_journal import write_then_kill_then_restart
from tests.conftest import GatewayProcess
from tests.kafka.conftest import gateway_config

pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.fault]


def test_a_gateway_on_kafka_killed_between_publications_loses_no_count(
    kafka_cluster: Any, kafka_namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOGBROKER_AUDIT_INTERVAL_S", "3600")
    config = gateway_config(
        tmp_path / "gateway.toml",
        bootstrap=kafka_cluster.bootstrap,
        namespace=kafka_namespace,
        ownership="group",
    )
    started: list[GatewayProcess] = []

    def start() -> GatewayProcess:
        gateway = GatewayProcess(
            tmp_path / "data", ["--config", str(config)], tmp_path / f"gw-{len(started)}.log"
        )
        started.append(gateway)
        return gateway.start(timeout_s=60.0)

    try:
        write_then_kill_then_restart(start(), start, 40)
    finally:
        for gateway in started:
            gateway.kill()
