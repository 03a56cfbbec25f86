"""scripts/quickstart.sh whose gateway never answers says so and exits non-zero, instead of
announcing "gateway on http://..." and starting the rest against nothing; and one whose port
is taken by another gateway starts nothing, instead of shipping its demo into that one.

The script runs in a copy of the repository whose ``bootstrap.sh`` puts stand-ins for
``logbroker`` (a gateway that cannot have its port) and ``python`` (a look at ``/healthz``
that gets no answer, or the answer of another gateway) first on the PATH.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import free_port

REPO = Path(__file__).resolve().parents[2]
LOGBROKER = """#!/usr/bin/env bash
echo "$*" >> "$STARTED"
if [[ ${1-} == serve ]]; then
  echo "logbroker serve: cannot listen on 127.0.0.1:$PORT: it is in use" >&2
  exit 2
fi
sleep 30
"""
PYTHON = """#!/usr/bin/env bash
if [[ ${1-} == -c ]]; then
  [[ $2 == *socket* ]] && exec %(python)s "$@"  # the look at the port is real
  exit %(healthz)s
fi
echo "python $*" >> "$STARTED"
sleep 30
"""


def _run(tmp_path: Path, port: int, healthz_answers: bool) -> subprocess.CompletedProcess[str]:
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "quickstart.sh", repo / "scripts" / "quickstart.sh")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    python = PYTHON % {"python": sys.executable, "healthz": 0 if healthz_answers else 1}
    for name, text in (("logbroker", LOGBROKER), ("python", python)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    (repo / "scripts" / "bootstrap.sh").write_text(f'export PATH="{bin_dir}:$PATH"\n')
    return subprocess.run(
        ["bash", "scripts/quickstart.sh"],
        cwd=repo,
        env={
            **os.environ,
            "STARTED": str(tmp_path / "started"),
            "DEMO_DIR": str(tmp_path / "demo"),
            "PORT": str(port),
        },
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    "healthz_answers", [False, True], ids=["nothing-answers", "another-gateway-answers"]
)
def test_quickstart_whose_gateway_exits_says_so_and_exits_1(
    tmp_path: Path, healthz_answers: bool
) -> None:
    """``another-gateway-answers``: before, ``/healthz`` answered by whatever held the port
    was taken for the demo's gateway, which had exited, and the demo shipped into it."""
    done = _run(tmp_path, 18999, healthz_answers)
    started, demo = tmp_path / "started", tmp_path / "demo"
    assert done.returncode == 1, done.stderr
    assert "gateway on" not in done.stderr
    assert "quickstart: the gateway exited before it answered on port 18999" in done.stderr
    assert "cannot listen on 127.0.0.1:18999: it is in use" in done.stderr  # its log's end
    assert started.read_text().splitlines() == [
        f"serve --data-dir {demo}/store --port 18999 --dc dc1"
    ]


def test_quickstart_on_a_port_in_use_starts_nothing(tmp_path: Path) -> None:
    port = free_port()
    with socket.create_server(("127.0.0.1", port)):
        done = _run(tmp_path, port, healthz_answers=True)
    assert done.returncode == 1, done.stderr
    assert f"quickstart: port {port} is in use" in done.stderr
    assert "gateway on" not in done.stderr
    assert not (tmp_path / "started").exists()
