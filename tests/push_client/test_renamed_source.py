"""A renamed file is the same source: a client that lost its state finds it again under its
new name and resumes it where the log ends (issue 16), and ids of earlier versions are kept."""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
from pathlib import Path

import httpx
import orjson
import pytest

from ingest_api.framing import BINARY_MEDIA_TYPE, encode_binary
from push_client.identity import read_fingerprint
from tests.push_client.conftest import (
    LineWriter,
    assert_exactly_once,
    read_delivered,
    wait_for_lines,
)

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("gateway_killed", [False, True], ids=["gateway-up", "gateway-killed"])
def test_rotated_file_found_again_after_the_state_dir_is_lost_is_not_shipped_twice(
    tmp_path: Path, start_gateway, start_push, gateway_killed: bool
) -> None:
    gateway = start_gateway(tmp_path / "data")
    logs = tmp_path / "logs"
    logs.mkdir()
    state = tmp_path / "state"
    glob = logs / "*.log*"  # matches the rotated names too, as in the report
    writers = {name: LineWriter(name) for name in ("f1", "f2")}
    handles = {name: open(logs / f"{name}.log", "ab") for name in writers}  # noqa: SIM115
    try:

        def write(count: int) -> None:
            for name, handle in handles.items():
                handle.write(writers[name].lines(count))
                handle.flush()

        write(300)
        push = start_push(gateway.url, state, glob).wait_started(state)
        wait_for_lines(gateway.data_dir, "app", 600)
        # rename rotation: the writers keep their descriptors for a while, then reopen
        os.rename(logs / "f1.log", logs / "f1.log.1")
        os.rename(logs / "f2.log", logs / "f2.log.2")
        write(200)
        for name in handles:
            handles[name].close()
            handles[name] = open(logs / f"{name}.log", "ab")  # noqa: SIM115
        write(100)
        wait_for_lines(gateway.data_dir, "app", 1_200)
        push.kill()
        shutil.rmtree(state)  # the state dir is lost
        if gateway_killed:
            gateway.kill()
            write(50)
            gateway = start_gateway(tmp_path / "data")
        write(50)
        restarted = start_push(gateway.url, state, glob).wait_started(state)
        write(50)
        total = sum(len(w.ids) for w in writers.values())
        wait_for_lines(gateway.data_dir, "app", total)
        assert restarted.stop() == 0, restarted.log()
    finally:
        for handle in handles.values():
            handle.close()
    delivered = read_delivered(gateway.data_dir, "app")
    assert_exactly_once(delivered, *writers.values())
    # two files, each rotated once: four sources, whatever name they were found under
    assert len(delivered.lines) == 4
    assert all(":/" not in source_id for source_id in delivered.lines)


def test_state_of_the_previous_version_keeps_its_source_ids_and_ships_nothing_twice(
    tmp_path: Path, gateway, start_push
) -> None:
    path = tmp_path / "app.log"
    writer = LineWriter("up")
    writer.append(path, 200)
    shipped = path.read_bytes()
    st = path.stat()
    fd = os.open(path, os.O_RDONLY)
    try:
        fingerprint = read_fingerprint(fd)
    finally:
        os.close(fd)
    host = socket.gethostname()
    # what the previous version shipped, under the id it made (path inside)
    legacy_id = f"{host}:{path}:{st.st_dev}:{st.st_ino}:{fingerprint}"
    meta = {"log_type": "app", "source_id": legacy_id, "server": host, "file": str(path)}
    body = encode_binary([(meta, [(len(shipped), 0, shipped)])])
    answer = httpx.post(
        gateway.url + "/v1/write", content=body, headers={"content-type": BINARY_MEDIA_TYPE}
    )
    assert answer.json()["results"][0]["acks"][0]["status"] == "written"
    # ... and the state file it wrote (version 1)
    position = {
        "source_id": legacy_id,
        "entry_path": str(path),
        "first_path": str(path),
        "path": str(path),
        "dev": st.st_dev,
        "ino": st.st_ino,
        "fingerprint": fingerprint,
        "generation": 0,
        "log_type": "app",
        "codec": "raw",
        "acked": len(shipped),
        "size": len(shipped),
        "pending_since": None,
    }
    payload = orjson.dumps({"version": 1, "sources": [position], "retired": []})
    state = tmp_path / "state"
    state.mkdir()
    digest = hashlib.sha256(payload).hexdigest().encode()
    (state / "state.json").write_bytes(payload + b"\nsha256:" + digest + b"\n")
    writer.append(path, 300)
    push = start_push(gateway.url, state, path).wait_started(state)
    delivered = wait_for_lines(gateway.data_dir, "app", 500)
    assert push.stop() == 0
    assert_exactly_once(delivered, writer)
    assert list(delivered.lines) == [legacy_id]
