"""The local Kafka's listeners survive ``restart`` on the same ports: they lie outside the
kernel's ephemeral port range, which every outgoing connection draws its local port from.
On ports of that range a restart failed ("Address already in use" for the controller
listener) when, while the node was down, a connection of some other process took its port."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from ops.local_kafka import (
    KAFKA_VERSION,
    KafkaUnavailable,
    LocalKafka,
    _port_left_unbound,
    restart_by_state,
)
from ops.local_kafka import main as local_kafka_main


def _ephemeral_range() -> range:
    low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    return range(int(low), int(high) + 1)


def test_every_listener_of_a_local_cluster_is_outside_the_ephemeral_port_range(
    tmp_path: Path,
) -> None:
    cluster = LocalKafka(tmp_path, nodes_count=3)
    cluster._plan()
    ports = [
        port
        for node in cluster.nodes
        for port in (
            node.port,
            node.controller_port,
            node.proxied_port,
            node.proxied_advertised_port,
        )
    ]
    ephemeral = _ephemeral_range()
    assert [p for p in ports if p in ephemeral] == [], ephemeral
    assert len(set(ports)) == len(ports)


def _cluster_that_cannot_start(tmp_path: Path) -> dict[str, Any]:
    """The state ``start`` leaves, of a one-node cluster whose node cannot start (its storage
    is gone)."""
    state = {
        "bootstrap": "127.0.0.1:1",
        "proxied_bootstrap": "127.0.0.1:2",
        "pgids": [],
        "version": KAFKA_VERSION,
        "nodes": [
            {
                "node_id": 1,
                "directory": str(tmp_path / "node1"),
                "port": _port_left_unbound(),
                "controller_port": _port_left_unbound(),
                "proxied_port": _port_left_unbound(),
                "proxied_advertised_port": _port_left_unbound(),
            }
        ],
    }
    (tmp_path / "node1").mkdir()
    (tmp_path / "cluster.json").write_text(json.dumps(state))
    return state


@pytest.mark.kafka
def test_a_restart_that_fails_can_be_asked_again(tmp_path: Path) -> None:
    """``restart`` says why, and the cluster's state is kept for the next ``restart`` instead
    of being forgotten."""
    state = _cluster_that_cannot_start(tmp_path)
    with pytest.raises(KafkaUnavailable, match="node 1 exited"):
        restart_by_state(tmp_path, timeout_s=60)
    assert json.loads((tmp_path / "cluster.json").read_text())["nodes"] == state["nodes"]


@pytest.mark.kafka
def test_restart_keeps_the_cluster_away_as_long_as_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``restart --down-for S``: an outage of S seconds to watch the gateways through."""
    _cluster_that_cannot_start(tmp_path)
    started = time.monotonic()
    assert local_kafka_main(["restart", "--dir", str(tmp_path), "--down-for", "1.5"]) == 1
    assert time.monotonic() - started >= 1.5
    assert "node 1 exited" in capsys.readouterr().err
    for wrong in (["restart", "--down-for", "-1"], ["stop", "--down-for", "5"]):
        with pytest.raises(SystemExit) as refused:
            local_kafka_main([*wrong, "--dir", str(tmp_path)])
        assert refused.value.code == 2


@pytest.mark.kafka
def test_a_stopped_cluster_is_started_again_by_restart_on_its_ports(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``stop`` keeps the cluster's ports and storage recorded, so that ``restart`` brings it
    back where running gateways look for it; it used to forget them, and ``restart`` after a
    ``stop`` said "no cluster runs" (the only way back, ``start``, is an empty cluster on
    other ports)."""
    state = _cluster_that_cannot_start(tmp_path)
    node = subprocess.Popen(["sleep", "60"], start_new_session=True)  # the node's JVM
    (tmp_path / "cluster.json").write_text(json.dumps({**state, "pgids": [node.pid]}))
    try:
        assert local_kafka_main(["stop", "--dir", str(tmp_path)]) == 0
        assert node.wait(30) is not None
    finally:
        node.kill()
    kept = json.loads((tmp_path / "cluster.json").read_text())
    assert kept["nodes"] == state["nodes"] and kept["pgids"] == []
    assert local_kafka_main(["stop", "--dir", str(tmp_path)]) == 1
    assert f"no cluster runs in {tmp_path}" in capsys.readouterr().err
    # restart starts the node on its recorded storage (gone here, so the node exits)
    assert local_kafka_main(["restart", "--dir", str(tmp_path)]) == 1
    assert "node 1 exited" in capsys.readouterr().err


def test_start_over_a_stopped_cluster_says_that_it_begins_afresh_elsewhere(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``start`` after ``stop`` wipes the cluster and picks other ports: said, with the
    command that would have kept them, since gateways left running never find the new one."""
    _cluster_that_cannot_start(tmp_path)

    def started(self: LocalKafka, timeout_s: float = 180.0) -> LocalKafka:
        raise KafkaUnavailable("not started in this test")

    monkeypatch.setattr(LocalKafka, "start", started)
    assert local_kafka_main(["start", "--dir", str(tmp_path)]) == 1
    said = capsys.readouterr().err
    assert f"the cluster stopped in {tmp_path} is wiped" in said, said
    assert f"restart --dir {tmp_path}" in said, said
