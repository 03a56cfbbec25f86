"""docs/configuration.md names every setting the gateway and the push-client accept."""

from __future__ import annotations

import dataclasses
import re

from ingest_api import settings as gateway_settings
from log_store.kafka import KafkaSettings
from push_client import config as push_config
from tests.conftest import REPO

PAGE = REPO / "docs" / "configuration.md"


def documented_keys(section: str) -> set[str]:
    """The backticked keys in the first column of the tables under the heading ``section``."""
    text = PAGE.read_text()
    start = text.index(f"### {section}\n")
    end = text.find("\n### ", start + 1)
    body = text[start : end if end != -1 else len(text)]
    keys: set[str] = set()
    for line in body.splitlines():
        if line.startswith("| `"):
            first = line.split("|")[1]
            keys.update(re.findall(r"`([a-z_]+)`", first))
    return keys


def test_every_gateway_setting_is_documented() -> None:
    top = {f.name for f in dataclasses.fields(gateway_settings.GatewaySettings)}
    top -= {"tokens", "limits", "kafka"}  # tables of their own below
    assert top <= documented_keys("Top-level keys"), top - documented_keys("Top-level keys")
    limits = {f.name for f in dataclasses.fields(gateway_settings.Limits)}
    assert limits <= documented_keys("`[limits]`"), limits - documented_keys("`[limits]`")
    grant = set(gateway_settings._GRANT_GLOBS) | set(gateway_settings._GRANT_FLAGS) | {"name"}
    tokens = documented_keys("`[tokens.<token>]`")
    assert grant <= tokens, grant - tokens
    kafka = set(gateway_settings._KAFKA_KEYS)
    assert kafka <= documented_keys('`[kafka]` (with `store = "kafka"`)')
    assert kafka <= {f.name for f in dataclasses.fields(KafkaSettings)}


def test_every_push_client_setting_is_documented() -> None:
    push = set(push_config._PUSH_KEYS) | push_config._INT_KEYS
    assert push <= documented_keys("`[push]`"), push - documented_keys("`[push]`")
    entry = set(push_config._ENTRY_KEYS)
    assert entry <= documented_keys("`[[entry]]`"), entry - documented_keys("`[[entry]]`")


def test_every_push_client_flag_is_documented() -> None:
    """A flag of ``logbroker push --help`` that the push-client's section does not name could
    not be mapped to its key (``host`` is ``--host-name``, ``inotify = false``
    ``--no-inotify``)."""
    from ops.cli import build_parser

    parser, _modules = build_parser("push")
    push = parser.get_default("_parser_push")
    flags = {o for a in push._actions for o in a.option_strings if o.startswith("--")}
    text = PAGE.read_text()
    section = text[text.index("## The push-client\n") :]
    missing = {f for f in flags - {"--help"} if f"`{f}" not in section}
    assert not missing, missing
