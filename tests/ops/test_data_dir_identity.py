"""A data dir says what it is (store kind, format, DC), and ``serve`` refuses one that is not
its own: exit 2 with one line, nothing made or changed there.

Before, a store opened as dc2 next to dc1 with one installation id, an embedded store's topics
were hidden by ``--store kafka`` without a word, a Kafka gateway's scratch dir or a
push-client's state dir became an empty embedded store, and nothing recorded a format.
"""

from __future__ import annotations

import sqlite3
import subprocess
from pathlib import Path

import httpx
import pytest

from log_store import open_store
from log_store.data_dir_kind import FORMAT_VERSION, record_kafka_scratch
from tests.conftest import REPO, GatewayProcess, free_port, logbroker_cmd

_NO_KAFKA = ("--store", "kafka", "--kafka-bootstrap", "127.0.0.1:1")


def _serve(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        logbroker_cmd("serve", "--data-dir", str(data_dir), "--port", str(free_port()), *args),
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def _recorded(data_dir: Path) -> dict[str, str]:
    with sqlite3.connect(data_dir / "catalog.db") as catalog:
        found = dict(catalog.execute("SELECT key, value FROM data_dir").fetchall())
    catalog.close()
    return found


def _listing(directory: Path) -> list[str]:
    """The files under ``directory`` but SQLite's own -wal/-shm (a reader may leave them)."""
    return sorted(
        str(p.relative_to(directory))
        for p in directory.rglob("*")
        if not p.name.endswith(("-wal", "-shm"))
    )


def test_a_store_served_as_dc1_is_refused_as_dc2_naming_both(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    first = GatewayProcess(data_dir, [], tmp_path / "dc1.log").start()
    try:
        response = httpx.post(
            first.url + "/v1/write",
            content=b'{"log_type":"app","source_id":"s","seqno":1,"data":"x\\n"}\n',
            headers={"content-type": "application/x-ndjson"},
        )
        assert response.status_code == 200, response.text
    finally:
        assert first.stop() == 0
    assert _recorded(data_dir) == {"format": str(FORMAT_VERSION), "kind": "embedded", "dc": "dc1"}
    done = _serve(data_dir, "--dc", "dc2")
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (
        f"logbroker serve: data_dir {data_dir} holds the embedded store of DC dc1, not of "
        "--dc dc2: give --dc dc1, or another data dir for dc2 (one store answering as two "
        "DCs would fool the mirror's checks)"
    )
    with open_store(data_dir, create=False) as store:
        assert "dc1.app" in {t.name for t in store.list_topics()}
        assert not {t.name for t in store.list_topics()} & {"dc2.app"}


def test_an_embedded_store_is_refused_by_a_kafka_gateway_naming_its_topics(
    tmp_path: Path,
) -> None:
    with open_store(tmp_path) as store:
        store.create_topic("dc1.app")
        store.create_topic("dc1.web")
    before = _listing(tmp_path)
    done = _serve(tmp_path, *_NO_KAFKA)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (
        f"logbroker serve: data_dir {tmp_path} holds an embedded store with 2 topic(s) "
        "(dc1.app, dc1.web): a gateway with --store kafka does not use it, and its topics "
        "stay there; move them to Kafka with `logbroker mirror` (docs/operations.md, "
        '"Moving from the embedded store to Kafka") and give the Kafka gateway another data dir'
    )
    assert _listing(tmp_path) == before


def test_a_kafka_gateways_scratch_dir_is_refused_by_the_embedded_store(tmp_path: Path) -> None:
    marked = tmp_path / "marked"
    record_kafka_scratch(marked, "dc1", "prod.")
    (marked / "legacy-staging").mkdir()
    done = _serve(marked)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (
        f"logbroker serve: data_dir {marked} is the scratch dir of a Kafka gateway (DC dc1): "
        "its topics are in Kafka; start it with --store kafka --kafka-bootstrap HOST:PORT, or "
        "give the embedded store another data dir"
    )
    assert not (marked / "catalog.db").exists()
    older = tmp_path / "older"  # what a Kafka gateway of an older release left: no marker
    (older / "legacy-staging").mkdir(parents=True)
    done = _serve(older)
    assert done.returncode == 2, done.stderr
    assert "holds legacy-staging/ and no logbroker store" in done.stderr
    assert _listing(older) == ["legacy-staging"]


def test_a_kafka_scratch_dir_of_another_dc_is_refused(tmp_path: Path) -> None:
    record_kafka_scratch(tmp_path, "dc1", "")
    done = _serve(tmp_path, *_NO_KAFKA, "--dc", "dc2")
    assert done.returncode == 2, done.stderr
    assert "holds the Kafka gateway scratch dir of DC dc1, not of --dc dc2" in done.stderr


def test_a_push_client_state_dir_is_refused_and_left_as_it_is(tmp_path: Path) -> None:
    for name in ("state.json", "status.json", "lock"):
        (tmp_path / name).write_text("{}\n")
    done = _serve(tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (
        f"logbroker serve: data_dir {tmp_path} holds no logbroker store but state.json, "
        "status.json: it is a push-client's state directory (--state-dir); give the gateway "
        "a directory of its own"
    )
    assert _listing(tmp_path) == ["lock", "state.json", "status.json"]


def test_a_store_of_a_newer_format_is_refused_by_serve_and_the_tools(tmp_path: Path) -> None:
    with open_store(tmp_path) as store:
        store.create_topic("dc1.app")
    with sqlite3.connect(tmp_path / "catalog.db") as catalog:
        catalog.execute("UPDATE data_dir SET value = '99' WHERE key = 'format'")
    catalog.close()
    line = (
        f"data_dir {tmp_path} holds a store of format 99, written by a newer logbroker "
        f"release; this one reads formats up to {FORMAT_VERSION}: run the newer release on "
        "it (going back to an older release after a format change is not supported)"
    )
    done = _serve(tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == f"logbroker serve: {line}"
    topics = subprocess.run(
        logbroker_cmd("topics", "--data-dir", str(tmp_path), "list"),
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert topics.returncode == 2, topics.stderr
    assert line in topics.stderr
    assert _recorded(tmp_path)["format"] == "99"


@pytest.mark.parametrize("extra", [[], ["lost+found"]], ids=["older-store", "mount-point"])
def test_a_store_of_an_older_release_is_adopted_and_recorded(
    tmp_path: Path, extra: list[str]
) -> None:
    data_dir = tmp_path / "data"
    with open_store(data_dir) as store:
        store.create_topic("dc1.app")
        store.append("dc1.app", 0, [b"kept"])
    with sqlite3.connect(data_dir / "catalog.db") as catalog:
        catalog.execute("DROP TABLE data_dir")  # an older release recorded nothing
        catalog.execute("DROP TABLE deletions")
    catalog.close()
    for name in extra:
        (data_dir / name).mkdir()
    gateway = GatewayProcess(data_dir, ["--dc", "dc7"], tmp_path / "gw.log").start()
    try:
        topics = httpx.get(gateway.url + "/v1/topics").json()["topics"]
        assert "dc1.app" in {t["name"] for t in topics}
    finally:
        assert gateway.stop() == 0
    assert _recorded(data_dir) == {"format": str(FORMAT_VERSION), "kind": "embedded", "dc": "dc7"}
