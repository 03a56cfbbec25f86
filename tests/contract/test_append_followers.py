"""The embedded store's followers of appends (``follow_appends``) follow a topic by name:
deleted and made again by another process, it is the new topic's appends that call them."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from log_store import TopicConfig, open_store

REPO = Path(__file__).resolve().parents[2]

_REMAKE = """
import sys, time
from log_store import TopicConfig, open_store
store = open_store(sys.argv[1])
store.delete_topic("dc1.t")
store.create_topic("dc1.t", TopicConfig(partitions=1))
print("remade", flush=True)
sys.stdin.readline()
store.append("dc1.t", 0, [b"after"])
print(time.time(), flush=True)
sys.stdin.readline()
"""


def test_a_topic_made_again_by_another_process_calls_its_followers_on_its_appends(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    store = open_store(data)
    try:
        store.create_topic("dc1.t", TopicConfig(partitions=1))
        store.append("dc1.t", 0, [b"before"])
        calls: list[float] = []
        unfollow = store.follow_appends("dc1.t", 0, lambda: calls.append(time.time()))
        child = subprocess.Popen(
            [sys.executable, "-c", _REMAKE, str(data)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        try:
            assert child.stdin is not None and child.stdout is not None
            assert child.stdout.readline().strip() == "remade"
            time.sleep(1.0)  # the deletion's calls are over
            called = len(calls)
            child.stdin.write("\n")
            child.stdin.flush()
            acked = float(child.stdout.readline())
            deadline = time.monotonic() + 5
            while len(calls) == called and time.monotonic() < deadline:
                time.sleep(0.01)
            assert len(calls) > called, "the new topic's append called no follower"
            # by the append (inotify on the new topic's file), not by a look now and then
            assert calls[called] - acked < 0.5
        finally:
            child.kill()
            child.wait()
        unfollow()
    finally:
        store.close()
