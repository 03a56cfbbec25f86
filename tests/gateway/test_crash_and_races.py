"""Exactly-once under faults: SIGKILL mid-stream, racing gateways and workers, SIGTERM."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.gateway.conftest import Client, source_seqnos

BATCH = 40


def stream(client: Client, source: str, first: int, stop: threading.Event) -> tuple[int, int]:
    """Send batches of consecutive seqnos from ``first`` until the gateway fails or ``stop``.

    Returns (last acked seqno, number of chunks answered duplicate).
    """
    acked = first - 1
    duplicates = 0
    while not stop.is_set():
        seqnos = list(range(acked + 1, acked + 1 + BATCH))
        try:
            response = client.write(source, seqnos)
        except httpx.TransportError:
            break
        if response.status_code != 200:
            break
        acks = response.json()["results"][0]["acks"]
        assert [a["seqno"] for a in acks] == seqnos
        duplicates += sum(a["status"] == "duplicate" for a in acks)
        acked = seqnos[-1]
    return acked, duplicates


@pytest.mark.fault
@pytest.mark.slow
def test_sigkill_mid_stream_then_resume_writes_every_seqno_once_in_order(
    start_gateway: Any, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    # "stateless" resumes from the session's last seqno (it lost its state file);
    # "stateful" resumes after its own last ack, so it re-sends what was written but not acked
    sources = ["stateless-a", "stateless-b", "stateful-c"]
    last_acked = dict.fromkeys(sources, 0)
    resent_duplicates = 0
    for round_no in range(3):
        gw = start_gateway(data_dir)
        clients = {s: Client(gw.url) for s in sources}
        first: dict[str, int] = {}
        for source in sources:
            last_seqno = clients[source].session(source)["last_seqno"]
            assert last_seqno >= last_acked[source], "an acked chunk was lost by SIGKILL"
            resumes_from_log = source.startswith("stateless")
            first[source] = (last_seqno if resumes_from_log else last_acked[source]) + 1
        stop = threading.Event()
        outcome: dict[str, tuple[int, int]] = {}

        def run(source: str, clients: dict[str, Client] = clients) -> None:
            outcome[source] = stream(clients[source], source, first[source], stop)  # noqa: B023

        threads = [threading.Thread(target=run, args=(s,)) for s in sources]
        for t in threads:
            t.start()
        time.sleep(0.7 + 0.4 * round_no)
        gw.kill()  # SIGKILL with requests in flight
        stop.set()
        for t in threads:
            t.join(30)
        for client in clients.values():
            client.close()
        for source in sources:
            last_acked[source] = max(last_acked[source], outcome[source][0])
        resent_duplicates += outcome["stateful-c"][1]
        assert all(last_acked[s] > 0 for s in sources)

    final = start_gateway(data_dir)
    client = Client(final.url)
    for source in sources:
        partitions, seqnos = source_seqnos(data_dir, "dc1.app", source)
        last_seqno = client.session(source)["last_seqno"]
        assert len(partitions) == 1
        assert seqnos == list(range(1, last_seqno + 1)), f"{source}: not every seqno once, in order"
        assert last_seqno >= last_acked[source]
    client.close()


@pytest.mark.fault
def test_two_gateways_racing_on_one_source_write_each_seqno_exactly_once(
    start_gateway: Any, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    gateways = [start_gateway(data_dir), start_gateway(data_dir)]
    statuses: dict[int, list[str]] = {}
    lock = threading.Lock()

    def writer(url: str, offset: int) -> None:
        client = Client(url)
        # overlapping windows: each seqno is sent by several writers through both gateways
        for start in range(1 + offset, 400, 10):
            acks = client.acks("raced", list(range(start, start + 15)))
            with lock:
                for ack in acks:
                    statuses.setdefault(ack["seqno"], []).append(ack["status"])
        client.close()

    threads = [threading.Thread(target=writer, args=(gateways[i % 2].url, i * 3)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    partitions, seqnos = source_seqnos(data_dir, "dc1.app", "raced")
    assert len(partitions) == 1
    assert seqnos == sorted(set(seqnos)), "a seqno was written twice or out of order"
    for seqno, answers in statuses.items():
        assert answers.count("written") <= 1, f"seqno {seqno} acked written twice"
    assert {s for s, a in statuses.items() if "written" in a} == set(seqnos)


@pytest.mark.fault
def test_several_workers_racing_on_one_source_write_each_seqno_exactly_once(
    start_gateway: Any, tmp_path: Path
) -> None:
    gw = start_gateway(tmp_path / "data", "--workers", "2")
    statuses: dict[int, list[str]] = {}
    lock = threading.Lock()

    def writer(offset: int) -> None:
        # a fresh connection per request spreads the requests over both workers
        for start in range(1 + offset, 200, 8):
            client = Client(gw.url)
            acks = client.acks("raced-workers", list(range(start, start + 12)))
            client.close()
            with lock:
                for ack in acks:
                    statuses.setdefault(ack["seqno"], []).append(ack["status"])

    threads = [threading.Thread(target=writer, args=(i * 2,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    partitions, seqnos = source_seqnos(gw.data_dir, "dc1.app", "raced-workers")
    assert len(partitions) == 1
    assert seqnos == sorted(set(seqnos))
    assert all(a.count("written") <= 1 for a in statuses.values())
    assert {s for s, a in statuses.items() if "written" in a} == set(seqnos)


@pytest.mark.fault
def test_sigterm_finishes_in_flight_writes_and_exits_cleanly(
    start_gateway: Any, tmp_path: Path
) -> None:
    gw = start_gateway(tmp_path / "data")
    results: dict[int, int] = {}

    def write_big(i: int) -> None:
        client = Client(gw.url)
        try:
            results[i] = client.write(f"term-{i}", list(range(1, 201))).status_code
        except httpx.TransportError:
            results[i] = -1  # refused: the gateway had stopped accepting
        finally:
            client.close()

    threads = [threading.Thread(target=write_big, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    time.sleep(0.05)
    assert gw.stop() == 0
    for t in threads:
        t.join(30)
    assert set(results.values()) <= {200, -1}
    for i, status in results.items():
        seqnos = source_seqnos(tmp_path / "data", "dc1.app", f"term-{i}")[1]
        if status == 200:
            assert seqnos == list(range(1, 201)), "an acked write is missing after SIGTERM"
