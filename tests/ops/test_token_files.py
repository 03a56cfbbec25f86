"""Tokens from files readable only by their owner, never from the command line of every user."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from tests.conftest import REPO, logbroker_cmd
from tests.delivery.conftest import Writer


def _token_file(path: Path, token: str, mode: int = 0o600) -> Path:
    path.write_text(token + "\n")
    path.chmod(mode)
    return path


def _read(url: str, *token_args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        logbroker_cmd(
            "read", "--server", url, "--topic", "dc1.app", "--from-beginning",
            "--format", "jsonl", "--idle-exit", "1", *token_args,
        ),
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_read_takes_its_token_from_a_file_and_refuses_one_others_may_read(
    start_gateway: Any, tmp_path: Path
) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text('[tokens.reader-secret]\nread = ["dc1.*"]\nwrite = ["app"]\n')
    gw = start_gateway(tmp_path / "data", "--config", str(config))
    writer = Writer(gw.url, token="reader-secret")
    writer.write("s", [1, 2])
    writer.close()
    private = _token_file(tmp_path / "private.token", "reader-secret")
    done = _read(gw.url, "--token-file", str(private))
    assert done.returncode == 0, done.stderr
    assert [json.loads(line)["seqno"] for line in done.stdout.splitlines()] == [1, 2]
    shared = _token_file(tmp_path / "shared.token", "reader-secret", 0o644)
    refused = _read(gw.url, "--token-file", str(shared))
    assert refused.returncode == 2
    assert "chmod 600" in refused.stderr and refused.stdout == ""
    both = _read(gw.url, "--token", "reader-secret", "--token-file", str(private))
    assert both.returncode == 2


def test_serve_warns_when_its_tokens_may_be_read_by_other_users(
    start_gateway: Any, tmp_path: Path
) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text('[tokens.s3cr3t]\nread = ["dc1.*"]\n')
    config.chmod(0o644)
    shared = start_gateway(tmp_path / "a", "--config", str(config))
    assert f"{config} holds bearer tokens and may be read by other users" in shared.log()
    assert f"chmod 600 {config}" in shared.log()
    config.chmod(0o600)
    kept = start_gateway(tmp_path / "b", "--config", str(config))
    assert "may be read by other users" not in kept.log()
