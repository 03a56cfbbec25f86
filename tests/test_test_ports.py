"""The test harness's ports: two test sessions on one machine never share a gateway's port."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import REPO, free_port


def test_a_port_given_to_this_session_is_passed_by_another_session() -> None:
    """Two sessions hand out the same slices of ports (by worker, or by pid); a port one was
    given and its gateway has not bound yet must not go to the other, whose gateway would
    then answer the first one's test (which writes into the wrong log)."""
    port = free_port()
    other = subprocess.run(
        [
            sys.executable,
            "-c",
            f"import tests.conftest as c\nc._next_port = {port}\nprint(c.free_port())",
        ],
        cwd=REPO,
        env={**os.environ, "PYTEST_XDIST_WORKER": "gw0", "PYTEST_XDIST_WORKER_COUNT": "1"},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert int(other.stdout) != port, other.stderr
