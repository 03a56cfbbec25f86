"""Partitions whose owner cannot be reached hold back only their own sources.

Two gateways on the session's Kafka; the second one's advertised URL goes through a TCP proxy
the test cuts, so its partitions have an owner (alive in the group) that nobody can reach.  A
write through the first gateway is answered 503 ``partition_unavailable`` naming the sources
on those partitions, the sections of the others written.  A push-client shipping files pinned
to both gateways' partitions keeps shipping the healthy ones meanwhile (before: every file
stalled behind the one request retried whole) and, once the way is back, every line of every
file is in the log exactly once.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from ingest_api.framing import encode_binary
from log_store import LogStore, TopicConfig
from tests.conftest import GatewayProcess, free_port
from tests.gateway.conftest import Client, chunk_data, meta
from tests.kafka.conftest import delivered_lines, gateway_config, source_seqnos, wait_until
from tests.kafka.tcp_proxy import TcpProxy
from tests.push_client.conftest import FAST_FLAGS, LineWriter, PushProcess

pytestmark = pytest.mark.kafka

TOPIC = "dc1.app"
FILES = 10


def _owners(url: str) -> dict[int, str]:
    answer = httpx.get(f"{url}/v1/topics/{TOPIC}/owners", timeout=10)
    if answer.status_code != 200:
        return {}
    return {p["partition"]: (p["owner"] or "").rstrip("/") for p in answer.json()["partitions"]}


def _file_partitions(state: Path) -> dict[str, int]:
    try:
        status = json.loads((state / "status.json").read_bytes())
    except (OSError, ValueError):
        return {}
    return {Path(r["path"]).name: r["partition"] for r in status["files"] if r["partition"] >= 0}


def _file_lines(store: LogStore) -> int:
    """The lines of the tailed files in the log (not those the test wrote itself)."""
    return sum(n for line, n in delivered_lines(store, TOPIC).items() if line.startswith("f"))


def test_files_on_partitions_of_an_unreachable_owner_wait_and_the_others_ship(
    tmp_path: Path,
    start_kafka_gateway: Callable[..., GatewayProcess],
    kafka_cluster: Any,
    kafka_namespace: str,
    kafka_store: LogStore,
) -> None:
    kafka_store.create_topic(TOPIC, TopicConfig(partitions=4))
    first = start_kafka_gateway()
    advertised_port = free_port()
    advertised = f"http://127.0.0.1:{advertised_port}"
    config = gateway_config(
        tmp_path / "gateway-behind-proxy.toml",
        bootstrap=kafka_cluster.bootstrap,
        namespace=kafka_namespace,
        ownership="group",
    )
    second = GatewayProcess(
        tmp_path / "gw-behind-proxy-data",
        ["--config", str(config), "--advertised-url", advertised],
        tmp_path / "gateway-behind-proxy.log",
    )
    way = TcpProxy(advertised_port, second.port).start()
    logs = tmp_path / "logs"
    logs.mkdir()
    writers = [LineWriter(f"f{i}") for i in range(FILES)]
    state = tmp_path / "state"
    push = PushProcess(
        [
            "--server",
            first.url,
            "--log-type",
            "app",
            "--state-dir",
            str(state),
            *FAST_FLAGS,
            str(logs / "*.log"),
        ],
        tmp_path / "push.log",
    )
    client = Client(first.url, timeout_s=60)
    try:
        second.start(timeout_s=60)
        wait_until(
            lambda: set(_owners(first.url).values()) == {first.url, advertised}, 60, "both own"
        )
        for i, writer in enumerate(writers):
            writer.append(logs / f"f{i}.log", 30)
        push.start().wait_started(state)
        wait_until(lambda: _file_lines(kafka_store) == 30 * FILES, 60, "the first lines")
        owners = _owners(first.url)
        wait_until(lambda: len(_file_partitions(state)) == FILES, 10, "the files' partitions")
        partitions = _file_partitions(state)
        cut_off = {i for i in range(FILES) if owners[partitions[f"f{i}.log"]] == advertised}
        assert cut_off and len(cut_off) < FILES, f"files all on one gateway's partitions: {owners}"
        healthy = [i for i in range(FILES) if i not in cut_off]

        sources = {client.session(f"direct-{n}")["partition"]: f"direct-{n}" for n in range(32)}
        on_cut = next(s for p, s in sources.items() if owners[p] == advertised)
        on_first = next(s for p, s in sources.items() if owners[p] == first.url)
        for source in (on_cut, on_first):  # known to the gateway: routed without the owners
            assert [a["status"] for a in client.acks(source, [1])] == ["written"]
        way.cut()  # the second gateway stays in the group: its partitions keep their owner
        # The gateway's answer: the healthy section written, the other one named.
        body = encode_binary(
            [(meta(on_first), [(2, 0, chunk_data(2))]), (meta(on_cut), [(2, 0, chunk_data(2))])]
        )
        refused = client.post_binary(body)
        assert refused.status_code == 503, refused.text
        assert refused.headers.get("Retry-After")
        answer = refused.json()
        assert answer["error"] == "partition_unavailable"
        cut_partition = next(p for p, s in sources.items() if s == on_cut)
        assert _named(answer) == [
            {"topic": TOPIC, "partition": cut_partition, "source_ids": [on_cut]}
        ]
        assert f"{TOPIC}/{cut_partition}" in answer["reason"]
        assert [a["status"] for a in client.acks(on_first, [2])] == ["duplicate"]

        # The push-client: the healthy files ship on, round after round.
        for round_ in range(1, 4):
            for i, writer in enumerate(writers):
                writer.append(logs / f"f{i}.log", 20)
            expected = 30 + 20 * round_

            def healthy_done(expected: int = expected) -> bool:
                counts = delivered_lines(kafka_store, TOPIC)
                return all(
                    sum(1 for line in counts if line.startswith(f"f{i}:")) == expected
                    for i in healthy
                )

            wait_until(healthy_done, 40, f"round {round_} of the healthy files: {push.log()}")
        counts = delivered_lines(kafka_store, TOPIC)
        for i in cut_off:
            assert sum(1 for line in counts if line.startswith(f"f{i}:")) == 30
        assert "has no reachable owner now" in push.log()

        way.restore()
        expected_ids = [line_id for writer in writers for line_id in writer.ids]

        def missing() -> list[str]:
            counts = delivered_lines(kafka_store, TOPIC)
            return [line_id for line_id in expected_ids if line_id not in counts]

        deadline = time.monotonic() + 90
        while missing() and time.monotonic() < deadline:
            time.sleep(0.5)
        lost = missing()
        seqnos = {source[-6:]: found for source, found in source_seqnos(kafka_store, TOPIC).items()}
        assert not lost, (
            f"{len(lost)} lines missing, e.g. {lost[:3]} {lost[-3:]}; partitions {partitions}, "
            f"seqnos {seqnos}; "
            f"cut off {sorted(cut_off)}; {push.log()[-1500:]}"
        )
        counts = delivered_lines(kafka_store, TOPIC)
        twice = [line_id for line_id in expected_ids if counts[line_id] != 1]
        assert not twice, f"{len(twice)} lines more than once, e.g. {twice[:5]}"
        assert _file_lines(kafka_store) == 90 * FILES
        assert "takes writes again" in push.log()
    finally:
        client.close()
        push.kill()
        way.close()
        second.kill()


def _named(answer: dict[str, Any]) -> list[dict[str, Any]]:
    """The partitions a 503 names, without their reasons (each names its own partition)."""
    for named in answer["partitions"]:
        assert f"{named['topic']}/{named['partition']}" in named["reason"], named
    return [{k: v for k, v in named.items() if k != "reason"} for named in answer["partitions"]]
