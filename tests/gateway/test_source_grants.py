"""A token writes only its own sources: ``sources`` globs, and legacy transaction ids bound to
the token that requested them (docs/security.md, "Sources and transaction ids").

Without either, any token allowed to write a log type could end another token's source (a
chunk of seqno 2**63-1 makes its every later chunk a ``duplicate``, which a push-client takes
as acknowledged), fence it, write under its name, or commit the data another token squatted
under a transaction id.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from delivery.legacy_txn import StagedData, write_data
from ingest_api.framing import BINARY_MEDIA_TYPE, encode_binary
from ingest_api.settings import ConfigError, load_settings
from log_store import open_store
from log_store.interface import TopicConfig
from push_client.identity import FileIdentity, make_source_id
from session_dedup.source import MAX_SEQNO
from tests.conftest import GatewayProcess
from tests.gateway.conftest import end_offsets, meta

HOST_A = "tok-host-a"
HOST_C = "tok-host-c"
OPEN_B = "tok-open-b"
OPEN_D = "tok-open-d"
ADMIN = "tok-admin"
CONFIG = f"""
partitions = 2

[tokens.{HOST_A}]
name = "host-a"
write = ["app"]
read = ["dc1.*"]
sources = ["host-a:*", "legacy:host-a-*"]

[tokens.{HOST_C}]
name = "host-c"
write = ["app"]
sources = ["host-c:*", "legacy:host-c-*"]

[tokens.{OPEN_B}]
name = "tenant-b"
write = ["app"]

[tokens.{OPEN_D}]
name = "tenant-d"
write = ["app"]

