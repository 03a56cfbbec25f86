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
    "arenas": os.environ.get("MALLOC_ARENA_MAX"),
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
        "arenas": str(heap.ARENAS),
    }


def test_an_operators_own_setting_wins() -> None:
    from ops import heap

    assert _probe(MALLOC_TRIM_THRESHOLD_="1048576") == {
        "took": False,
        "trim": "1048576",
        "mmap": None,
        "arenas": str(heap.ARENAS),
    }


def test_an_operators_own_arena_count_wins() -> None:
    assert _probe(MALLOC_ARENA_MAX="8")["arenas"] == "8"


_FREED_PROBE = """
import json, threading, time
from ops import heap
heap.keep_freed_memory()
if {trim}:
    heap.trim_now_and_then(0.2)

def rss_mb():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) // 1024

all_hold = threading.Barrier(4)
measured = threading.Event()
kept = []

def churn():
    # what a read answer does in a request thread: 16 MiB in 64 KiB values, then freed
    # (held together, so that each thread has an arena of its own), among what stays
    values = []
    for _ in range(256):
        values.append(b"v" * 64 * 1024)
        kept.append(b"k" * 1024)  # something that lives on between them
    all_hold.wait()
    del values
    measured.wait()  # a gateway's request threads live on

before = rss_mb()
threads = [threading.Thread(target=churn) for _ in range(4)]
for thread in threads:
    thread.start()
time.sleep(1.5)
print(json.dumps({{"before": before, "after": rss_mb()}}))
measured.set()
"""


def _freed(trim: bool) -> dict[str, int]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    done = subprocess.run(
        [sys.executable, "-c", _FREED_PROBE.format(trim=trim)],
        cwd=REPO,
        env={**clean, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(done.stdout)


def test_memory_freed_in_request_threads_is_handed_back() -> None:
    """Before: each thread's malloc arena kept up to 64 MiB free for good (a gateway grew
    from 80 to 600 MB through one catching-up reader and stayed there)."""
    kept = _freed(trim=False)
    held = kept["after"] - kept["before"]
    assert held > 48  # of the 64 MiB freed: what the trimming is for
    handed_back = _freed(trim=True)
    assert handed_back["after"] - handed_back["before"] < held - 32
