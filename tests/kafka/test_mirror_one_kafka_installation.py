"""Two gateways of one Kafka installation are one installation to ``logbroker mirror``."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

import httpx

from tests.conftest import REPO, GatewayProcess, logbroker_cmd
from tests.gateway.conftest import Client


def _ends(url: str, topic: str) -> list[int]:
    info = httpx.get(f"{url}/v1/topics/{topic}", timeout=30).json()
    return [p["end_offset"] for p in info["partitions"]]


def test_a_mirror_between_two_gateways_of_one_kafka_installation_exits_2_and_copies_nothing(
    start_kafka_gateway: Callable[..., GatewayProcess],
) -> None:
    one, two = start_kafka_gateway(), start_kafka_gateway()
    said = [httpx.get(f"{g.url}/healthz", timeout=30).json()["installation"] for g in (one, two)]
    assert said[0] == said[1] and isinstance(said[0], str)
    client = Client(one.url)
    try:
        assert client.write("src", list(range(1, 11))).status_code == 200
    finally:
        client.close()
    before = _ends(one.url, "dc1.app")
    mirror = subprocess.run(
        logbroker_cmd(
            "mirror", "--from", one.url, "--to", two.url, "--prefix", "dc1.", "--idle-exit", "2"
        ),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,  # the old mirror copied into its own installation for ever
    )  # fmt: skip
    assert mirror.returncode == 2, mirror.stderr[-3000:]
    assert "--from and --to are the same installation" in mirror.stderr
    assert _ends(two.url, "dc1.app") == before
