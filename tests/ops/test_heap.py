"""The gateway's malloc settings (``ops.heap``): taken by glibc, handed to worker processes,
and an operator's own settings left alone.  Each case runs in a fresh interpreter, since
``mallopt`` changes the process for good."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_PROBE = """
import json, os
from ops import heap
took = heap.keep_freed_memory()
print(json.dumps({
    "took": took,
    "trim": os.environ.get("MALLOC_TRIM_THRESHOLD_"),
    "mmap": os.environ.get("MALLOC_MMAP_THRESHOLD_"),
}))
"""


def _probe(**env: str) -> dict[str, object]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    done = subprocess.run(
        [sys.executable, "-c", _PROBE],
        cwd=REPO,
        env={**clean, "PYTHONPATH": str(REPO), **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(done.stdout)


def test_glibc_takes_the_settings_and_workers_inherit_them() -> None:
    from ops import heap

    assert _probe() == {
        "took": True,
        "trim": str(heap.KEEP_FREE_BYTES),
        "mmap": str(heap.OWN_MAPPING_BYTES),
    }


def test_an_operators_own_setting_wins() -> None:
    assert _probe(MALLOC_TRIM_THRESHOLD_="1048576") == {
        "took": False,
        "trim": "1048576",
        "mmap": None,
    }
