"""A push endpoint's user and password (``http://user:password@host/path``) stay out of the
gateway's log: at ``--log-level info`` httpx logged every delivery's whole URL."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from tests.delivery.conftest import PUSH_TO_LOOPBACK, wait_until


def test_a_push_endpoints_password_is_not_in_the_gateway_log(
    start_gateway: Any, push_endpoint: Any, tmp_path: Path
) -> None:
    gateway = start_gateway(tmp_path / "data", *PUSH_TO_LOOPBACK, "--log-level", "info")
    endpoint = push_endpoint(lambda n: ("ok", 200))
    with_password = endpoint.url.replace("http://", "http://deliverer:s3cret-pw@", 1)
    line = b'{"log_type":"app","source_id":"host-a:app.log","seqno":1,"data":"one\\n"}\n'
    written = httpx.post(
        gateway.url + "/v1/write",
        content=line,
        headers={"Content-Type": "application/x-ndjson"},
        timeout=30,
    )
    assert written.status_code == 200, written.text
    subscription = {"name": "creds", "endpoint": with_password, "topics": ["dc1.app"]}
    created = httpx.post(gateway.url + "/v1/subscriptions", json=subscription, timeout=30)
    assert created.status_code == 201, created.text
    wait_until(lambda: len(endpoint.messages()) >= 1, 30, "the line delivered")
    log = gateway.log_path.read_text()
    assert "s3cret-pw" not in log, [row for row in log.splitlines() if "s3cret-pw" in row]
