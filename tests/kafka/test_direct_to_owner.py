"""A push-client with ``direct_to_owner`` sends each source to its partition's owner gateway.

Two real gateways in one gateways' group; the client is given only the first.  It learns the
owners (``GET /v1/owners``) and sends the sections of sources on the second gateway's
partitions straight there.  Proof, from the gateways' own counters: each gateway's chunks
written (counted where a request arrives) equal the chunks that landed in the partitions it
owns, so no chunk passed through the other gateway.  Then the second gateway is SIGKILLed while
the files grow: the client falls back to the first, and every line is in the log once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from log_store import LogStore, TopicConfig
from log_store.kafka import KafkaSettings
from log_store.kafka.owner_directory import OwnerDirectory
from tests.conftest import GatewayProcess, free_port
from tests.kafka.conftest import delivered_lines, envelopes, source_seqnos, wait_until
from tests.push_client.conftest import FAST_FLAGS, LineWriter, PushProcess

pytestmark = [pytest.mark.kafka, pytest.mark.fault]

TOPIC = "dc1.app"
PARTITIONS = 8
FILES = 24  # sources: with 8 partitions, both gateways' partitions get some


def _samples(url: str, name: str) -> dict[str, float]:
    """Prometheus samples of ``name`` at ``url``: label text -> value."""
    found: dict[str, float] = {}
    for line in httpx.get(url, timeout=10).text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            key, _, value = line.rpartition(" ")
            found[key[len(name) :]] = float(value)
    return found


def _written_chunks(gateway: GatewayProcess) -> float:
    """Chunks of the topic this gateway wrote for requests it received (forwarded or not)."""
    samples = _samples(gateway.url + "/metrics", "logbroker_chunks_total")
    return sum(v for k, v in samples.items() if f'topic="{TOPIC}"' in k and "written" in k)


def _chunks_per_partition(store: LogStore) -> dict[int, int]:
    return {p: len(records) for p, records in envelopes(store, TOPIC).items()}


def _owned(directory: OwnerDirectory) -> dict[int, str]:
    return {p: u.rstrip("/") for (t, p), u in directory.snapshot().items() if t == TOPIC}


def _direct_push(
    tmp_path: Path, server: str, log_dir: Path, *, refresh_s: float
) -> tuple[PushProcess, str]:
    """A push-client (not started) of ``log_dir/*.log`` given only ``server``, sending to any
    loopback owner; and its metrics URL."""
    metrics_port = free_port()
    push = PushProcess(
        [
            "--server",
            server,
            "--log-type",
            "app",
            "--state-dir",
            str(tmp_path / "state"),
            "--direct-to-owner",
            "http://127.0.0.1:*",
            "--owner-refresh",
            str(refresh_s),
            "--metrics-port",
            str(metrics_port),
            *FAST_FLAGS,
            str(log_dir / "*.log"),
        ],
        tmp_path / "push.log",
    )
    return push, f"http://127.0.0.1:{metrics_port}/metrics"


def test_sources_go_to_their_owner_directly_and_fall_back_when_it_is_killed(
    start_kafka_gateway: Callable[..., GatewayProcess],
    kafka_store: LogStore,
    kafka_cluster: Any,
    kafka_namespace: str,
    tmp_path: Path,
) -> None:
    kafka_store.create_topic(TOPIC, TopicConfig(partitions=PARTITIONS))
    first = start_kafka_gateway()
    second = start_kafka_gateway()
    directory = OwnerDirectory(
        KafkaSettings(kafka_cluster.bootstrap, namespace=kafka_namespace), self_url=""
    )
    directory.start()
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    writers = [LineWriter(f"f{i}", pad=40) for i in range(FILES)]
    paths = [log_dir / f"app-{i}.log" for i in range(FILES)]
    for writer, path in zip(writers, paths, strict=True):
        writer.append(path, 100)
    push, push_metrics = _direct_push(tmp_path, first.url, log_dir, refresh_s=2)

    def all_lines() -> int:
        return sum(len(w.ids) for w in writers)

    def delivered() -> bool:
        return len(delivered_lines(kafka_store, TOPIC)) >= all_lines()

    def settled() -> tuple[float, float, dict[int, int]]:
        """Once every chunk of the log is counted by the gateway that received it."""
        counts = _chunks_per_partition(kafka_store)
        sent = (_written_chunks(first), _written_chunks(second))
        assert sum(sent) <= sum(counts.values())
        return (*sent, counts) if sum(sent) == sum(counts.values()) else ()  # type: ignore[return-value]

    try:
        wait_until(
            lambda: (
                len(_owned(directory)) == PARTITIONS and len(set(_owned(directory).values())) == 2
            ),
            60,
            "both gateways to own partitions of the topic",
        )
        push.start()
        wait_until(delivered, 90, f"the first lines (push log: {push.log()[-1500:]})")
        wait_until(
            lambda: (
                sum(_samples(push_metrics, "logbroker_push_owner_partitions").values())
                == PARTITIONS
            ),
            30,
            "the client to know every partition's owner",
        )
        # A gateway of a loaded machine may miss its group's session timeout and lose its
        # partitions meanwhile: a round is measured again until ownership held still.
        for _round in range(3):
            owners = _owned(directory)
            sent_first, sent_second, before = wait_until(settled, 30, "counters to settle")
            for writer, path in zip(writers, paths, strict=True):
                writer.append(path, 100)
            wait_until(delivered, 60, f"the round's lines (push log: {push.log()[-1500:]})")
            after_first, after_second, after = wait_until(settled, 30, "counters to settle")
            if _owned(directory) == owners and len(owners) == PARTITIONS:
                break
        landed = {p: after.get(p, 0) - before.get(p, 0) for p in after}
        received = {first.url: after_first - sent_first, second.url: after_second - sent_second}
        for url, sent in received.items():
            theirs = sum(n for p, n in landed.items() if owners.get(p) == url)
            # every chunk landing in its partitions was received by it: none was forwarded
            assert sent == theirs, (url, received, landed, owners)
        # the client was given only the first gateway: the second's chunks came directly
        assert received[second.url] > 0, (received, landed, owners)
        direct = _samples(push_metrics, "logbroker_push_owner_writes_total")
        assert direct.get('{outcome="owner"}', 0) > 0, direct

        # SIGKILL the owner the client was not configured with, while the files grow
        stop = threading.Event()

        def keep_writing() -> None:
            while not stop.is_set():
                for writer, path in zip(writers, paths, strict=True):
                    writer.append(path, 5)
                time.sleep(0.05)

        thread = threading.Thread(target=keep_writing)
        thread.start()
        try:
            time.sleep(0.5)  # lines keep arriving while the owner dies
            second.kill()
            wait_until(
                lambda: (
                    _samples(push_metrics, "logbroker_push_owner_writes_total").get(
                        '{outcome="fallback"}', 0
                    )
                    > 0
                ),
                30,
                "a write to the killed owner to fall back",
            )
        finally:
            stop.set()
            thread.join(10)
        wait_until(delivered, 90, f"every line after the kill (push log: {push.log()[-1500:]})")
    finally:
        push.kill()
        directory.stop()
    counts = delivered_lines(kafka_store, TOPIC)
    assert not [i for i, c in counts.items() if c > 1], "a line arrived twice"
    assert set(counts) == {i for w in writers for i in w.ids}
    for _partitions, seqnos in source_seqnos(kafka_store, TOPIC).values():
        assert seqnos == sorted(set(seqnos))


def test_a_gateway_joining_takes_its_sources_directly_at_once_not_at_the_next_refresh(
    start_kafka_gateway: Callable[..., GatewayProcess],
    kafka_store: LogStore,
    kafka_cluster: Any,
    kafka_namespace: str,
    tmp_path: Path,
) -> None:
    """The client learned one gateway as every partition's owner and refreshes its map only
    every 600 s.  A second gateway joins and takes half of the partitions: the first answers
    the writes it now forwards with ``Logbroker-Forwarded``, the client asks for the map again
    at once, and the second gateway receives its sources' writes directly within a minute.
    Every line once."""
    kafka_store.create_topic(TOPIC, TopicConfig(partitions=PARTITIONS))
    first = start_kafka_gateway()
    directory = OwnerDirectory(
        KafkaSettings(kafka_cluster.bootstrap, namespace=kafka_namespace), self_url=""
    )
    directory.start()
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    writers = [LineWriter(f"j{i}", pad=40) for i in range(FILES)]
    paths = [log_dir / f"app-{i}.log" for i in range(FILES)]

    def append(lines: int) -> None:
        for writer, path in zip(writers, paths, strict=True):
            writer.append(path, lines)

    def delivered() -> bool:
        return len(delivered_lines(kafka_store, TOPIC)) >= sum(len(w.ids) for w in writers)

    append(50)
    push, push_metrics = _direct_push(tmp_path, first.url, log_dir, refresh_s=600)
    try:
        wait_until(lambda: len(_owned(directory)) == PARTITIONS, 60, "the first to own all")
        push.start()
        wait_until(delivered, 90, f"the first lines (push log: {push.log()[-1500:]})")
        wait_until(
            lambda: (
                sum(_samples(push_metrics, "logbroker_push_owner_partitions").values())
                == PARTITIONS
            ),
            30,
            "the client to know every partition's owner",
        )
        second = start_kafka_gateway()
        wait_until(lambda: len(set(_owned(directory).values())) == 2, 60, "the second to own some")
        deadline = time.monotonic() + 60
        while _written_chunks(second) == 0:
            assert time.monotonic() < deadline, "the client never sent to the new owner"
            append(5)
            time.sleep(0.2)
        wait_until(delivered, 90, f"every line (push log: {push.log()[-1500:]})")
    finally:
        push.kill()
        directory.stop()
    counts = delivered_lines(kafka_store, TOPIC)
    assert not [i for i, c in counts.items() if c > 1], "a line arrived twice"
    assert set(counts) == {i for w in writers for i in w.ids}
