"""Gateways over Apache Kafka: exactly once with one gateway, many, and racing ones."""

from __future__ import annotations

import concurrent.futures
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from ingest_api.framing import encode_binary
from log_store import LogStore, TopicConfig
from ops.audit import audit_store
from tests.conftest import REPO, GatewayProcess, logbroker_cmd
from tests.gateway.conftest import Client, meta
from tests.kafka.conftest import metric, source_seqnos, wait_until

pytestmark = pytest.mark.kafka


def written(response: httpx.Response) -> list[int]:
    assert response.status_code == 200, response.text
    return [
        a["seqno"]
        for r in response.json()["results"]
        for a in r["acks"]
        if a["status"] == "written"
    ]


def test_one_gateway_on_kafka_writes_each_seqno_once_and_recovers_sessions(
    start_kafka_gateway: Callable[..., GatewayProcess], kafka_store: LogStore
) -> None:
    gateway = start_kafka_gateway()
    client = Client(gateway.url)
    try:
        assert client.session("s1")["last_seqno"] == 0
        assert written(client.write("s1", [10, 10, 20])) == [10, 20]
        assert written(client.write("s1", [5, 20, 30])) == [30]
        assert client.session("s1")["last_seqno"] == 30
        # the pull API reads what Kafka committed
        partition = client.session("s1")["partition"]
        got = httpx.get(
            f"{gateway.url}/v1/topics/dc1.app/partitions/{partition}/messages",
            params={"offset": 0},
            timeout=30,
        ).json()
        assert [m["seqno"] for m in got["messages"]] == [10, 20, 30]
        # a partition's size is unknown to the gateway on Kafka: null, not a false 0
        described = httpx.get(f"{gateway.url}/v1/topics/dc1.app", timeout=30).json()
        sizes = {p["partition"]: p["size_bytes"] for p in described["partitions"]}
        assert set(sizes.values()) == {None} and len(sizes) == 4
        shown = subprocess.run(
            logbroker_cmd("topics", "--server", gateway.url, "describe", "dc1.app"),
            capture_output=True, text=True, cwd=REPO, timeout=60,
        )  # fmt: skip
        assert shown.returncode == 0, shown.stderr
        row = next(line.split() for line in shown.stdout.splitlines()[2:]
                   if line.split()[0] == str(partition))  # fmt: skip
        assert row[3] == "-"
        overview = httpx.get(f"{gateway.url}/v1/ui/overview", timeout=30).json()
        (app,) = [t for t in overview["topics"] if t["name"] == "dc1.app"]
        assert app["size_bytes"] is None and app["write_bytes_rate"] is None
        assert {p["size_bytes"] for p in app["partitions"]} == {None}
    finally:
        client.close()
    assert source_seqnos(kafka_store, "dc1.app")["s1"][1] == [10, 20, 30]
    report = audit_store(kafka_store, ["dc1.app"])
    assert report.ok, report.problems


def test_two_gateways_share_the_partitions_and_any_gateway_serves_any_source(
    start_kafka_gateway: Callable[..., GatewayProcess], kafka_store: LogStore
) -> None:
    first = start_kafka_gateway()
    second = start_kafka_gateway()
    clients = [Client(first.url), Client(second.url)]
    sources = [f"src-{i}" for i in range(40)]
    try:
        assert written(clients[0].write(sources[0], [1])) == [1]  # creates the topic
        wait_until(
            lambda: all(
                (metric(g.url, "logbroker_kafka_owned_partitions", ADMIN_TOKEN) or 0) > 0
                for g in (first, second)
            ),
            60,
            "both gateways to own partitions",
        )
        for round_ in range(1, 6):
            for i, source in enumerate(sources):
                client = clients[(i + round_) % 2]
                seqnos = [round_ * 10, round_ * 10 + 1]
                # every chunk sent twice, through both gateways: the second is a duplicate
                assert written(client.write(source, seqnos)) == [s for s in seqnos if s > 1]
                assert written(clients[(i + round_ + 1) % 2].write(source, seqnos)) == []
        sessions = [c.session(s) for c in clients for s in sources]
    finally:
        for client in clients:
            client.close()
    assert {s["last_seqno"] for s in sessions} == {51}
    found = source_seqnos(kafka_store, "dc1.app")
    for i, source in enumerate(sources):
        partitions, seqnos = found[source]
        assert len(partitions) == 1, f"{source} in several partitions"
        expected = ([1] if i == 0 else []) + [s for r in range(1, 6) for s in (r * 10, r * 10 + 1)]
        assert seqnos == expected
    assert audit_store(kafka_store, ["dc1.app"]).ok


