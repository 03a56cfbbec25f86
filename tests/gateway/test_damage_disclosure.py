"""Who learns of a damaged partition, behind a real gateway with tokens: tenant B's topic
``dc1.web`` lost acknowledged data of one partition while the gateway was down, and B's group
reads it.  The public ``/readyz`` counts the damage and names nothing; a metrics or admin
token gets the partitions and reasons.  The dashboard's overview still answers every token:
B and the admin see the damaged partition as a row that says so, tenant A nothing of B's
topic.  B's group describes its other partitions."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from ingest_api.framing import BINARY_MEDIA_TYPE, encode_binary
from session_dedup.pinning import stable_partition
from tests.conftest import REPO, GatewayProcess, logbroker_cmd
from tests.gateway.conftest import chunk_data, meta

A_TOKEN = "tenant-a-secret"
B_TOKEN = "tenant-b-secret"
METRICS_TOKEN = "monitor-secret"
ADMIN_TOKEN = "operator-secret"
CONFIG = f"""
push_allow = ["127.0.0.1"]

[tokens.{A_TOKEN}]
name = "tenant-a"
write = ["app"]
read = ["dc1.app"]

[tokens.{B_TOKEN}]
name = "tenant-b"
write = ["web"]
read = ["dc1.web"]

[tokens.{METRICS_TOKEN}]
name = "monitor"
metrics = true

[tokens.{ADMIN_TOKEN}]
name = "operator"
admin = true
"""
TOPIC = "dc1.web"
PARTITIONS = 4
GROUP = "g1"
SUBSCRIPTION = "hook"
SOURCES = [f"w{i}" for i in range(12)]
SEQNOS = [1, 2, 3]
DAMAGED = stable_partition(SOURCES[0], PARTITIONS)
WAIT_S = 30.0


@dataclass
class Installation:
    gateway: GatewayProcess
    data_dir: Path
    token_dir: Path


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def write(gateway: GatewayProcess, token: str, log_type: str, sources: list[str]) -> None:
    sections = [(meta(s, log_type), [(n, 0, chunk_data(n)) for n in SEQNOS]) for s in sources]
    answer = httpx.post(
        gateway.url + "/v1/write",
        content=encode_binary(sections),
        headers={**auth(token), "content-type": BINARY_MEDIA_TYPE},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text


def read_as_group(gateway: GatewayProcess, token_file: Path) -> None:
    """A real ``logbroker read`` of the group: it reads everything and commits."""
    args = ["--topic", TOPIC, "--group", GROUP, "--from-beginning", "--idle-exit", "1"]
    done = subprocess.run(
        logbroker_cmd("read", "--server", gateway.url, *args, "--token-file", str(token_file)),
        capture_output=True,
        cwd=REPO,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")


def damaged_installation(base: Path) -> Installation:
    """A gateway with tokens whose ``dc1.web`` partition ``DAMAGED`` lost acknowledged data
        while the gateway was down (its segment cut below what its index says was synced), and
        that has noticed it (``/readyz``); B's group ``g1`` had read and committed everything, and
    B has a push subscription ``hook`` of the topic (to an endpoint that answers nothing)."""
    config = base / "gateway.toml"
    config.write_text(CONFIG)
    token_file = base / "b.token"
    token_file.write_text(B_TOKEN)
    token_file.chmod(0o600)
    data_dir = base / "data"
    gateway = GatewayProcess(data_dir, ["--config", str(config)], base / "gw.log").start()
    try:
        write(gateway, A_TOKEN, "app", ["a0", "a1"])
        write(gateway, B_TOKEN, "web", SOURCES)
        read_as_group(gateway, token_file)
        subscription = {"name": SUBSCRIPTION, "endpoint": "http://127.0.0.1:9/", "topics": [TOPIC]}
        created = httpx.post(
            gateway.url + "/v1/subscriptions", json=subscription, headers=auth(B_TOKEN), timeout=30
        )
        assert created.status_code == 201, created.text
        assert gateway.stop() == 0
        (partition_dir,) = (data_dir / "topics" / TOPIC).glob(f"*/{DAMAGED}")
        (segment,) = partition_dir.glob("*.log")
        with open(segment, "r+b") as f:
            f.truncate(segment.stat().st_size - 5)
        gateway.start()
        deadline = time.monotonic() + WAIT_S
        while "damaged_partitions" not in (ready := readyz(gateway, ADMIN_TOKEN)):
            assert time.monotonic() < deadline, ready
            time.sleep(0.1)
    except BaseException:
        gateway.kill()
        raise
    return Installation(gateway, data_dir, base)


@pytest.fixture(scope="module")
def installation(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installation]:
    found = damaged_installation(tmp_path_factory.mktemp("damaged"))
    try:
        yield found
    finally:
        found.gateway.kill()


def readyz(gateway: GatewayProcess, token: str | None) -> dict[str, Any]:
    answer = httpx.get(gateway.url + "/readyz", headers=auth(token) if token else {}, timeout=30)
    assert answer.status_code == 200, answer.text  # one damaged partition: still ready
    body: dict[str, Any] = answer.json()
    return body


def overview(gateway: GatewayProcess, token: str) -> httpx.Response:
    answer = httpx.get(gateway.url + "/v1/ui/overview", headers=auth(token), timeout=30)
    assert answer.status_code == 200, answer.text
    return answer


def test_public_readyz_counts_damaged_partitions_and_names_them_to_metrics_and_admin_tokens(
    installation: Installation,
) -> None:
    """Before: anyone who reached the port read every tenant's damaged partitions, with
    reasons holding the data dir's path."""
    gateway = installation.gateway
    for token in (None, A_TOKEN, B_TOKEN, "not-a-configured-token"):
        answer = httpx.get(
            gateway.url + "/readyz", headers=auth(token) if token else {}, timeout=30
        )
        assert answer.status_code == 200, answer.text  # the same for every caller
        assert answer.json() == {"status": "ready", "dc": "dc1", "damaged_partitions": 1}
        assert TOPIC not in answer.text and str(installation.data_dir) not in answer.text
    for token in (METRICS_TOKEN, ADMIN_TOKEN):
        (named,) = readyz(gateway, token)["damaged_partitions"]
        assert (named["topic"], named["partition"]) == (TOPIC, DAMAGED)
        assert "acknowledged data is missing" in named["reason"]


