"""Writes forwarded between gateways: batched per owner, and exactly once when the owner dies.

Two real gateways in one gateways' group; the client writes only through the first, so every
section of a partition the second owns is forwarded to it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import zstandard

from audit.publisher import INTERVAL_ENV
from ingest_api.framing import BINARY_MEDIA_TYPE, encode_binary
from log_store import LogStore, TopicConfig
from log_store.kafka import KafkaSettings
from log_store.kafka.owner_directory import OwnerDirectory
from session_dedup.chunk_codecs import decompress
from session_dedup.pinning import stable_partition
from tests.conftest import GatewayProcess, free_port
from tests.gateway.conftest import Client, chunk_data, meta
from tests.kafka.conftest import envelopes, metric, source_seqnos, wait_until
from tests.kafka.tcp_proxy import TcpProxy

pytestmark = pytest.mark.kafka


def _both_own_partitions(gateways: list[GatewayProcess]) -> bool:
    return all((metric(g.url, "logbroker_kafka_owned_partitions") or 0) > 0 for g in gateways)


def _owners_directory(kafka_cluster: Any, namespace: str) -> OwnerDirectory:
    """The owners' topic as every gateway tails it (which gateway owns which partition)."""
    directory = OwnerDirectory(
        KafkaSettings(kafka_cluster.bootstrap, namespace=namespace), self_url=""
    )
    directory.start()
    return directory


def _owned_by(directory: OwnerDirectory, gateway: GatewayProcess, topic: str) -> set[int]:
    url = gateway.url.rstrip("/")
    return {p for (t, p), u in directory.snapshot().items() if t == topic and u.rstrip("/") == url}


def _acked(response: httpx.Response) -> bool:
    """Every chunk of the request answered written or duplicate."""
    if response.status_code != 200:
        return False
    return all(
        a["status"] in ("written", "duplicate")
        for r in response.json()["results"]
        for a in r["acks"]
    )