def test_two_gateways_racing_for_one_partition_write_no_seqno_twice(
    start_kafka_gateway: Callable[..., GatewayProcess], kafka_store: LogStore
) -> None:
    """Both gateways take the partition over whenever they write (each fences the other):
    only fencing and the rebuilt seqno table stand between the race and a duplicate."""
    gateways = [start_kafka_gateway(ownership="on_demand") for _ in range(2)]
    kafka_store.create_topic("dc1.app", TopicConfig(partitions=1))
    clients = [Client(g.url) for g in gateways]

    def hammer(client: Client, seqnos: list[int]) -> list[int]:
        acked = []
        for seqno in seqnos:
            for _attempt in range(50):
                response = client.write("racer", [seqno])
                if response.status_code == 200:
                    acked.extend(written(response))
                    break
                assert response.status_code == 503, response.text
                time.sleep(0.05)
            else:
                raise AssertionError(f"seqno {seqno} never answered")
        return acked

    seqnos = list(range(1, 61))
    try:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            # each gateway is sent every seqno, twice over: the same chunks race everywhere
            results = list(pool.map(lambda c: hammer(c, seqnos), [*clients, *clients]))
    finally:
        for client in clients:
            client.close()
    acked = [s for r in results for s in r]
    assert sorted(acked) == sorted(set(acked)), "a seqno was acked as written twice"
    partitions, stored = source_seqnos(kafka_store, "dc1.app")["racer"]
    assert stored == sorted(set(stored)), "a seqno was written twice or out of order"
    assert set(stored) == set(acked) and set(stored) <= set(seqnos)
    assert stored[-1] == 60
    assert partitions == {0}


@pytest.mark.fault
def test_restarted_gateway_rebuilds_its_seqno_tables_within_the_bound(
    start_kafka_gateway: Callable[..., GatewayProcess], kafka_store: LogStore
) -> None:
    kafka_store.create_topic("dc1.app", TopicConfig(partitions=1))
    gateway = start_kafka_gateway()
    client = Client(gateway.url)
    sources = 20_000
    try:
        for start in range(0, sources, 5000):
            body = encode_binary(
                [(meta(f"host-{i}"), [(7, 0, b"line\n")]) for i in range(start, start + 5000)]
            )
            response = client.post_binary(body)
            assert response.status_code == 200, response.text
    finally:
        client.close()
    assert gateway.proc is not None
    gateway.proc.send_signal(signal.SIGKILL)
    gateway.proc.wait(10)
    restarted_at = time.monotonic()
    gateway.start(timeout_s=60.0)
    client = Client(gateway.url)
    try:
        # the first answer needs the table: the takeover must be over by then
        assert client.session("host-123")["last_seqno"] == 7
        first_answer_s = time.monotonic() - restarted_at
        response = client.write("host-19999", [7, 8])
        assert written(response) == [8]
        entries = metric(gateway.url, "logbroker_kafka_takeover_entries_max")
        seconds = metric(gateway.url, "logbroker_kafka_takeover_seconds_max")
    finally:
        client.close()
    assert entries is not None and entries >= sources
    assert seconds is not None
    # measured here: ~0.2 s for 20,000 sources (benchmarks/kafka_bench.py: 100,000)
    assert seconds < 5.0, f"takeover of {sources} sources took {seconds:.2f} s"
    assert first_answer_s < 60.0


PEER_TOKEN = "peer-secret"
TENANT_TOKEN = "tenant-secret"
ADMIN_TOKEN = "admin-secret"
TOKENS = f"""
[tokens.{TENANT_TOKEN}]
write = ["app"]
read = ["dc1.app"]
[tokens.{ADMIN_TOKEN}]
admin = true
"""


