"""The legacy Archive API (/store, /commit_request, /commit) and the transaction filter."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from typing import Any

import httpx
import pytest

from tests.conftest import REPO, logbroker_cmd
from tests.delivery.conftest import PUSH_TO_LOOPBACK, wait_until
from tests.scripted_http import read_head


class Archive:
    """An old Archive client, speaking the wire format of docs/protocol.md."""

    def __init__(self, url: str) -> None:
        self.http = httpx.Client(base_url=url, timeout=30)

    def store(self, data: bytes, log_type: str = "app") -> str:
        response = self.http.post(
            "/store", params={"log_type": log_type, "server": "old1", "file": "/a"}, content=data
        )
        assert response.status_code == 200, response.text
        store_id: str = response.json()["store_id"]
        return store_id

    def commit_request(self, store_id: str) -> dict[str, Any]:
        response = self.http.post("/commit_request", params={"store_id": store_id})
        assert response.status_code == 200, response.text
        result: dict[str, Any] = response.json()
        return result

    def commit(self, txn_id: str, log_type: str = "app") -> dict[str, Any]:
        response = self.http.post("/commit", params={"txn_id": txn_id, "log_type": log_type})
        assert response.status_code == 200, response.text
        result: dict[str, Any] = response.json()
        return result


def _read_all(url: str, **params: Any) -> list[dict[str, Any]]:
    messages = []
    for p in range(4):
        response = httpx.get(
            f"{url}/v1/topics/dc1.app/partitions/{p}/messages", params={"offset": 0, **params}
        )
        if response.status_code == 404:
            continue
        assert response.status_code == 200, response.text
        messages.extend(response.json()["messages"])
    return messages


def test_committed_transactions_are_delivered_once_and_uncommitted_never(
    gateway: Any, start_reader: Any
) -> None:
    archive = Archive(gateway.url)
    committed, uncommitted, requested_only = [], [], []
    for i in range(6):
        sid = archive.store(f"committed {i}\n".encode())
        txn = archive.commit_request(sid)
        # an old client retries on a lost answer: both calls are idempotent
        assert archive.commit_request(sid) == txn
        archive.commit(txn["txn_id"])
        archive.commit(txn["txn_id"])
        committed.append(f"committed {i}\n")
    for i in range(3):
        archive.store(f"stored only {i}\n".encode())
        uncommitted.append(f"stored only {i}\n")
        sid = archive.store(f"requested only {i}\n".encode())
        archive.commit_request(sid)
        requested_only.append(f"requested only {i}\n")
    delivered = [m["data"] for m in _read_all(gateway.url)]
    assert sorted(delivered) == sorted(committed)
    # each delivered message sits at its marker's offset and names its data record
    for m in _read_all(gateway.url):
        assert m["kind"] == "legacy_data"
        assert m["data_offset"] < m["offset"]
    # the reader command sees the same, once
    reader = start_reader(
        "--server", gateway.url, "--topic", "dc1.app", "--from-beginning", "--idle-exit", "1"
    )
    assert reader.wait(20) == 0, reader.stderr()
    assert sorted(reader.out_path.read_text().splitlines(keepends=True)) == sorted(committed)


def test_a_commit_after_the_window_is_never_delivered(gateway: Any) -> None:
    archive = Archive(gateway.url)
    late = archive.commit_request(archive.store(b"late\n"))
    on_time = archive.commit_request(archive.store(b"on time\n"))
    archive.commit(on_time["txn_id"])
    time.sleep(1.2)
    archive.commit(late["txn_id"])
    assert [m["data"] for m in _read_all(gateway.url, txn_window_ms=1000)] == ["on time\n"]
    # with the default 60 s window both made it
    assert sorted(m["data"] for m in _read_all(gateway.url)) == ["late\n", "on time\n"]


def test_push_and_raw_reads_see_legacy_records_as_the_filter_and_a_mirror_need(
    start_gateway: Any, push_endpoint: Any
) -> None:
    gateway = start_gateway(None, *PUSH_TO_LOOPBACK)
    archive = Archive(gateway.url)
    txn = archive.commit_request(archive.store(b"pushed\n"))
    archive.commit_request(archive.store(b"never\n"))
    archive.commit(txn["txn_id"])
    endpoint = push_endpoint(lambda n: ("ok", 200))
    response = httpx.post(
        f"{gateway.url}/v1/subscriptions",
        json={"name": "legacy", "endpoint": endpoint.url, "topics": ["dc1.app"], "linger_ms": 10},
    )
    assert response.status_code == 201
    wait_until(lambda: len(endpoint.messages()) == 1, 10, "the committed transaction's push")
    assert endpoint.messages()[0]["data"] == "pushed\n"
    raw = _read_all(gateway.url, raw=1)
    assert sorted(m["kind"] for m in raw) == ["legacy_commit", "legacy_data", "legacy_data"]


def test_bad_legacy_requests_are_refused_and_write_nothing(gateway: Any) -> None:
    http = httpx.Client(base_url=gateway.url)
    assert http.post("/store", content=b"x").status_code == 400  # no log_type
    bad_type = http.post("/store", params={"log_type": "../etc"}, content=b"x")
    assert bad_type.status_code == 400
    assert bad_type.json()["error"] == "bad_log_type"
    missing = http.post("/commit_request", params={"store_id": "0" * 32})
    assert missing.status_code == 404
    assert missing.json()["error"] == "unknown_store_id"
    assert http.post("/commit_request", params={"store_id": "../../x"}).status_code == 400
    assert http.post("/commit_request").status_code == 400
    unknown = http.post("/commit", params={"txn_id": "nope", "log_type": "app"})
    assert unknown.status_code == 404
    assert unknown.json()["error"] == "unknown_transaction"
    # the topic looked in is named, also when it does not exist (a log type mistyped)
    assert unknown.json()["reason"] == "no /commit_request wrote transaction 'nope' to dc1.app"
    sid = http.post("/store", params={"log_type": "app"}, content=b"x\n").json()["store_id"]
    bad_txn = http.post("/commit_request", params={"store_id": sid, "txn_id": "a b"})
    assert bad_txn.status_code == 400
    assert http.get("/v1/topics").json()["topics"] == []
    http.close()


def test_a_store_over_the_chunk_limit_is_refused_before_its_body_is_sent(gateway: Any) -> None:
    # A piece is one record: 8 MiB (max_chunk_bytes) at most, though a body may be 64 MiB.
    # Announced larger, it is refused at once, not asked for ("100 Continue") and received
    # whole first, holding room other bodies wait for.
    over = 8 * 1024 * 1024 + 1
    head = (
        "POST /store?log_type=app HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Length: {over}\r\nExpect: 100-continue\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as sock:
        sock.sendall(head.encode())
        answer = read_head(sock)
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
        while not answer.endswith(b"}"):
            answer += sock.recv(65536)
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"] == "chunk_too_large"
    # sent all the same (a client that does not wait for "100 Continue"): the same answer
    refused = httpx.post(
        f"{gateway.url}/store", params={"log_type": "app"}, content=b"x" * over, timeout=30
    )
    assert (refused.status_code, refused.json()["error"]) == (413, "chunk_too_large")
    assert not [p for p in (gateway.data_dir / "legacy-staging").iterdir() if p.is_file()]


@pytest.mark.fault
def test_staged_and_requested_data_survive_a_gateway_kill(
    start_gateway: Any, tmp_path: Any
) -> None:
    gw = start_gateway(tmp_path / "data")
    archive = Archive(gw.url)
    staged = archive.store(b"staged before the kill\n")
    requested = archive.commit_request(archive.store(b"requested before the kill\n"))
    gw.kill()
    gw2 = start_gateway(tmp_path / "data")
    archive = Archive(gw2.url)
    txn = archive.commit_request(staged)
    archive.commit(txn["txn_id"])
    archive.commit(requested["txn_id"])
    assert sorted(m["data"] for m in _read_all(gw2.url)) == [
        "requested before the kill\n",
        "staged before the kill\n",
    ]


def _age_transaction(data_dir: Any, topic: str, txn_id: str, by_ms: int) -> None:
    """As if ``by_ms`` passed since the transaction's data was written (a slow client)."""
    from delivery.legacy_txn import find_txn_partition
    from log_store import open_store
    from log_store.interface import PartitionState

    key = f"legacy-txn/{txn_id}"
    with open_store(data_dir) as store:
        partitions = len(store.describe_topic(topic).partitions)
        partition = find_txn_partition(store, topic, partitions, txn_id)

        def age(state: PartitionState) -> list[bytes]:
            raw = state.get(key)
            assert raw is not None
            doc = json.loads(raw)
            doc["write_time"] -= by_ms
            state.put(key, json.dumps(doc).encode())
            return []

        store.transact(topic, partition, age)


