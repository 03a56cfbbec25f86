"""A peer that refuses this gateway's peer token: a configuration mistake, said as one."""

from __future__ import annotations

import logging

import pytest

from ingest_api.peer_link import HttpPeerLink
from log_store.kafka.remote_transaction import PeerUnreachable
from tests.scripted_http import serving


def test_a_refused_peer_token_names_peer_token_and_is_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before: "... answered 401: ...: internal calls need the peer token", logged only as a
    retry of the push supervisor, with nothing naming the setting to look at."""
    link = HttpPeerLink("not-the-peers-token", timeout_s=5.0)
    try:
        with (
            serving(lambda _path: (401, 0.0)) as peer,
            caplog.at_level(logging.ERROR, logger="ingest_api.peers"),
        ):
            for _ in range(3):
                with pytest.raises(PeerUnreachable) as refused:
                    link.read_state(peer.url, "dc1.app", 0, ["k"])
                assert "refused this gateway's peer token (401)" in str(refused.value)
                assert "the same peer_token" in str(refused.value)
    finally:
        link.close()
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1, [r.getMessage() for r in errors]
    assert peer.url in errors[0].getMessage()
