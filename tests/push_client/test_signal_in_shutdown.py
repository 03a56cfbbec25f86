"""A second SIGTERM (or Ctrl-C) that comes while the client is stopping is harmless: the
stop's ``Event.set`` holds the event's lock for a moment, and the handler ran in the main
thread within that moment, waiting for the same lock forever (the client hung until
SIGKILL)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

_SECOND_SIGTERM_IN_SHUTDOWN = """
import os, signal, sys, threading
from pathlib import Path
from push_client.config import PushConfig
from push_client.daemon import PushDaemon

daemon = PushDaemon(
    PushConfig(servers=("http://127.0.0.1:9",), state_dir=Path(sys.argv[1]), entries=())
)
shutdown = daemon._shutdown


def shutdown_while_a_second_sigterm_comes():
    with daemon._stop._cond:  # as the stop's own Event.set holds it
        signal.raise_signal(signal.SIGTERM)
    shutdown()


daemon._shutdown = shutdown_while_a_second_sigterm_comes
threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM)).start()
print("stopped with", daemon.run(), flush=True)
"""


def test_a_second_sigterm_while_the_client_stops_does_not_hang_it(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _SECOND_SIGTERM_IN_SHUTDOWN, str(tmp_path / "state")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert (done.returncode, done.stdout.strip()) == (0, "stopped with 0"), done.stderr
