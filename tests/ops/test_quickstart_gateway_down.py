"""scripts/quickstart.sh whose gateway never answers says so and exits non-zero, instead of
announcing "gateway on http://..." and starting the rest against nothing.

The script runs in a copy of the repository whose ``bootstrap.sh`` puts stand-ins for
``logbroker`` (a gateway that cannot have its port) and ``python`` (a look at ``/healthz``
that gets no answer) first on the PATH.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

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
[[ ${1-} == -c ]] && exit 1
echo "python $*" >> "$STARTED"
sleep 30
"""


def test_quickstart_whose_gateway_exits_says_so_and_exits_1(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "quickstart.sh", repo / "scripts" / "quickstart.sh")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("logbroker", LOGBROKER), ("python", PYTHON)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    (repo / "scripts" / "bootstrap.sh").write_text(f'export PATH="{bin_dir}:$PATH"\n')
    started = tmp_path / "started"
    demo = tmp_path / "demo"
    done = subprocess.run(
        ["bash", "scripts/quickstart.sh"],
        cwd=repo,
        env={**os.environ, "STARTED": str(started), "DEMO_DIR": str(demo), "PORT": "18999"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stderr
    assert "gateway on" not in done.stderr
    assert "quickstart: the gateway exited before it answered on port 18999" in done.stderr
    assert "cannot listen on 127.0.0.1:18999: it is in use" in done.stderr  # its log's end
    assert started.read_text().splitlines() == [
        f"serve --data-dir {demo}/store --port 18999 --dc dc1"
    ]