[tokens.{ADMIN}]
admin = true
"""
SOURCE_A = make_source_id("host-a", FileIdentity(2049, 77, "1c9e0a2b3c4d5e6f"))
OLD_TXN = "before-owners"


def _write_old_transaction(data_dir: Path) -> None:
    """A transaction as a gateway from before owners were recorded left it: data, no owner."""
    store = open_store(data_dir)
    try:
        store.create_topic("dc1.app", TopicConfig(partitions=2))
        staged = StagedData("0" * 32, "app", "old1", "/a", b"old data\n", txn_id=OLD_TXN)
        write_data(store, "dc1.app", 2, OLD_TXN, staged)
    finally:
        store.close()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    base = tmp_path_factory.mktemp("source-grants")
    _write_old_transaction(base / "data")
    config = base / "gateway.toml"
    config.write_text(CONFIG)
    started = GatewayProcess(base / "data", ["--config", str(config)], base / "gw.log").start()
    yield started
    started.kill()


def _http(gateway: GatewayProcess, token: str) -> httpx.Client:
    return httpx.Client(
        base_url=gateway.url, timeout=30, headers={"Authorization": f"Bearer {token}"}
    )


def _write(http: httpx.Client, sections: list[tuple[str, list[int]]]) -> httpx.Response:
    body = encode_binary(
        [(meta(s), [(n, 0, f"{s} {n}\n".encode()) for n in ns]) for s, ns in sections]
    )
    return http.post("/v1/write", content=body, headers={"content-type": BINARY_MEDIA_TYPE})


def _refused_for(source_id: str) -> str:
    return f"this token may not write source {source_id!r}"


def test_the_push_clients_source_ids_of_a_host_match_its_sources_glob() -> None:
    # docs/security.md shows sources = ["<host>:*"]: every id the push-client makes for a
    # file of that host starts with "<host>:" (also after rotation: a generation suffix)
    assert SOURCE_A.startswith("host-a:")
    regenerated = make_source_id("host-a", FileIdentity(2049, 77, "1c9e0a2b3c4d5e6f"), 3)
    assert regenerated.startswith("host-a:") and regenerated.endswith("#g3")


def test_another_token_cannot_end_fence_or_write_a_source_outside_its_globs(
    gateway: GatewayProcess,
) -> None:
    owner, other = _http(gateway, HOST_A), _http(gateway, HOST_C)
    first = _write(owner, [(SOURCE_A, [1])])
    assert first.status_code == 200, first.text
    before = end_offsets(gateway.data_dir)

    # the seqno that would make every later chunk of host-a a "duplicate": refused, alone
    takeover = _write(other, [(SOURCE_A, [MAX_SEQNO])])
    assert takeover.status_code == 403, takeover.text
    assert takeover.json()["error"] == "forbidden"
    assert _refused_for(SOURCE_A) in takeover.json()["reason"]
    # fencing it, alone or in a batch, is refused the same way
    fence = other.post("/v1/sessions", json={**meta(SOURCE_A), "fence": True})
    assert fence.status_code == 403 and _refused_for(SOURCE_A) in fence.json()["reason"]
    # beside a source of its own: that one is written, host-a's section refused on its own
    mixed = _write(other, [("host-c:1:2:ff", [1]), (SOURCE_A, [MAX_SEQNO])])
    assert mixed.status_code == 200, mixed.text
    written, refused = mixed.json()["results"]
    assert [a["status"] for a in written["acks"]] == ["written"]
    assert refused == {
        "source_id": SOURCE_A,
        "status": 403,
        "error": "forbidden",
        "reason": refused["reason"],
    }
    assert _refused_for(SOURCE_A) in refused["reason"] and "'host-c:*'" in refused["reason"]
    batch = other.post(
        "/v1/sessions",
        json={"sessions": [{**meta(SOURCE_A), "fence": True}, {**meta("host-c:1:2:ff")}]},
    )
    assert batch.status_code == 200, batch.text
    fenced, opened = batch.json()["sessions"]
    assert (fenced["status"], fenced["error"]) == (403, "forbidden")
    assert opened["last_seqno"] == 1
    # nothing of host-a's changed: only host-c's one chunk was written
    after = end_offsets(gateway.data_dir)
    assert sum(after.values()) == sum(before.values()) + 1

    # so host-a goes on: its next chunk is written (not a "duplicate"), its epoch is still 0
    session = owner.post("/v1/sessions", json=meta(SOURCE_A)).json()
    assert (session["last_seqno"], session["epoch"]) == (1, 0)
    resumed = _write(owner, [(SOURCE_A, [2])])
    assert [a["status"] for a in resumed.json()["results"][0]["acks"]] == ["written"]


def test_tokens_without_sources_trust_each_other_with_every_source(
    gateway: GatewayProcess,
) -> None:
    # today's behaviour, kept for tokens that do not say `sources` (and documented)
    b, d, admin = _http(gateway, OPEN_B), _http(gateway, OPEN_D), _http(gateway, ADMIN)
    assert _write(b, [("shared:1", [1])]).status_code == 200
    assert _write(d, [("shared:1", [2])]).status_code == 200
    # and a scoped token's source is open to them: the globs bind the token that has them
    assert _write(d, [("host-a:9:9:9", [1])]).status_code == 200
    assert _write(admin, [("host-c:9:9:9", [1])]).status_code == 200


class _Legacy:
    def __init__(self, gateway: GatewayProcess, token: str) -> None:
        self.http = _http(gateway, token)

    def stage(self, data: bytes) -> str:
        response = self.http.post("/store", params={"log_type": "app"}, content=data)
        assert response.status_code == 200, response.text
        store_id: str = response.json()["store_id"]
        return store_id

    def request(self, store_id: str, txn_id: str) -> httpx.Response:
        return self.http.post("/commit_request", params={"store_id": store_id, "txn_id": txn_id})

    def commit(self, txn_id: str) -> httpx.Response:
        return self.http.post("/commit", params={"txn_id": txn_id, "log_type": "app"})


def test_a_transaction_id_belongs_to_the_token_that_requested_it(
    gateway: GatewayProcess,
) -> None:
    squatter, victim = _Legacy(gateway, OPEN_B), _Legacy(gateway, OPEN_D)
    squatters_piece = squatter.stage(b"evil data\n")
    squatted = squatter.request(squatters_piece, "nightly-2026-11-27")
    assert squatted.status_code == 200, squatted.text
    before = end_offsets(gateway.data_dir)
    # the victim cannot write under the id (as before) ...
    staged = victim.stage(b"real data\n")
    taken = victim.request(staged, "nightly-2026-11-27")
    assert (taken.status_code, taken.json()["error"]) == (409, "txn_id_taken"), taken.text
    # ... and no longer commits the squatter's data believing it its own
    commit = victim.commit("nightly-2026-11-27")
    assert commit.status_code == 403, commit.text
    assert "belongs to another token" in commit.json()["reason"]
    assert end_offsets(gateway.data_dir) == before
    # its piece is still staged and goes under another id
    assert victim.request(staged, "nightly-2026-11-27b").status_code == 200
    assert victim.commit("nightly-2026-11-27b").json()["committed"] is True
    # an old client doing every step with one token works as before, repeats included
    repeated = squatter.request(squatters_piece, "nightly-2026-11-27")
    assert repeated.json() == squatted.json()
    first = squatter.commit("nightly-2026-11-27")
    assert first.status_code == 200 and first.json()["committed"] is True
    assert squatter.commit("nightly-2026-11-27").json() == first.json()
    # an admin may commit any token's transaction
    own = victim.request(victim.stage(b"more\n"), "admin-commits-it")
    assert own.status_code == 200
    assert _Legacy(gateway, ADMIN).commit("admin-commits-it").status_code == 200


def test_a_staged_piece_is_requested_only_by_the_token_that_staged_it(
    gateway: GatewayProcess,
) -> None:
    owner, other = _Legacy(gateway, OPEN_B), _Legacy(gateway, OPEN_D)
    piece = owner.stage(b"tenant b's line\n")
    before = end_offsets(gateway.data_dir)
    refused = other.request(piece, "other-takes-it")
    assert refused.status_code == 403, refused.text
    assert "staged by another token" in refused.json()["reason"]
    assert end_offsets(gateway.data_dir) == before
    # still the owner's to request (not bound to the refused id), and an admin's
    assert owner.request(piece, "owner-takes-it").status_code == 200
    assert owner.commit("owner-takes-it").json()["committed"] is True
    assert _Legacy(gateway, ADMIN).request(owner.stage(b"x\n"), "admin-takes-it").status_code == 200


def test_a_transaction_written_before_owners_were_recorded_is_anyones_as_before(
    gateway: GatewayProcess,
) -> None:
    committed = _Legacy(gateway, OPEN_D).commit(OLD_TXN)
    assert committed.status_code == 200, committed.text
    assert committed.json()["committed"] is True


def test_a_token_with_sources_writes_only_its_own_transaction_ids(
    gateway: GatewayProcess,
) -> None:
    host_c = _Legacy(gateway, HOST_C)
    staged = host_c.stage(b"c data\n")
    before = end_offsets(gateway.data_dir)
    outside = host_c.request(staged, "host-a-nightly")
    assert outside.status_code == 403, outside.text
    assert _refused_for("legacy:host-a-nightly") in outside.json()["reason"]
    assert host_c.commit("host-a-nightly").status_code == 403
    assert end_offsets(gateway.data_dir) == before
    assert host_c.request(staged, "host-c-nightly").status_code == 200
    assert host_c.commit("host-c-nightly").status_code == 200


def test_sources_must_be_a_list_of_globs_and_rotated_tokens_share_them(tmp_path: Path) -> None:
    def load(text: str) -> Any:
        path = tmp_path / "gateway.toml"
        path.write_text(f'data_dir = "{tmp_path / "data"}"\n' + text)
        return load_settings(config_file=path, env={})

    granted = load('[tokens.t1]\nname = "h"\nwrite = ["app"]\nsources = ["h:*"]\n')
    assert granted.tokens["t1"].write_sources == ("h:*",)
    assert load('[tokens.t1]\nwrite = ["app"]\n').tokens["t1"].write_sources is None
    with pytest.raises(ConfigError, match="sources must be a list"):
        load('[tokens.t1]\nwrite = ["app"]\nsources = "h:*"\n')
    with pytest.raises(ConfigError, match="grant different things"):
        load(
            '[tokens.t1]\nname = "h"\nwrite = ["app"]\nsources = ["h:*"]\n'
            '[tokens.t2]\nname = "h"\nwrite = ["app"]\n'
        )
    # the workers get the same grants (settings travel to them as JSON)
    again = type(granted).from_json(granted.to_json())
    assert again.tokens["t1"].write_sources == ("h:*",)
