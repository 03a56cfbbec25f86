"""The partition owners' routes on the embedded store: every partition is the gateway's own,
and bad input or a token without the grant gets the usual JSON errors, changing nothing."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.conftest import GatewayProcess
from tests.gateway.conftest import Client

WRITER = "writer-secret"
READER = "reader-secret"
OTHER = "other-secret"
CONFIG = f"""
[tokens.{WRITER}]
write = ["app"]

[tokens.{READER}]
read = ["dc1.app"]

[tokens.{OTHER}]
write = ["other"]
read = ["dc1.other"]
"""


def test_owner_routes_answer_this_gateway_and_refuse_bad_input_and_foreign_tokens(
    tmp_path: Path,
) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text(CONFIG)
    gateway = GatewayProcess(
        tmp_path / "data", ["--config", str(config), "--partitions", "3"], tmp_path / "gw.log"
    ).start()
    writer = Client(gateway.url, WRITER)
    http = httpx.Client(base_url=gateway.url, timeout=30)

    def get(path: str, token: str | None, **params: str) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return http.get(path, params=params, headers=headers)

    try:
        # before the topic exists: 404, as for the topic's other routes
        missing = get("/v1/owners", WRITER, log_type="app")
        assert missing.status_code == 404, missing.text
        assert missing.json()["error"] == "unknown_topic"
        assert writer.write("src-1", [1]).status_code == 200
        expected = {
            "topic": "dc1.app",
            "gateway": gateway.url,
            "partitions": [{"partition": p, "owner": gateway.url} for p in range(3)],
        }
        by_log_type = get("/v1/owners", WRITER, log_type="app")
        assert by_log_type.status_code == 200, by_log_type.text
        assert by_log_type.json() == expected
        by_topic = get("/v1/topics/dc1.app/owners", READER)
        assert by_topic.status_code == 200, by_topic.text
        assert by_topic.json() == expected

        refusals = [
            (get("/v1/owners", None, log_type="app"), 401, "unauthorized"),
            (get("/v1/owners", "not-a-token", log_type="app"), 401, "unauthorized"),
            (get("/v1/owners", OTHER, log_type="app"), 403, "forbidden"),
            (get("/v1/owners", READER, log_type="app"), 403, "forbidden"),
            (get("/v1/topics/dc1.app/owners", None), 401, "unauthorized"),
            (get("/v1/topics/dc1.app/owners", OTHER), 403, "forbidden"),
            (get("/v1/topics/dc1.app/owners", WRITER), 403, "forbidden"),
            (get("/v1/owners", WRITER), 400, "bad_request"),
            (get("/v1/owners", WRITER, log_type="Bad/Type"), 403, "forbidden"),
            (get("/v1/topics/Bad..name/owners", READER), 400, "bad_request"),
            (get("/v1/topics/dc1.nothing/owners", READER), 403, "forbidden"),
        ]
        for response, status, error in refusals:
            assert response.status_code == status, (response.request.url, response.text)
            body = response.json()
            assert body["error"] == error and body["reason"], body
    finally:
        writer.close()
        http.close()
        gateway.kill()


def test_owner_route_refuses_an_invalid_log_type_with_400(tmp_path: Path) -> None:
    gateway = GatewayProcess(tmp_path / "data", [], tmp_path / "gw.log").start()
    try:
        for log_type in ("Bad/Type", "", "x" * 300, "..a"):
            response = httpx.get(
                gateway.url + "/v1/owners", params={"log_type": log_type}, timeout=30
            )
            assert response.status_code == 400, (log_type, response.text)
            assert response.json()["error"] == "bad_request"
        unknown = httpx.get(gateway.url + "/v1/owners", params={"log_type": "app"}, timeout=30)
        assert unknown.status_code == 404 and unknown.json()["error"] == "unknown_topic"
    finally:
        gateway.kill()
