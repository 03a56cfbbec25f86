"""Faults between gateways and Kafka: a gateway killed under a push-client, the connection to
Kafka cut, a broker of three killed.  Real processes, SIGKILL, a real Kafka cluster."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from log_store import LogStore
from log_store.kafka import KafkaSettings, open_kafka_store
from ops.local_kafka import LocalKafka
from tests.conftest import GatewayProcess
from tests.gateway.conftest import Client
from tests.kafka.conftest import delivered_lines, source_seqnos, wait_until
from tests.kafka.tcp_proxy import TcpProxy
from tests.push_client.conftest import FAST_FLAGS, LineWriter, PushProcess

pytestmark = [pytest.mark.kafka, pytest.mark.fault, pytest.mark.slow]


def test_push_client_fails_over_when_a_gateway_is_killed_and_ships_every_line_once(
    start_kafka_gateway: Callable[..., GatewayProcess], kafka_store: LogStore, tmp_path: Path
) -> None:
    first = start_kafka_gateway()
    second = start_kafka_gateway()
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    writer = LineWriter("fo")
    path = log_dir / "app.log"
    writer.append(path, 2000)
    push = PushProcess(
        [
            "--server",
            f"{first.url},{second.url}",
            "--log-type",
            "app",
            "--state-dir",
            str(tmp_path / "state"),
            *FAST_FLAGS,
            str(path),
        ],
        tmp_path / "push.log",
    ).start()
    try:
        wait_until(lambda: len(delivered_lines(kafka_store, "dc1.app")) >= 1000, 90, "lines")
        writer.append(path, 2000)
        first.kill()  # SIGKILL mid-stream: its partitions move to the second gateway
        writer.append(path, 2000)
        wait_until(
            lambda: len(delivered_lines(kafka_store, "dc1.app")) >= len(writer.ids),
            120,
            f"all lines (push log: {push.log()[-2000:]})",
        )
    finally:
        push.kill()
    counts = delivered_lines(kafka_store, "dc1.app")
    assert not [i for i, c in counts.items() if c > 1], "a line arrived twice"
    assert set(counts) == set(writer.ids)
    for _partitions, seqnos in source_seqnos(kafka_store, "dc1.app").values():
        assert seqnos == sorted(set(seqnos))


def test_connection_to_kafka_cut_answers_503_and_loses_no_acked_chunk(
    start_kafka_gateway: Callable[..., GatewayProcess], kafka_store: LogStore, kafka_cluster: Any
) -> None:
    node = kafka_cluster.nodes[0]
    proxy = TcpProxy(node.proxied_advertised_port, node.proxied_port).start()
    try:
        gateway = start_kafka_gateway(bootstrap=kafka_cluster.proxied_bootstrap)
        client = Client(gateway.url, timeout_s=90)
        acked: set[int] = set()

        def write(seqnos: list[int]) -> httpx.Response:
            response = client.write("cut", seqnos)
            if response.status_code == 200:
                for result in response.json()["results"]:
                    acked.update(a["seqno"] for a in result["acks"])
            return response

        assert write(list(range(1, 11))).status_code == 200
        assert httpx.get(f"{gateway.url}/readyz", timeout=30).status_code == 200
        proxy.cut()
        refused = write(list(range(11, 21)))
        assert refused.status_code == 503, refused.text
        assert refused.headers.get("Retry-After")
        assert refused.json()["error"] == "store_unavailable"
        # alive, not ready: a failed-over push-client does not come back to it yet
        assert httpx.get(f"{gateway.url}/healthz", timeout=30).status_code == 200
        not_ready = httpx.get(f"{gateway.url}/readyz", timeout=30)
        assert not_ready.status_code == 503
        assert not_ready.json()["error"] == "not_ready"
        assert "Kafka does not answer" in not_ready.json()["reason"]
        proxy.restore()
        deadline = time.monotonic() + 60
        while httpx.get(f"{gateway.url}/readyz", timeout=30).status_code != 200:
            assert time.monotonic() < deadline, "never ready again"
            time.sleep(0.5)
        # the client retries what was refused (and more) until the gateway is back
        deadline = time.monotonic() + 120
        while write(list(range(11, 31))).status_code != 200:
            assert time.monotonic() < deadline, "the gateway did not recover"
            time.sleep(0.5)
        client.close()
    finally:
        proxy.close()
    _partitions, seqnos = source_seqnos(kafka_store, "dc1.app")["cut"]
    assert seqnos == list(range(1, 31)), "lost, duplicated or reordered chunks"
    assert acked <= set(seqnos)


def test_one_broker_of_three_killed_during_writes_loses_nothing(
    tmp_path: Path, start_kafka_gateway: Callable[..., GatewayProcess], kafka_namespace: str
) -> None:
    cluster = LocalKafka(tmp_path / "cluster", nodes_count=3)
    t_start = time.monotonic()

    def mark(what: str) -> None:
        print(f"{time.monotonic() - t_start:6.1f} s  {what}")

    try:
        cluster.start()
        mark("cluster up")
        gateway = start_kafka_gateway(
            bootstrap=cluster.bootstrap,
            kafka={"replication_factor": 3, "min_insync_replicas": 2},
        )
        mark("gateway up")
        client = Client(gateway.url, timeout_s=60)
        acked: list[int] = []
        stop = threading.Event()
        failures: list[int] = []

        def keep_writing() -> None:
            seqno = 0
            while not stop.is_set():
                seqno += 1
                while not stop.is_set():
                    response = client.write("rf3", [seqno])
                    if response.status_code == 200:
                        acked.append(seqno)
                        break
                    failures.append(response.status_code)
                    time.sleep(0.2)

        writer = threading.Thread(target=keep_writing)
        writer.start()
        try:
            wait_until(lambda: len(acked) >= 20, 60, "writes before the kill")
            mark("20 writes")
            cluster.kill_node(1)
            killed_at, t0 = len(acked), time.monotonic()
            wait_until(lambda: len(acked) >= killed_at + 20, 120, "writes with a broker down")
            print(f"20 writes with a broker down after {time.monotonic() - t0:.1f} s")
            cluster.restart_node(1)
            mark("restarted")
            restarted_at, t0 = len(acked), time.monotonic()
            wait_until(lambda: len(acked) >= restarted_at + 10, 120, "writes after the restart")
            print(f"10 writes after the restart in {time.monotonic() - t0:.1f} s")
        finally:
            stop.set()
            writer.join(120)
            client.close()
            mark("writer stopped")
        store = open_kafka_store(
            KafkaSettings(cluster.bootstrap, namespace=kafka_namespace, operation_timeout_s=30)
        )
        try:
            _partitions, seqnos = source_seqnos(store, "dc1.app")["rf3"]
            topic = store.describe_topic("dc1.app")
        finally:
            store.close()
        mark("read back")
        # one broker of three lost is no outage: the gateway never took Kafka for away
        assert "Kafka is unreachable from this gateway" not in gateway.log_path.read_text()
        assert seqnos == sorted(set(seqnos)), "a chunk was written twice"
        assert set(acked) <= set(seqnos), "an acked chunk was lost"
        assert topic.partitions
    finally:
        cluster.stop()


def test_the_broker_stopped_and_started_again_loses_no_acked_chunk(
    start_kafka_gateway: Callable[..., GatewayProcess], tmp_path: Path, kafka_namespace: str
) -> None:
    """The whole (one-node) cluster goes away and comes back on its ports and storage, as
    ``scripts/kafka.sh restart`` does it: writes meanwhile are refused (503, nothing acked),
    the gateway is not ready, and afterwards every acknowledged chunk is in the log once.  A
    group reader that kept trying through the outage (longer than its 10 s session) keeps its
    membership and prints every line once."""
    import subprocess
    import sys

    from tests.conftest import REPO

    def local_kafka(action: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "ops.local_kafka", action, "--dir", str(tmp_path / "kafka")],
            capture_output=True, text=True, cwd=REPO, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""

    bootstrap = local_kafka("start")
    try:
        gateway = start_kafka_gateway(bootstrap=bootstrap)
        client = Client(gateway.url, timeout_s=90)
        acked: set[int] = set()
        refused = 0

        def write(seqnos: list[int]) -> int:
            nonlocal refused
            response = client.write("outage", seqnos)
            if response.status_code == 200:
                for result in response.json()["results"]:
                    acked.update(a["seqno"] for a in result["acks"])
            else:
                assert response.status_code == 503, response.text
                refused += 1
            return response.status_code

        deadline = time.monotonic() + 120
        while write(list(range(1, 11))) != 200:
            assert time.monotonic() < deadline
        out_path, err_path = tmp_path / "reader.jsonl", tmp_path / "reader.err"
        with open(out_path, "wb") as out_file, open(err_path, "wb") as err_file:
            reader = subprocess.Popen(
                [sys.executable, "-m", "ops", "read", "--server", gateway.url,
                 "--topic", "dc1.app", "--group", "through", "--from-beginning",
                 "--format", "jsonl"],
                stdout=out_file, stderr=err_file, cwd=REPO,
            )  # fmt: skip
        deadline = time.monotonic() + 60
        while out_path.read_bytes().count(b"\n") < 10:
            assert time.monotonic() < deadline, err_path.read_text()
            time.sleep(0.2)
        restart_failures: list[BaseException] = []

        def restart() -> None:
            try:
                local_kafka("restart")
            except BaseException as exc:  # raised below, not lost with the thread
                restart_failures.append(exc)

        readiness: list[int] = []

        def watch_readiness() -> None:
            # on its own, not between writes: a write waiting out the outage would hide it
            while restarting.is_alive():
                with contextlib.suppress(httpx.HTTPError):
                    readiness.append(httpx.get(f"{gateway.url}/readyz", timeout=30).status_code)
                time.sleep(0.1)

        restarting = threading.Thread(target=restart)
        restarting.start()
        watching = threading.Thread(target=watch_readiness)
        watching.start()
        seqno = 10
        while restarting.is_alive():
            if write([seqno + 1, seqno + 2]) == 200:
                seqno += 2
            time.sleep(0.2)
        restarting.join()
        watching.join()
        assert not restart_failures, restart_failures
        assert refused > 0 and 503 in readiness, (
            f"the outage was never seen: {refused} writes refused, /readyz {set(readiness)}"
        )
        deadline = time.monotonic() + 120
        while write([seqno + 1, seqno + 2]) != 200:
            assert time.monotonic() < deadline, "the gateway did not recover"
            time.sleep(0.5)
        seqno += 2
        client.close()
        deadline = time.monotonic() + 90
        while out_path.read_bytes().count(b"\n") < seqno and time.monotonic() < deadline:
            time.sleep(0.2)
        reader.terminate()
        assert reader.wait(60) == 0, err_path.read_text()
        printed = [json.loads(line)["seqno"] for line in out_path.read_bytes().splitlines()]
        assert sorted(printed) == list(range(1, seqno + 1)), err_path.read_text()
        assert "dropped from group" not in err_path.read_text()
        store = open_kafka_store(KafkaSettings(bootstrap, namespace=kafka_namespace))
        try:
            _partitions, seqnos = source_seqnos(store, "dc1.app")["outage"]
        finally:
            store.close()
        assert seqnos == list(range(1, seqno + 1)), "lost, duplicated or reordered chunks"
        assert acked <= set(seqnos)
    finally:
        local_kafka("stop")


def test_a_gateway_started_before_kafka_waits_for_it_and_comes_up_with_it(
    start_kafka_gateway: Callable[..., GatewayProcess], kafka_cluster: Any, tmp_path: Path
) -> None:
    """A host booting, or the cluster restarting: the gateway says it waits and comes up
    when Kafka does, instead of giving up (it used to exit 1 after about 17 s)."""
    node = kafka_cluster.nodes[0]
    proxy = TcpProxy(node.proxied_advertised_port, node.proxied_port)  # Kafka away: not started
    started: dict[str, Any] = {}

    def start() -> None:
        try:
            started["gateway"] = start_kafka_gateway(bootstrap=kafka_cluster.proxied_bootstrap)
        except Exception as exc:  # reported below
            started["error"] = exc

    thread = threading.Thread(target=start)
    thread.start()
    try:
        time.sleep(20)
        assert "error" not in started, started.get("error")
        assert "waiting for Kafka at" in (tmp_path / "gateway-0.log").read_text()
        proxy.start()
        thread.join(90)
        assert "gateway" in started, started.get("error")
        gateway = started["gateway"]
        client = Client(gateway.url, timeout_s=90)
        try:
            response = client.write("late", [1, 2])
            assert response.status_code == 200, response.text
        finally:
            client.close()
        assert httpx.get(f"{gateway.url}/readyz", timeout=30).status_code == 200
    finally:
        proxy.close()
        thread.join(90)