def test_internal_routes_take_only_the_peer_token_and_gateways_forward_with_it(
    start_kafka_gateway: Callable[..., GatewayProcess], kafka_store: LogStore
) -> None:
    """With tokens on, two gateways still serve every source (a write for a partition the
    other gateway owns is forwarded with the peer token), and the internal routes refuse any
    other bearer: a missing one, a client's, even an admin's.  A legacy ``/commit_request``
    at the gateway that did not stage the piece fetches it from the other with that token."""
    top = f'peer_token = "{PEER_TOKEN}"\n'
    first = start_kafka_gateway(top=top, tables=TOKENS)
    second = start_kafka_gateway(top=top, tables=TOKENS)
    clients = [Client(g.url, token=TENANT_TOKEN) for g in (first, second)]
    sources = [f"src-{i}" for i in range(20)]
    try:
        assert written(clients[0].write(sources[0], [1])) == [1]
        wait_until(
            lambda: all(
                (metric(g.url, "logbroker_kafka_owned_partitions", ADMIN_TOKEN) or 0) > 0
                for g in (first, second)
            ),
            60,
            "both gateways to own partitions",
        )
        for i, source in enumerate(sources):
            assert written(clients[i % 2].write(source, [2, 3])) == [2, 3]
        internal = f"{first.url}/v1/internal/partitions/dc1.app/0/state"
        for bearer in (None, "wrong", TENANT_TOKEN, ADMIN_TOKEN):
            headers = {"Authorization": f"Bearer {bearer}"} if bearer else {}
            refused = httpx.post(internal, json={"keys": []}, headers=headers, timeout=30)
            assert refused.status_code == 401, (bearer, refused.text)
            assert refused.json()["error"] == "unauthorized"
        peer = httpx.post(
            internal,
            json={"keys": []},
            headers={"Authorization": f"Bearer {PEER_TOKEN}"},
            timeout=30,
        )
        assert peer.status_code in (200, 409), peer.text  # served, or "not the owner"
        # a legacy piece staged at the first gateway, requested into the log at the second:
        # fetched with the peer token, which the staging routes alone accept
        tenant = {"Authorization": f"Bearer {TENANT_TOKEN}"}
        stored = httpx.post(
            f"{first.url}/store",
            params={"log_type": "app"},
            content=b"old\n",
            headers=tenant,
            timeout=60,
        )
        store_id = stored.json()["store_id"]
        staged = f"{first.url}/v1/internal/legacy-staging/{store_id}"
        for bearer in (None, "wrong", TENANT_TOKEN, ADMIN_TOKEN):
            headers = {"Authorization": f"Bearer {bearer}"} if bearer else {}
            assert httpx.get(staged, headers=headers, timeout=30).status_code == 401, bearer
        requested = httpx.post(
            f"{second.url}/commit_request",
            params={"store_id": store_id},
            headers=tenant,
            timeout=60,
        )
        assert requested.status_code == 200, requested.text
        spec = httpx.get(f"{first.url}/openapi.json", timeout=30).json()["paths"]
        operation = spec["/v1/internal/partitions/{topic}/{partition}/state"]["post"]
        assert operation["x-permission"] == "peer"
        assert spec["/v1/internal/legacy-staging/{store_id}"]["get"]["x-permission"] == "peer"
    finally:
        for client in clients:
            client.close()
    found = source_seqnos(kafka_store, "dc1.app")
    assert found[sources[0]][1] == [1, 2, 3]
    assert all(found[s][1] == [2, 3] for s in sources[1:])


