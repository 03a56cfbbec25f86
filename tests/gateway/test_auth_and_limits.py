"""Front-door duties: bearer tokens, body/chunk/count limits, per-source rates, slow clients."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import orjson

from ingest_api.framing import BINARY_MEDIA_TYPE, NDJSON_MEDIA_TYPE, encode_binary
from log_store import open_store
from tests.conftest import logbroker_cmd
from tests.gateway.conftest import end_offsets, meta

CONFIG = """
[limits]
max_body_bytes = 200000
max_chunk_bytes = 50000
max_chunks_per_request = 100
source_chunks_per_second = 20
source_burst_chunks = 30
request_timeout_s = 1.0

[tokens.writer-token]
write = ["app", "web-*"]
read = ["dc1.app"]

[tokens.reader-token]
read = ["dc1.*"]
"""


def start_configured(start_gateway: Any, tmp_path: Path) -> Any:
    config = tmp_path / "gateway.toml"
    config.write_text(CONFIG)
    return start_gateway(tmp_path / "data", "--config", str(config))


def written(data_dir: Path) -> dict[tuple[str, int], int]:
    return {k: v for k, v in end_offsets(data_dir).items() if k[0].startswith("dc1.") and v}


def test_missing_or_unknown_token_is_401_and_writes_nothing(
    start_gateway: Any, tmp_path: Path, client_for: Any
) -> None:
    gw = start_configured(start_gateway, tmp_path)
    for token in (None, "wrong-token"):
        client = client_for(gw.url, token)
        response = client.write("s", [1])
        assert response.status_code == 401
        assert response.json()["error"] == "unauthorized"
        assert response.headers["www-authenticate"].startswith("Bearer")
        assert client.http.post("/v1/sessions", json=meta("s")).status_code == 401
    assert written(gw.data_dir) == {}


def test_token_may_write_only_its_log_types(
    start_gateway: Any, tmp_path: Path, client_for: Any
) -> None:
    gw = start_configured(start_gateway, tmp_path)
    writer = client_for(gw.url, "writer-token")
    reader = client_for(gw.url, "reader-token")
    assert writer.write("s", [1], "app").status_code == 200
    assert writer.write("s", [1], "web-front").status_code == 200
    denied = writer.write("s", [1], "db")
    assert denied.status_code == 403 and "db" in denied.json()["reason"]
    assert reader.write("s", [1], "app").status_code == 403
    assert written(gw.data_dir) == {("dc1.app", writer.session("s", "app")["partition"]): 1} | {
        ("dc1.web-front", writer.session("s", "web-front")["partition"]): 1
    }


def test_a_forbidden_section_is_refused_alone_and_the_others_are_written(
    start_gateway: Any, tmp_path: Path, client_for: Any
) -> None:
    gw = start_configured(start_gateway, tmp_path)
    writer = client_for(gw.url, "writer-token")
    mixed = encode_binary([(meta("x", "app"), [(1, 0, b"a")]), (meta("y", "db"), [(1, 0, b"b")])])
    answer = writer.post_binary(mixed)
    assert answer.status_code == 200
    written_result, refused = answer.json()["results"]
    assert written_result["acks"] == [{"seqno": 1, "status": "written", "offset": 0}]
    assert refused == {
        "source_id": "y",
        "status": 403,
        "error": "forbidden",
        "reason": "this token may not write log type 'db'",
    }
    sessions = writer.http.post(
        "/v1/sessions", json={"sessions": [meta("y", "db"), meta("x", "app")]}
    ).json()["sessions"]
    assert (sessions[0]["status"], sessions[1]["last_seqno"]) == (403, 1)
    assert written(gw.data_dir) == {("dc1.app", written_result["partition"]): 1}
    assert "dc1.db" not in {topic for topic, _ in end_offsets(gw.data_dir)}


def test_without_tokens_serve_refuses_a_public_address(tmp_path: Path) -> None:
    result = subprocess.run(
        logbroker_cmd("serve", "--data-dir", str(tmp_path / "d"), "--host", "0.0.0.0"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "loopback" in result.stderr


def test_bad_config_file_exits_2_with_a_reason(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text("[limits]\nmax_body_bytes = 'lots'\n")
    result = subprocess.run(
        logbroker_cmd("serve", "--data-dir", str(tmp_path / "d"), "--config", str(config)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "max_body_bytes" in result.stderr


def test_an_endless_expiry_exits_2_and_creates_no_data_dir(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text("[limits]\nsource_idle_expiry_s = inf\n")
    data_dir = tmp_path / "d"
    result = subprocess.run(
        logbroker_cmd("serve", "--data-dir", str(data_dir), "--config", str(config)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert "source_idle_expiry_s" in result.stderr and "Traceback" not in result.stderr
    assert not data_dir.exists()


def test_limits_answer_413_and_write_nothing(
    start_gateway: Any, tmp_path: Path, client_for: Any
) -> None:
    gw = start_configured(start_gateway, tmp_path)
    client = client_for(gw.url, "writer-token")
    big_chunk = client.post_binary(encode_binary([(meta("s"), [(1, 0, b"x" * 50001)])]))
    assert (big_chunk.status_code, big_chunk.json()["error"]) == (413, "chunk_too_large")
    many = client.post_binary(encode_binary([(meta("s"), [(i, 0, b"x") for i in range(1, 102)])]))
    assert (many.status_code, many.json()["error"]) == (413, "too_many_chunks")
    chunks = [(i, 0, b"x" * 40000) for i in range(1, 7)]
    huge = client.post_binary(encode_binary([(meta("s"), chunks)]))
    assert (huge.status_code, huge.json()["error"]) == (413, "body_too_large")
    assert written(gw.data_dir) == {}


def test_a_source_over_its_rate_gets_429_with_retry_after_and_nothing_written(
    start_gateway: Any, tmp_path: Path, client_for: Any
) -> None:
    gw = start_configured(start_gateway, tmp_path)
    client = client_for(gw.url, "writer-token")
    assert client.write("fast", list(range(1, 31))).status_code == 200
    limited = client.write("fast", list(range(31, 41)))
    assert limited.status_code == 429
    assert int(limited.headers["retry-after"]) >= 1
    # as every 429 (docs/configuration.md, [limits]): the limit and its value
    assert limited.json()["limit"] == "source_chunks_per_second"
    assert limited.json()["max"] == 20
    # another source has its own bucket
    assert client.write("other", [1, 2, 3]).status_code == 200
    time.sleep(0.6)
    assert client.write("fast", list(range(31, 41))).status_code == 200
    assert client.session("fast")["last_seqno"] == 40


def test_a_stalled_client_gets_408_and_the_worker_keeps_serving(
    start_gateway: Any, tmp_path: Path, client_for: Any
) -> None:
    gw = start_configured(start_gateway, tmp_path)
    body = encode_binary([(meta("slow"), [(1, 0, b"x" * 1000)])])
    with socket.create_connection(("127.0.0.1", gw.port)) as sock:
        sock.sendall(
            b"POST /v1/write HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer writer-token\r\n"
            b"Content-Type: " + BINARY_MEDIA_TYPE.encode() + b"\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body[:100]
        )
        started = time.monotonic()
        # meanwhile, other clients are served
        assert client_for(gw.url, "writer-token").write("quick", [1]).status_code == 200
        sock.settimeout(10)
        answer = b""
        while b"}" not in answer:  # headers and body may come in separate segments
            piece = sock.recv(65536)
            if not piece:
                break
            answer += piece
        assert time.monotonic() - started < 5
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b"request_timeout" in answer
    client = client_for(gw.url, "writer-token")
    assert client.session("slow")["last_seqno"] == 0
    assert httpx.get(gw.url + "/healthz").status_code == 200


AUDIT_TOKENS = """
[tokens.shipper-token]
write = ["app", "logbroker-audit"]