def test_one_request_forwards_each_owners_sections_in_one_peer_request(
    start_kafka_gateway: Callable[..., GatewayProcess],
    kafka_store: LogStore,
    kafka_cluster: Any,
    kafka_namespace: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The gateways' audit counts are written like any other chunk, forwarded to the owner of
    # their partition when it is the other gateway: on a loaded machine a flush fell inside
    # the measured write and the first gateway "received" batches.  Not flushed here.
    monkeypatch.setenv(INTERVAL_ENV, "3600")
    # 8 data partitions and the group's 4 internal ones: each gateway is given 6, so the
    # second owns at least 2 partitions of the topic
    kafka_store.create_topic("dc1.app", TopicConfig(partitions=8))
    first = start_kafka_gateway()
    second = start_kafka_gateway()
    client = Client(first.url)
    directory = _owners_directory(kafka_cluster, kafka_namespace)
    # two sources for each partition (new sources are pinned by stable_partition)
    pinned: dict[str, int] = {}
    for i in range(1000):
        partition = stable_partition(f"fw-{i}", 8)
        if list(pinned.values()).count(partition) < 2:
            pinned[f"fw-{i}"] = partition
    sources = list(pinned)
    assert len(sources) == 16
    try:
        wait_until(
            lambda: (
                sum(t == "dc1.app" for t, _p in directory.snapshot()) == 8
                and len(_owned_by(directory, second, "dc1.app")) >= 2
                and len(_owned_by(directory, first, "dc1.app")) >= 1
            ),
            60,
            "both gateways to own partitions of the topic",
        )
        # every source gets its first state (and its pin confirmed) before the measured write
        first_body = encode_binary([(meta(s), [(1, 0, chunk_data(1))]) for s in sources])
        assert _acked(client.post_binary(first_body))
        counters = (
            "logbroker_kafka_peer_batches",
            "logbroker_kafka_peer_batched_transactions",
        )

        def forwarded() -> list[float]:
            return [metric(g.url, name) or 0.0 for g in (first, second) for name in counters]

        # A gateway of a loaded machine may miss its group's session timeout and lose its
        # partitions in the middle: a write is measured again until ownership held still.
        last_seqno = 1
        for seqno in range(2, 7):
            last_seqno = seqno
            theirs = _owned_by(directory, second, "dc1.app")
            before = forwarded()
            body = encode_binary([(meta(s), [(seqno, 0, chunk_data(seqno))]) for s in sources])
            response = client.post_binary(body)
            assert _acked(response), response.text
            after = forwarded()
            if _owned_by(directory, second, "dc1.app") == theirs:
                break
    finally:
        client.close()
        directory.stop()
    delta = [b - a for a, b in zip(before, after, strict=True)]
    # the first gateway receives nothing; the second one request carrying one transaction per
    # partition of its own that the request touched (every partition has sources)
    assert delta == [0.0, 0.0, 1.0, float(len(theirs))], (delta, theirs)
    found = source_seqnos(kafka_store, "dc1.app")
    for source in sources:
        assert found[source] == ({pinned[source]}, list(range(1, last_seqno + 1)))


def test_owner_answers_lost_and_owner_killed_mid_forward_leave_every_chunk_once(
    start_kafka_gateway: Callable[..., GatewayProcess], kafka_store: LogStore
) -> None:
    """The first gateway forwards to the second through a TCP proxy.  First the proxy loses
    the owner's answers (the batches were committed; the first gateway sends them again),
    then the owner is SIGKILLed with batches in flight.  The client
    resends each unanswered request unchanged until it is acked."""
    proxy_port = free_port()
    first = start_kafka_gateway()
    # the proxy needs the gateway's port, known once it runs: its URL is not checked at start
    second = start_kafka_gateway(
        "--advertised-url", f"http://127.0.0.1:{proxy_port}", "--advertised-url-check", "0"
    )
    proxy = TcpProxy(proxy_port, second.port).start()
    writers = 3  # each with sources of its own: forwarded batches are nearly always in flight
    sources = [f"kill-{i}" for i in range(24)]
    rounds_acked = [0] * writers
    stop = threading.Event()
    errors: list[str] = []

    def write_rounds(writer: int) -> None:
        mine = sources[writer::writers]
        with httpx.Client(base_url=first.url, timeout=60) as http:
            for round_ in range(1, 1000):
                body = encode_binary(
                    [(meta(s), [(round_ * 2 + k, 0, chunk_data(round_ * 2 + k)) for k in (0, 1)])
                     for s in mine]
                )  # fmt: skip
                while not stop.is_set():  # resent unchanged until acked
                    try:
                        response = http.post(
                            "/v1/write", content=body, headers={"content-type": BINARY_MEDIA_TYPE}
                        )
                    except httpx.HTTPError as exc:
                        errors.append(repr(exc))
                        continue
                    if _acked(response):
                        break
                    errors.append(str(response.status_code))
                    time.sleep(0.1)
                if stop.is_set():
                    return
                rounds_acked[writer] = round_

    client = Client(first.url)
    try:
        assert _acked(client.write(sources[0], [1]))  # creates the topic
        wait_until(lambda: _both_own_partitions([first, second]), 60, "both to own partitions")
    finally:
        client.close()
    threads = [threading.Thread(target=write_rounds, args=(i,)) for i in range(writers)]
    for thread in threads:
        thread.start()
    try:
        wait_until(lambda: min(rounds_acked) >= 2, 60, "writes through both gateways")
        proxy.lose_answers = True  # every batch forwarded now is committed, its answer lost
        wait_until(lambda: proxy.answers_lost >= 4, 60, "answers of committed batches lost")
        proxy.lose_answers = False
        cut_at = min(rounds_acked)
        wait_until(lambda: min(rounds_acked) >= cut_at + 1, 60, "writes after the lost answers")
        second.kill()  # SIGKILL with forwarded batches in flight
        killed_at = min(rounds_acked)
        wait_until(lambda: min(rounds_acked) >= killed_at + 2, 60, "writes after the owner died")
    finally:
        stop.set()
        for thread in threads:
            thread.join(90)
        proxy.close()
    found = source_seqnos(kafka_store, "dc1.app")
    for i, source in enumerate(sources):
        last = rounds_acked[i % writers]
        _partitions, seqnos = found[source]
        head = [1] if source == sources[0] else []
        expected = head + [s for r in range(1, last + 1) for s in (r * 2, r * 2 + 1)]
        # a request being resent when the writer stopped may have been written too
        assert seqnos == sorted(set(seqnos)), f"{source}: a chunk written twice ({errors[-5:]})"
        assert seqnos[: len(expected)] == expected, source
        assert len(seqnos) <= len(expected) + 2


def test_a_forwarded_write_is_counted_once_by_the_audit_when_the_owners_answer_is_lost(
    start_kafka_gateway: Callable[..., GatewayProcess],
    kafka_store: LogStore,
    kafka_cluster: Any,
    kafka_namespace: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The gateway tier counts a forwarded write where it is committed, at the owner: the
    first gateway, which forwarded it, may never hear that it was (its retry is answered
    ``duplicate``).  The audit's gateway lines must equal the lines in the log."""
    monkeypatch.setenv("LOGBROKER_AUDIT_INTERVAL_S", "1")
    proxy_port = free_port()
    first = start_kafka_gateway()
    # the proxy needs the gateway's port, known once it runs: its URL is not checked at start
    second = start_kafka_gateway(
        "--advertised-url", f"http://127.0.0.1:{proxy_port}", "--advertised-url-check", "0"
    )
    proxy = TcpProxy(proxy_port, second.port).start()
    sources = [f"audit-{i}" for i in range(16)]
    client = Client(first.url)
    directory = _owners_directory(kafka_cluster, kafka_namespace)
    proxied = f"http://127.0.0.1:{proxy_port}"  # how the second announces itself

    def second_owns_some() -> bool:
        owners = directory.snapshot()
        return any(t == "dc1.app" and u.rstrip("/") == proxied for (t, _p), u in owners.items())

    try:
        assert _acked(client.write(sources[0], [1]))  # creates the topic
        wait_until(lambda: _both_own_partitions([first, second]), 60, "both to own partitions")

        duplicates: list[int] = []  # chunks answered ``duplicate``: committed, answer lost

        def write(seqno: int) -> None:
            body = encode_binary([(meta(s), [(seqno, 0, chunk_data(seqno))]) for s in sources])
            deadline = time.monotonic() + 90
            while not _acked(response := client.post_binary(body)):  # resent until acked
                assert time.monotonic() < deadline, "never acked"
                time.sleep(0.1)
            statuses = [a["status"] for r in response.json()["results"] for a in r["acks"]]
            duplicates.append(statuses.count("duplicate"))

        for seqno in range(2, 5):
            write(seqno)
        seqno = 5
        failures: list[BaseException] = []
        # Until a committed write lost its answer (a lost answer may be a state read's):
        # while the proxy loses the owner's answers, one round is written and resent.
        for _ in range(6):
            wait_until(second_owns_some, 60, "the second gateway to own a partition of dc1.app")
            lost = proxy.answers_lost
            proxy.lose_answers = True

            def write_through_the_loss(seqno: int = seqno) -> None:
                try:
                    write(seqno)
                except BaseException as exc:
                    failures.append(exc)

            writing = threading.Thread(target=write_through_the_loss)
            writing.start()
            try:
                wait_until(
                    lambda lost=lost, w=writing: proxy.answers_lost > lost or not w.is_alive(),
                    60,
                    "an answer lost",
                )
            finally:
                proxy.lose_answers = False
                writing.join(120)
            assert not failures, failures
            seqno += 1
            if duplicates[-1]:
                break
        for later in range(seqno, seqno + 2):
            write(later)
    finally:
        client.close()
        directory.stop()
    assert proxy.answers_lost > 0 and sum(duplicates) > 0, (
        "no committed write lost its answer: the test proved nothing"
    )
    in_log = sum(
        envelope.data.count(b"\n")
        for records in envelopes(kafka_store, "dc1.app").values()
        for _offset, envelope in records
    )
    assert in_log == 1 + (later - 1) * len(sources)

    def gateway_lines() -> int:
        answer = httpx.get(
            f"{first.url}/v1/audit/windows", params={"topic": "dc1.app", "since": "0"}, timeout=30
        )
        assert answer.status_code == 200, answer.text
        return sum(w["tiers"].get("gateway", {}).get("lines", 0) for w in answer.json()["windows"])

    try:
        wait_until(lambda: gateway_lines() >= in_log, 60, "the gateways' counts published")
        time.sleep(2.5)  # two more publications: a count above the log's would show now
        assert gateway_lines() == in_log
    finally:
        proxy.close()


def test_compressed_writes_forwarded_to_their_owner_are_counted_once_by_the_audit(
    start_kafka_gateway: Callable[..., GatewayProcess],
    kafka_store: LogStore,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """zstd chunks written through one gateway, half of them committed by the other: the owner
    counts each forwarded chunk by the lines the first gateway counted when it checked the
    chunk (``record_lines``), and the audit's gateway lines equal the lines in the log."""
    monkeypatch.setenv("LOGBROKER_AUDIT_INTERVAL_S", "1")
    kafka_store.create_topic("dc1.app", TopicConfig(partitions=8))
    first = start_kafka_gateway()
    second = start_kafka_gateway()
    client = Client(first.url)
    compress = zstandard.ZstdCompressor().compress
    sources = [f"zstd-{i}" for i in range(16)]
    try:
        wait_until(lambda: _both_own_partitions([first, second]), 60, "both to own partitions")
        for seqno in range(1, 4):
            chunk = compress(b"".join(b"line %d of %d\n" % (i, seqno) for i in range(seqno * 5)))
            body = encode_binary([(meta(s, codec="zstd"), [(seqno, 0, chunk)]) for s in sources])
            deadline = time.monotonic() + 90
            while not _acked(response := client.post_binary(body)):  # resent until acked
                assert time.monotonic() < deadline, response.text
                time.sleep(0.1)
    finally:
        client.close()
    assert (metric(second.url, "logbroker_kafka_peer_batched_transactions") or 0) > 0
    in_log = sum(
        len(decompress(envelope.codec, envelope.data).splitlines())
        for records in envelopes(kafka_store, "dc1.app").values()
        for _offset, envelope in records
    )
    assert in_log == (5 + 10 + 15) * len(sources)

    def gateway_lines() -> int:
        answer = httpx.get(
            f"{first.url}/v1/audit/windows", params={"topic": "dc1.app", "since": "0"}, timeout=30
        )
        assert answer.status_code == 200, answer.text
        return sum(w["tiers"].get("gateway", {}).get("lines", 0) for w in answer.json()["windows"])

    wait_until(lambda: gateway_lines() >= in_log, 60, "the gateways' counts published")
    time.sleep(2.5)  # two more publications: a count above the log's would show now
    assert gateway_lines() == in_log
