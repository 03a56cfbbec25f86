"""A token the gateway refuses is a configuration error: every command exits 2 and says why."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO, GatewayProcess, logbroker_cmd

# the commands that talk to a gateway with a token, each with its shortest call
_COMMANDS: dict[str, list[str]] = {
    "topics": ["topics", "list", "--server", "{url}"],
    "audit": ["audit", "--windows", "--server", "{url}", "--db", "{tmp}/audit.db"],
    "schemas": ["schemas", "list", "--server", "{url}"],
    "read": ["read", "--server", "{url}", "--topic", "dc1.app", "--idle-exit", "1"],
    "load": ["load", "--server", "{url}", "--warehouse", "{tmp}/warehouse"],
}


@pytest.fixture(scope="module")
def tokened(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    base = tmp_path_factory.mktemp("tokened")
    config = base / "gateway.toml"
    # "nothing" may do nothing at all: every route but the public ones refuses it (403)
    config.write_text('[tokens.reader-secret]\nread = ["dc1.*"]\n\n[tokens.nothing]\n')
    config.chmod(0o600)
    gateway = GatewayProcess(base / "data", ["--config", str(config)], base / "gw.log").start()
    yield gateway
    gateway.kill()


def _run(command: str, url: str, tmp: Path, *token_args: str) -> subprocess.CompletedProcess[str]:
    argv = [a.format(url=url, tmp=tmp) for a in _COMMANDS[command]]
    return subprocess.run(
        logbroker_cmd(*argv, *token_args),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("command", sorted(_COMMANDS))
def test_every_command_exits_2_for_a_token_the_gateway_refuses(
    tokened: GatewayProcess, tmp_path: Path, command: str
) -> None:
    unknown = _run(command, tokened.url, tmp_path, "--token", "not-a-token")
    assert unknown.returncode == 2, unknown.stderr
    assert "unknown bearer token" in unknown.stderr, unknown.stderr
    assert unknown.stderr.startswith(f"logbroker {command}: ")
    missing = _run(command, tokened.url, tmp_path)
    assert missing.returncode == 2, missing.stderr
    without_grant = _run(command, tokened.url, tmp_path, "--token", "nothing")
    assert without_grant.returncode == 2, without_grant.stderr
    assert "this token may" in without_grant.stderr, without_grant.stderr
    shared = tmp_path / "shared.token"
    shared.write_text("reader-secret\n")
    shared.chmod(0o644)
    unusable = _run(command, tokened.url, tmp_path, "--token-file", str(shared))
    assert unusable.returncode == 2 and "chmod 600" in unusable.stderr, unusable.stderr