[tokens.mirror-token]
write = ["logbroker-audit"]
replicate = ["dc9.*"]

[tokens.loader-token]
write = ["logbroker-audit"]
read = ["dc1.db"]
"""


def test_a_token_publishes_audit_counts_only_of_its_tier_and_topics(
    start_gateway: Any, tmp_path: Path
) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text(AUDIT_TOKENS)
    gw = start_gateway(tmp_path / "data", "--config", str(config))
    seqnos = iter(range(1, 1000))

    def publish(token: str, *counts: tuple[str, str]) -> list[dict[str, Any]]:
        """One section per (tier, topic), each of its own source; the per-section results."""
        lines = []
        for tier, topic in counts:
            record = {
                "tier": tier,
                "instance": "i-1",
                "topic": topic,
                "window_start": 1_700_000_400,
                "messages": 1,
                "lines": 5,
                "published_ms": 1,
            }
            chunk = {
                "log_type": "logbroker-audit",
                "source_id": f"audit:{tier}:{topic}:{token}",
                "seqno": next(seqnos),
                "data": orjson.dumps(record).decode() + "\n",
            }
            lines.append(orjson.dumps(chunk))
        answer = httpx.post(
            gw.url + "/v1/write",
            content=b"\n".join(lines) + b"\n",
            headers={"Authorization": f"Bearer {token}", "Content-Type": NDJSON_MEDIA_TYPE},
            timeout=30,
        )
        assert answer.status_code in (200, 403), answer.text
        results: list[dict[str, Any]] = (
            answer.json()["results"] if answer.status_code == 200 else [answer.json()]
        )
        return results

    def refused(result: dict[str, Any]) -> bool:
        return result.get("error") == "forbidden"

    allowed = publish(
        "shipper-token",
        ("push-client", "dc1.app"),  # its own tier, a log type it writes
        ("gateway", "dc1.app"),  # the gateway's tier: only the gateway publishes it
        ("push-client", "dc1.db"),  # another tenant's topic
    )
    assert [refused(r) for r in allowed] == [False, True, True], allowed
    assert all(refused(r) for r in publish("shipper-token", ("push", "dc1.app")))
    assert [refused(r) for r in publish("mirror-token", ("mirror", "dc9.app"))] == [False]
    assert all(refused(r) for r in publish("mirror-token", ("mirror", "dc1.app")))
    assert [refused(r) for r in publish("loader-token", ("loader", "dc1.db"))] == [False]
    assert all(refused(r) for r in publish("loader-token", ("loader", "dc1.app")))
    legacy = httpx.post(
        gw.url + "/store",
        params={"log_type": "logbroker-audit"},
        content=b'{"tier": "gateway"}\n',
        headers={"Authorization": "Bearer shipper-token"},
        timeout=30,
    )
    assert legacy.status_code == 400, legacy.text
    with contextlib.closing(open_store(gw.data_dir)) as store:
        audit_topic = store.describe_topic("dc1.logbroker-audit")
    assert sum(p.end_offset for p in audit_topic.partitions) == 3  # the three allowed records


def _answer_of(sock: socket.socket) -> bytes:
    """What the gateway sends until it closes the connection (or 10 s pass)."""
    sock.settimeout(10)
    answer = b""
    while True:
        try:
            piece = sock.recv(65536)
        except ConnectionResetError:  # it closed with the rest of our head unread
            break
        if not piece:
            break
        answer += piece
    return answer


def _resident_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("VmRSS:")[1].split()[0])


def test_a_head_over_64_kib_gets_431_without_a_token_and_is_not_held_in_memory(
    start_gateway: Any, tmp_path: Path, client_for: Any
) -> None:
    gw = start_configured(start_gateway, tmp_path)
    assert gw.proc is not None
    before = _resident_kib(gw.proc.pid)
    header_flood = b"".join(b"X-Flood-%d: %s\r\n" % (i, b"a" * 100) for i in range(1000))
    with socket.create_connection(("127.0.0.1", gw.port)) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + header_flood + b"\r\n")
        answer = _answer_of(sock)
    assert answer.startswith(b"HTTP/1.1 431"), answer[:200]
    assert answer.split(b"\r\n\r\n", 1)[1].startswith(b'{"error": "headers_too_large"')
    # four connections each sending one 32 MiB header line: each is cut off at 64 KiB
    socks = [socket.create_connection(("127.0.0.1", gw.port)) for _ in range(4)]
    try:
        for sock in socks:
            sock.sendall(b"POST /v1/write HTTP/1.1\r\nHost: x\r\nX-Big: ")
        piece = b"a" * (1 << 20)
        for sock in socks:
            with contextlib.suppress(OSError):  # refused and closed part way
                for _ in range(32):
                    sock.sendall(piece)
        assert _resident_kib(gw.proc.pid) - before < 64 * 1024
    finally:
        for sock in socks:
            sock.close()
    assert client_for(gw.url, "writer-token").write("after-flood", [1]).status_code == 200


def test_a_connection_that_sends_no_head_in_time_is_closed_with_408(
    start_gateway: Any, tmp_path: Path, client_for: Any
) -> None:
    gw = start_configured(start_gateway, tmp_path)  # request_timeout_s = 1.0
    with (
        socket.create_connection(("127.0.0.1", gw.port)) as silent,
        socket.create_connection(("127.0.0.1", gw.port)) as trickling,
    ):
        trickling.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # never ends its head
        started = time.monotonic()
        assert client_for(gw.url, "writer-token").write("meanwhile", [1]).status_code == 200
        for sock in (silent, trickling):
            answer = _answer_of(sock)
            assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
            assert b'"request_timeout"' in answer
        assert time.monotonic() - started < 5
    # a kept-alive connection: its second request's head is timed as well
    with socket.create_connection(("127.0.0.1", gw.port)) as kept:
        kept.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /healthz HTTP/1.1\r\n")
        answer = _answer_of(kept)
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    assert b"HTTP/1.1 408" in answer


def test_a_request_the_http_parser_cannot_read_gets_a_json_400(
    start_gateway: Any, tmp_path: Path
) -> None:
    gw = start_configured(start_gateway, tmp_path)
    with socket.create_connection(("127.0.0.1", gw.port)) as sock:
        sock.sendall(
            b"POST /v1/write HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer writer-token\r\n"
            b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
        )
        answer = _answer_of(sock)
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    assert b"application/json" in answer
    assert b'"bad_http"' in answer
    assert written(gw.data_dir) == {}


def test_serve_with_the_kafka_store_and_several_workers_is_refused_with_exit_2(
    tmp_path: Path,
) -> None:
    result = subprocess.run(
        logbroker_cmd(
            "serve",
            "--data-dir",
            str(tmp_path / "d"),
            "--store",
            "kafka",
            "--kafka-bootstrap",
            "127.0.0.1:9",
            "--workers",
            "2",
        ),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "one worker per gateway" in result.stderr
    assert not (tmp_path / "d").exists()


def test_one_address_holds_at_most_max_connections_per_client(
    start_gateway: Any, tmp_path: Path
) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text("[limits]\nmax_connections_per_client = 3\n")
    gw = start_gateway(tmp_path / "data", "--config", str(config))
    held = [socket.create_connection(("127.0.0.1", gw.port)) for _ in range(3)]
    try:
        with socket.create_connection(("127.0.0.1", gw.port)) as one_more:
            started = time.monotonic()
            answer = _answer_of(one_more)
            assert answer.startswith(b"HTTP/1.1 429"), answer[:200]
            assert b'"too_many_connections"' in answer
            assert b"max_connections_per_client" in answer
            assert time.monotonic() - started < 5  # at once, not at the head's timeout
        # another address is another client
        with socket.socket() as other:
            other.bind(("127.0.0.2", 0))
            other.connect(("127.0.0.1", gw.port))
            other.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            assert _answer_of(other).startswith(b"HTTP/1.1 200")
        held.pop().close()  # a connection closed frees its place
        deadline = time.monotonic() + 5
        status = 0
        while status != 200 and time.monotonic() < deadline:
            with contextlib.suppress(httpx.TransportError):  # answered before its request
                status = httpx.get(gw.url + "/healthz", timeout=5).status_code
            time.sleep(0.05)
        assert status == 200
    finally:
        for sock in held:
            sock.close()
