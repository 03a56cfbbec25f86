"""One token creates at most its share of the topics created on first use
(``max_topics_per_token``, a quarter of ``max_topics`` by default): at its share its own new log
types are refused 429 while the other tokens go on creating theirs; a request of several new
topics is admitted or refused whole; the count survives a restart (the creator is recorded
with the topic) and a deleted topic stops counting.  Admin tokens are held to ``max_topics``
only."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from ingest_api.framing import BINARY_MEDIA_TYPE, encode_binary
from ingest_api.settings import ConfigError, Limits, load_settings
from log_store import open_store
from tests.conftest import GatewayProcess
from tests.gateway.conftest import end_offsets, meta
from tests.metrics_text import sample

MAX_TOPICS = 20
SHARE = MAX_TOPICS // 4  # the default share
TENANTS = {"tenant-a": "tenant-a-token-0123", "tenant-b": "tenant-b-token-0123"}
ADMIN = "topic-share-admin-0123"
CONFIG = f"""
partitions = 1

[limits]
max_topics = {MAX_TOPICS}

[tokens.{TENANTS["tenant-a"]}]
name = "tenant-a"
write = ["*"]
[tokens.{TENANTS["tenant-b"]}]
name = "tenant-b"
write = ["*"]
[tokens.{ADMIN}]
admin = true
"""


def _start(base: Path) -> GatewayProcess:
    config = base / "gateway.toml"
    config.write_text(CONFIG)
    return GatewayProcess(base / "data", ["--config", str(config)], base / "gw.log").start()


def _http(gateway: GatewayProcess, token: str) -> httpx.Client:
    return httpx.Client(
        base_url=gateway.url, timeout=30, headers={"Authorization": f"Bearer {token}"}
    )


def _write(http: httpx.Client, log_types: list[str], seqno: int = 1) -> httpx.Response:
    body = encode_binary([(meta("s", t), [(seqno, 0, b"x\n")]) for t in log_types])
    return http.post("/v1/write", content=body, headers={"content-type": BINARY_MEDIA_TYPE})


def _topics(gateway: GatewayProcess) -> set[str]:
    store = open_store(gateway.data_dir)
    try:
        return {t.name for t in store.list_topics() if t.name.startswith("dc1.t")}
    finally:
        store.close()


def _assert_share(response: httpx.Response, *reason: str) -> None:
    assert response.status_code == 429, response.text
    answer = response.json()
    assert (answer["error"], answer["limit"], answer["max"]) == (
        "limit_reached",
        "max_topics_per_token",
        SHARE,
    )
    for words in ("max_topics_per_token", *reason):
        assert words in answer["reason"], answer["reason"]


def _metric(gateway: GatewayProcess, name: str, **labels: str) -> float | None:
    text = httpx.get(
        gateway.url + "/metrics", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30
    ).text
    return sample(text, name, **labels)


def test_a_token_at_its_share_is_refused_new_topics_and_the_others_are_not(
    tmp_path: Path,
) -> None:
    gateway = _start(tmp_path)
    a, b, admin = (_http(gateway, t) for t in (*TENANTS.values(), ADMIN))
    try:
        mine = [f"ta{i}" for i in range(SHARE)]
        assert _write(a, mine[:1]).status_code == 200
        # several new topics: over the share they are refused together, none is created
        over = _write(a, [*mine[1:], "ta-extra"])
        _assert_share(over, f"this request would create {SHARE} more", "none was created")
        assert _topics(gateway) == {"dc1.ta0"}
        fitting = _write(a, mine[1:])  # as many as fit are written whole
        assert fitting.status_code == 200, fitting.text
        offsets = end_offsets(gateway.data_dir)

        # at its share: a write, a session, a legacy commit of a new log type are refused ...
        _assert_share(_write(a, ["ta-more"], seqno=2), "'dc1.ta-more' was not created")
        _assert_share(a.post("/v1/sessions", json=meta("s", "ta-more")))
        staged = a.post("/store", params={"log_type": "ta-legacy"}, content=b"x\n")
        assert staged.status_code == 200, staged.text
        _assert_share(a.post("/commit_request", params={"store_id": staged.json()["store_id"]}))
        assert end_offsets(gateway.data_dir) == offsets
        # ... on their own: beside them, the sections and sessions of its topics go on (a
        # push-client batches the files of all its log types into one request)
        mixed = _write(a, ["ta-more", "ta0"], seqno=2)
        assert mixed.status_code == 200, mixed.text
        refused, written = mixed.json()["results"]
        assert (refused["status"], refused["error"], refused["limit"]) == (
            429,
            "limit_reached",
            "max_topics_per_token",
        )
        assert "'dc1.ta-more' was not created" in refused["reason"]
        assert written["acks"][0]["status"] == "written"
        assert end_offsets(gateway.data_dir) == {**offsets, ("dc1.ta0", 0): 2}
        batch = a.post("/v1/sessions", json={"sessions": [meta("n", "ta-more"), meta("s", "ta1")]})
        assert batch.status_code == 200, batch.text
        refused, opened = batch.json()["sessions"]
        assert (refused["status"], refused["limit"]) == (429, "max_topics_per_token")
        assert (opened["topic"], opened["last_seqno"]) == ("dc1.ta1", 1)
        # ... its topics take writes as before ...
        assert _write(a, mine, seqno=2).status_code == 200
        # ... and the other tenant, and an admin, still create topics
        assert _write(b, ["tb0"]).status_code == 200
        assert _write(admin, ["tadmin0"]).status_code == 200
        assert _topics(gateway) == {f"dc1.{t}" for t in [*mine, "tb0", "tadmin0"]}

        assert _metric(gateway, "logbroker_topics_created", owner="tenant-a") == SHARE
        assert _metric(gateway, "logbroker_topics_created", owner="tenant-b") == 1
        refusals = "logbroker_limit_refusals_total"
        assert _metric(gateway, refusals, limit="max_topics_per_token") == 6

        # the creators are recorded with the topics: a restarted gateway counts the same
        gateway.kill()
        gateway = _start(tmp_path)
        for client in (a, b, admin):
            client.base_url = httpx.URL(gateway.url)
        _assert_share(_write(a, ["ta-more"]))
        # a deleted topic no longer counts against its creator
        deleted = admin.delete("/v1/topics/dc1.ta0")
        assert deleted.status_code == 200, deleted.text
        assert _write(a, ["ta-more"]).status_code == 200
        _assert_share(_write(a, ["ta-again"]))
    finally:
        for client in (a, b, admin):
            client.close()
        gateway.kill()


def test_the_share_is_a_quarter_of_max_topics_unless_configured(tmp_path: Path) -> None:
    assert Limits(max_topics=100).topics_per_token == 25
    assert Limits(max_topics=3).topics_per_token == 1
    assert Limits(max_topics=100, max_topics_per_token=100).topics_per_token == 100
    config = tmp_path / "gateway.toml"
    config.write_text("[limits]\nmax_topics_per_token = -1\n")
    with pytest.raises(ConfigError, match="max_topics_per_token must be >= 0"):
        load_settings(config_file=config, env={}, flags={"data_dir": str(tmp_path)})