def test_a_commit_later_than_the_window_is_refused_and_writes_no_marker(gateway: Any) -> None:
    archive = Archive(gateway.url)
    late = archive.commit_request(archive.store(b"late\n"))
    on_time = archive.commit_request(archive.store(b"on time\n"))
    archive.commit(on_time["txn_id"])
    _age_transaction(gateway.data_dir, "dc1.app", late["txn_id"], 61_000)
    _age_transaction(gateway.data_dir, "dc1.app", on_time["txn_id"], 61_000)
    for _ in range(2):
        refused = archive.http.post("/commit", params={"txn_id": late["txn_id"], "log_type": "app"})
        assert refused.status_code == 409, refused.text
        assert refused.json()["error"] == "window_expired"
    # committed in time, so repeating it is still answered as committed
    assert archive.commit(on_time["txn_id"])["committed"] is True
    raw = _read_all(gateway.url, raw=1)
    assert sorted(m["kind"] for m in raw) == ["legacy_commit", "legacy_data", "legacy_data"]
    assert [m["data"] for m in _read_all(gateway.url)] == ["on time\n"]


def test_a_repeated_commit_request_after_the_topic_grew_writes_the_data_once(
    gateway: Any,
) -> None:
    from delivery.legacy_txn import txn_partition

    # A transaction id that hashes to another partition once the topic has 8 partitions.
    txn_id = next(
        t for t in (f"t{i}" for i in range(100)) if txn_partition(t, 4) != txn_partition(t, 8)
    )
    archive = Archive(gateway.url)
    sid = archive.store(b"once\n")
    params = {"store_id": sid, "txn_id": txn_id}
    first = archive.http.post("/commit_request", params=params)
    assert first.status_code == 200, first.text
    done = subprocess.run(
        logbroker_cmd(
            "topics", "--data-dir", str(gateway.data_dir), "alter", "dc1.app", "--partitions", "8"
        ),
        cwd=REPO,
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    again = archive.http.post("/commit_request", params=params)
    assert again.status_code == 200, again.text
    assert again.json() == first.json()
    archive.commit(txn_id)
    raw = []
    for p in range(8):
        raw += httpx.get(
            f"{gateway.url}/v1/topics/dc1.app/partitions/{p}/messages",
            params={"offset": 0, "raw": 1},
        ).json()["messages"]
    assert sorted(m["kind"] for m in raw) == ["legacy_commit", "legacy_data"]


def test_a_txn_id_already_used_by_other_data_is_refused_and_that_data_stays_staged(
    gateway: Any,
) -> None:
    archive = Archive(gateway.url)
    first, second = archive.store(b"first\n"), archive.store(b"second\n")
    taken = archive.http.post("/commit_request", params={"store_id": first, "txn_id": "T1"})
    assert taken.status_code == 200, taken.text
    # Another piece under the same id: a 200 here would tell the client its data is in the
    # log, and the commit would then release the first piece, never the second.
    refused = archive.http.post("/commit_request", params={"store_id": second, "txn_id": "T1"})
    assert refused.status_code == 409, refused.text
    assert refused.json()["error"] == "txn_id_taken"
    assert second in refused.json()["reason"]
    # the same request of the first piece is still answered the same
    again = archive.http.post("/commit_request", params={"store_id": first, "txn_id": "T1"})
    assert again.json() == taken.json()
    # nothing was written for the refused piece, which can still go under an id of its own
    archive.commit("T1")
    archive.commit(archive.commit_request(second)["txn_id"])
    assert sorted(m["data"] for m in _read_all(gateway.url)) == ["first\n", "second\n"]
    assert len(_read_all(gateway.url, raw=1)) == 4
    # the first piece again under a new id: it is in the log once, under T1, and stays so
    renamed = archive.http.post("/commit_request", params={"store_id": first, "txn_id": "T9"})
    assert renamed.status_code == 409, renamed.text
    assert renamed.json()["error"] == "store_id_written"
    assert len(_read_all(gateway.url, raw=1)) == 4


def test_a_malformed_store_id_is_named_in_the_refusal(gateway: Any) -> None:
    http = httpx.Client(base_url=gateway.url)
    bad = http.post("/commit_request", params={"store_id": "../../etc/passwd"})
    assert bad.status_code == 400, bad.text
    assert bad.json()["error"] == "bad_request"
    assert "store_id" in bad.json()["reason"]
    http.close()
