"""The stop watchdog of ``logbroker read`` names what held the stop: the gateway (a request
that does not come back) or the output (a write into a pipe that nobody reads)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO

# A command as `logbroker read` runs it, with a short grace: the main thread either writes
# under the output lock into a pipe nobody reads, or waits on a peer that never answers.
_COMMAND = """
import sys, threading, time
from ops import stop_grace, stop_signals
stop_signals.install()
writing = threading.Lock()
out = sys.stdout.buffer
stop_grace.exit_after_grace(0.3, writing, out, "logbroker read")
print("ready", file=sys.stderr, flush=True)
if sys.argv[1] == "output":
    with writing:
        while True:
            out.write(b"x" * 65536)
            out.flush()
else:
    time.sleep(60)
"""


@pytest.mark.parametrize(
    ("held_by", "status", "said", "not_said"),
    [
        ("output", 1, "the output was stuck (nothing took what was written) for 0.6 s", "gateway"),
        ("gateway", 0, "the gateway did not let go within 0.3 s of the stop", "output"),
    ],
)
def test_a_stop_held_up_past_the_grace_names_what_held_it(
    tmp_path: Path, held_by: str, status: int, said: str, not_said: str
) -> None:
    err = tmp_path / "stderr"
    with open(err, "wb") as err_file:
        # stdout is a pipe this test never reads: it fills at once
        proc = subprocess.Popen(
            [sys.executable, "-c", _COMMAND, held_by],
            stdout=subprocess.PIPE,
            stderr=err_file,
            cwd=REPO,
        )
        try:
            deadline = time.monotonic() + 30
            while b"ready" not in err.read_bytes():
                assert time.monotonic() < deadline and proc.poll() is None, err.read_text()
                time.sleep(0.05)
            time.sleep(0.2)  # the pipe is full by now
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(10) == status, err.read_text()
        finally:
            proc.kill()
            proc.wait(10)
            assert proc.stdout is not None
            proc.stdout.close()
    message = err.read_text().splitlines()[-1]
    assert said in message and not_said not in message, message
    assert "; exiting without committing or leaving the group" in message, message
    assert ("its last line may be cut" in message) == (held_by == "output"), message
