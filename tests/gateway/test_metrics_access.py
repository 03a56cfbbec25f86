"""With tokens on, ``/metrics`` needs a token with ``metrics = true`` unless the configuration
says ``metrics_require_token = false``: its labels name every tenant's topics and groups."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from ingest_api.app import build_app
from ingest_api.context import GatewayContext
from ingest_api.settings import load_settings
from log_store import open_store
from tests.conftest import logbroker_cmd

TENANT = "tenant-token"
SCRAPER = "scraper-token"
TOKENS = f"""
[tokens.{TENANT}]
write = ["app"]
read = ["dc1.app"]
[tokens.{SCRAPER}]
metrics = true
"""


def _metrics_status(tmp_path: Path, config_text: str, token: str | None) -> int:
    config = tmp_path / "gateway.toml"
    config.write_text(config_text)
    settings = load_settings(config_file=config, env={}, flags={"data_dir": str(tmp_path / "d")})
    app = build_app(
        GatewayContext(store=open_store(tmp_path / "d"), settings=settings), close_store=True
    )
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with TestClient(app, base_url="http://127.0.0.1") as client:
        return client.get("/metrics", headers=headers).status_code


@pytest.mark.parametrize(
    ("token", "status"),
    [(None, 401), (TENANT, 403), (SCRAPER, 200)],
    ids=["none", "tenant", "scraper"],
)
def test_with_tokens_metrics_need_a_metrics_token_by_default(
    tmp_path: Path, token: str | None, status: int
) -> None:
    assert _metrics_status(tmp_path, TOKENS, token) == status


def test_metrics_may_still_be_made_public_explicitly(tmp_path: Path) -> None:
    assert _metrics_status(tmp_path, "metrics_require_token = false\n" + TOKENS, None) == 200


def test_without_tokens_metrics_stay_public(tmp_path: Path) -> None:
    assert _metrics_status(tmp_path, "", None) == 200


def test_serve_warns_when_metrics_are_made_public_beside_tokens(tmp_path: Path) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text("metrics_require_token = false\n" + TOKENS)
    config.chmod(0o600)
    with socket.socket() as taken:  # serve stops at the bind, after reading its settings
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            logbroker_cmd(
                "serve",
                "--data-dir",
                str(tmp_path / "d"),
                "--config",
                str(config),
                "--port",
                str(port),
            ),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode != 0
    assert "metrics_require_token = false: /metrics answers anyone" in result.stderr