def test_the_overview_shows_a_damaged_partition_as_a_row_only_to_tokens_that_read_it(
    installation: Installation,
) -> None:
    """Before: every token's overview, the admin's included, was a 503 naming B's topic."""
    gateway = installation.gateway

    seen_by_a = overview(gateway, A_TOKEN)
    assert TOPIC not in seen_by_a.text and "acknowledged data" not in seen_by_a.text
    assert [t["name"] for t in seen_by_a.json()["topics"]] == ["dc1.app"]
    assert seen_by_a.json()["groups"] == [] and seen_by_a.json()["subscriptions"] == []
    assert seen_by_a.json()["topics"][0]["damaged_partitions"] == 0

    for token in (B_TOKEN, ADMIN_TOKEN):
        doc = overview(gateway, token).json()
        (web,) = [t for t in doc["topics"] if t["name"] == TOPIC]
        assert web["damaged_partitions"] == 1
        parts = {p["partition"]: p for p in web["partitions"]}
        assert sorted(parts) == list(range(PARTITIONS))
        assert "acknowledged data is missing" in parts[DAMAGED]["damaged"]
        assert all("damaged" not in p for n, p in parts.items() if n != DAMAGED)

        (group,) = [g for g in doc["groups"] if g["group"] == GROUP]
        lags = {p["partition"]: p for p in group["partitions"]}
        assert sorted(lags) == list(range(PARTITIONS))
        assert lags[DAMAGED]["lag"] is None
        assert "acknowledged data is missing" in lags[DAMAGED]["damaged"]
        assert all(p["lag"] == 0 for n, p in lags.items() if n != DAMAGED)
        assert group["lag"] == 0

        (hook,) = [s for s in doc["subscriptions"] if s["name"] == SUBSCRIPTION]
        pushed = {p["partition"]: p for p in hook["partitions"]}
        assert sorted(pushed) == list(range(PARTITIONS))
        assert pushed[DAMAGED]["lag"] is None
        assert "acknowledged data is missing" in pushed[DAMAGED]["damaged"]
        assert all("damaged" not in p for n, p in pushed.items() if n != DAMAGED)


def test_a_groups_description_marks_its_damaged_partition_and_describes_the_others(
    installation: Installation,
) -> None:
    """Before: ``GET /v1/groups/g1`` was a 503 for the damaged partition alone."""
    answer = httpx.get(
        f"{installation.gateway.url}/v1/groups/{GROUP}", headers=auth(B_TOKEN), timeout=30
    )
    assert answer.status_code == 200, answer.text
    parts = {p["partition"]: p for p in answer.json()["partitions"]}
    assert sorted(parts) == list(range(PARTITIONS))
    assert parts[DAMAGED]["end_offset"] is None and parts[DAMAGED]["lag"] is None
    assert "acknowledged data is missing" in parts[DAMAGED]["damaged"]
    assert all(p["lag"] == 0 and "damaged" not in p for n, p in parts.items() if n != DAMAGED)


def test_a_mirror_report_of_a_token_that_replicates_nothing_says_so(
    installation: Installation,
) -> None:
    """Before: ``this token may not replicate into topic None``."""
    report = {
        "client": "mirror-a",
        "partitions": [{"topic": "dc1.app", "partition": 0, "position": 3, "source_end_offset": 5}],
    }
    answer = httpx.post(
        installation.gateway.url + "/v1/mirrors/status",
        json=report,
        headers=auth(A_TOKEN),
        timeout=30,
    )
    assert answer.status_code == 403, answer.text
    assert answer.json()["reason"] == (
        "this token may replicate into no topic (it has no replicate globs)"
    )
