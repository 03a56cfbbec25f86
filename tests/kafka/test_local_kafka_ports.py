"""The local Kafka's listeners survive ``restart`` on the same ports: they lie outside the
kernel's ephemeral port range, which every outgoing connection draws its local port from.
On ports of that range a restart failed ("Address already in use" for the controller
listener) when, while the node was down, a connection of some other process took its port."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ops.local_kafka import (
    KAFKA_VERSION,
    KafkaUnavailable,
    LocalKafka,
    _port_left_unbound,
    restart_by_state,
)


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


@pytest.mark.kafka
def test_a_restart_that_fails_can_be_asked_again(tmp_path: Path) -> None:
    """The node cannot start (its storage is gone): ``restart`` says why, and the cluster's
    state is kept for the next ``restart`` instead of being forgotten."""
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
    with pytest.raises(KafkaUnavailable, match="node 1 exited"):
        restart_by_state(tmp_path, timeout_s=60)
    assert json.loads((tmp_path / "cluster.json").read_text())["nodes"] == state["nodes"]