def test_a_topic_name_kafka_refuses_is_a_4xx_and_the_push_client_parks_its_file(
    start_kafka_gateway: Callable[..., GatewayProcess], tmp_path: Path
) -> None:
    """Kafka takes '.' and '_' in topic names for the same: once dc1.col.a exists, dc1.col_a
    cannot be made.  That is the client's input, not an outage: 400, not 503 for ever."""
    gateway = start_kafka_gateway()
    ndjson = {"Content-Type": "application/x-ndjson"}
    line = b'{"log_type":"%s","source_id":"m:1","seqno":1,"data":"x\\n"}'
    first = httpx.post(f"{gateway.url}/v1/write", content=line % b"col.a", headers=ndjson)
    assert first.status_code == 200, first.text
    second = httpx.post(
        f"{gateway.url}/v1/write", content=line % b"col_a", headers=ndjson, timeout=60
    )
    assert second.status_code == 400, second.text
    assert "collides" in second.json()["reason"]
    log = tmp_path / "col.log"
    log.write_bytes(b"one\ntwo\n")
    started = time.monotonic()
    push = subprocess.run(
        logbroker_cmd(
            "push", "--server", gateway.url, "--log-type", "col_a", "--idle-exit", "3",
            "--state-dir", str(tmp_path / "state"), str(log),
        ),
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip
    assert time.monotonic() - started < 60, "the push-client retried a refusal"
    assert push.returncode == 1, push.stderr
    assert "collides" in push.stderr


def test_a_gateway_that_cannot_have_its_port_never_contacts_kafka(tmp_path: Path) -> None:
    """A start on a port in use exits 2 before it opens the store.  It used to join the
    gateways' group first, which took partitions from the running gateways for seconds."""
    taken = socket.socket()
    kafka = socket.socket()  # stands for the cluster: was it ever contacted?
    try:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        kafka.bind(("127.0.0.1", 0))
        kafka.listen(8)
        kafka.settimeout(0.2)
        port, bootstrap = taken.getsockname()[1], f"127.0.0.1:{kafka.getsockname()[1]}"
        second = subprocess.run(
            logbroker_cmd(
                "serve", "--data-dir", str(tmp_path / "data"), "--port", str(port),
                "--store", "kafka", "--kafka-bootstrap", bootstrap,
            ),
            cwd=REPO, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert second.returncode == 2, second.stderr
        assert f"cannot listen on 127.0.0.1:{port}" in second.stderr
        with pytest.raises(TimeoutError):
            kafka.accept()[0].close()
    finally:
        taken.close()
        kafka.close()


@pytest.mark.parametrize("deleter", ["another process", "the owner gateway's route"])
def test_a_topic_deleted_under_a_running_gateway_is_made_again_by_the_next_write(
    start_kafka_gateway: Callable[..., GatewayProcess], kafka_store: LogStore, deleter: str
) -> None:
    """Deleted by another process (`logbroker topics delete`) or by the gateway that owns its
    partitions (`DELETE /v1/topics/{topic}`, closing its own writers): the gateway's next
    writes of that log type make the topic again at once.  They used to wait for an owner of
    the deleted topic's partitions that never came (503 for minutes, one request hung)."""
    gateway = start_kafka_gateway()
    client = Client(gateway.url, timeout_s=60)
    sources = [f"del-{n}" for n in range(8)]
    try:
        for source in sources:
            assert written(client.write(source, [1])) == [1]
        owned = metric(gateway.url, "logbroker_kafka_owned_partitions") or 0
        old_id = kafka_store.describe_topic("dc1.app").topic_id
        if deleter == "another process":
            kafka_store.delete_topic("dc1.app")
        else:
            response = httpx.delete(f"{gateway.url}/v1/topics/dc1.app", timeout=60)
            assert response.status_code == 200, response.text
            assert response.json()["topic_id"] == old_id
        # the group takes the deleted topic's partitions back from the gateway
        wait_until(
            lambda: (metric(gateway.url, "logbroker_kafka_owned_partitions") or 0) <= owned - 4,
            60,
            "the gateway gives the deleted topic's partitions up",
        )
        started = time.monotonic()
        for source in sources:
            response = client.write(source, [2])
            assert response.status_code == 200, response.text
        assert time.monotonic() - started < 30, "the writes waited for the deleted topic"
    finally:
        client.close()
    seqnos = source_seqnos(kafka_store, "dc1.app")
    assert sorted(seqnos) == sorted(sources)
    assert all(s == [2] for _partitions, s in seqnos.values()), seqnos
    assert kafka_store.describe_topic("dc1.app").topic_id != old_id
