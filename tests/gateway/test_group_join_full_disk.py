"""A consumer-group join on a full data directory: refused (group state is written into the
store), with the reason said as no space, while a plain read of the same topic works."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx
import pytest


@pytest.mark.fault
def test_a_group_join_on_a_full_disk_says_no_space_and_plain_reads_go_on(
    start_gateway: Any, small_filesystem: Path, client_for: Any
) -> None:
    gateway = start_gateway(small_filesystem / "data")
    assert client_for(gateway.url).write("src", [1, 2]).status_code == 200
    with httpx.Client(base_url=gateway.url, timeout=30) as http:  # the group's state is made
        first = http.post("/v1/groups/fullg/members", json={"topics": ["dc1.app"]})
        assert first.status_code == 200, first.text
    fs = os.statvfs(small_filesystem)
    (small_filesystem / "filler").write_bytes(b"\0" * (fs.f_bavail * fs.f_frsize))
    with httpx.Client(base_url=gateway.url, timeout=30) as http:
        joined = http.post(
            "/v1/groups/fullg/members", json={"topics": ["dc1.app"], "reset": "earliest"}
        )
        assert joined.status_code == 503, joined.text
        assert "no space left on the data directory's file system" in joined.json()["reason"]
        info = http.get("/v1/topics/dc1.app").json()
        read = [
            m["seqno"]
            for p in info["partitions"]
            for m in http.get(
                f"/v1/topics/dc1.app/partitions/{p['partition']}/messages", params={"offset": 0}
            ).json()["messages"]
        ]
        assert read == [1, 2]
