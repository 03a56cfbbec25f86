"""A ``peer_token`` that is also a client token is refused when the configuration is loaded
(``serve`` exits 2 saying so): its holder would pass every internal route, which writes
anything anywhere.  Tokens shorter than 16 characters are warned about, not refused."""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

import pytest

from ingest_api.settings import ConfigError, load_settings
from tests.conftest import REPO, free_port, logbroker_cmd

_LONG = "0123456789abcdef0123"


def _config(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o600)
    return path


def test_serve_exits_2_when_the_peer_token_is_a_client_token(tmp_path: Path) -> None:
    config = _config(
        tmp_path / "gateway.toml",
        f'peer_token = "{_LONG}"\n\n[tokens.{_LONG}]\nname = "tenant-a"\nwrite = ["app"]\n',
    )
    done = subprocess.run(
        logbroker_cmd("serve", "--data-dir", str(tmp_path / "data"), "--port", str(free_port()),
                      "--config", str(config)),
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "logbroker serve: peer_token is also a client token ([tokens], the token of "
        "'tenant-a'): its holder could make the gateways' internal calls and write anything "
        "anywhere; give the gateways a peer_token of their own"
    )
    assert _LONG not in done.stderr  # the secret is never printed
    assert not (tmp_path / "data").exists()


def test_a_peer_token_equal_to_an_unnamed_client_token_is_refused_too(tmp_path: Path) -> None:
    config = _config(
        tmp_path / "gateway.toml",
        f'peer_token = "{_LONG}"\n\n[tokens.{_LONG}]\nread = ["dc1.*"]\n',
    )
    with pytest.raises(ConfigError, match="peer_token is also a client token"):
        load_settings(config_file=config, env={"LOGBROKER_DATA_DIR": str(tmp_path)})


def test_a_distinct_peer_token_is_accepted(tmp_path: Path) -> None:
    config = _config(
        tmp_path / "gateway.toml",
        f'peer_token = "{_LONG}-peer"\n\n[tokens.{_LONG}]\nwrite = ["app"]\n',
    )
    settings = load_settings(config_file=config, env={"LOGBROKER_DATA_DIR": str(tmp_path)})
    assert settings.peer_token == f"{_LONG}-peer"


def test_tokens_shorter_than_16_characters_are_warned_about_by_owner_not_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = _config(
        tmp_path / "gateway.toml",
        'peer_token = "peer"\n\n'
        '[tokens.tokA]\nname = "tenant-a"\nwrite = ["app"]\n\n'
        f'[tokens.{_LONG}]\nname = "tenant-b"\nwrite = ["app"]\n',
    )
    with caplog.at_level(logging.WARNING, logger="ingest_api.settings"):
        settings = load_settings(config_file=config, env={"LOGBROKER_DATA_DIR": str(tmp_path)})
    assert "tokA" in settings.tokens
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "the token of 'tenant-a' is 4 characters long: a token shorter than 16 characters can "
        "be guessed; give it at least 16 random ones (e.g. openssl rand -hex 16)",
        "peer_token is 4 characters long: a token shorter than 16 characters can be guessed; "
        "give it at least 16 random ones (e.g. openssl rand -hex 16)",
    ]
    assert not any("tokA" in w or "'peer'" in w for w in warnings)
