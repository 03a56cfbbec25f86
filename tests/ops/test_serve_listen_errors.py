"""``logbroker serve`` on an address it cannot have: exit 2 with the host:port and why, since
the user must fix it (as a push-client's taken metrics_port), and no banner."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO, free_port, logbroker_cmd


def _has_ipv6() -> bool:
    try:
        socket.socket(socket.AF_INET6).close()
    except OSError:
        return False
    return True


def _serve(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        logbroker_cmd(
            "serve", "--data-dir", str(tmp_path / "data"), "--allow-public-without-tokens", *args
        ),
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("host", "shown", "reason"),
    [
        ("192.0.2.1", "192.0.2.1", "'192.0.2.1' is not an address of this machine"),
        pytest.param(
            "2001:db8::1",
            "[2001:db8::1]",
            "'2001:db8::1' is not an address of this machine",
            marks=pytest.mark.skipif(not _has_ipv6(), reason="no IPv6 here"),
        ),
        ("no-such-host.invalid", "no-such-host.invalid", "'no-such-host.invalid' does not resolve"),
    ],
)
def test_serve_on_a_host_it_cannot_have_exits_2_naming_it(
    tmp_path: Path, host: str, shown: str, reason: str
) -> None:
    port = free_port()
    done = _serve(tmp_path, "--host", host, "--port", str(port))
    assert done.returncode == 2, done.stderr
    assert f"logbroker serve: cannot listen on {shown}:{port}: {reason}" in done.stderr
    assert "gateway on" not in done.stderr
