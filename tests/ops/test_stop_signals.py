"""What a stop signal runs (``on_stop``) runs outside the signal handler: a handler runs in the
main thread between two of its instructions, and a callback that waits for a lock the main
thread holds at that moment (``Event.set`` while the main thread is inside ``Event.wait`` on
the same event) waited forever: a gateway waiting for Kafka at its start did not stop."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO

_STOPPED_IN_EVENT_WAIT = """
import signal, threading
from ops import stop_signals
stop_signals.install()
stopped = threading.Event()
stop_signals.on_stop(stopped.set)
# Event.wait holds the event's lock for a moment before it sleeps and after it wakes; a
# signal handled in that moment is handled with the lock held (here it is raised there)
with stopped._cond:
    signal.raise_signal(signal.SIGTERM)
print("stopped" if stopped.wait(10) else "the stop was not seen", flush=True)
"""

_STOPPED_IN_A_FORKED_CHILD = """
import os, signal, threading
from ops import stop_signals
stop_signals.install()
pid = os.fork()
if pid == 0:
    stopped = threading.Event()
    stop_signals.on_stop(stopped.set)
    os.kill(os.getpid(), signal.SIGTERM)
    os._exit(0 if stopped.wait(10) else 1)
_, status = os.waitpid(pid, 0)
print("stopped" if os.waitstatus_to_exitcode(status) == 0 else "the child's stop was not seen")
"""

_ONE_CALLBACK_FAILS = """
import signal, threading
from ops import stop_signals
stop_signals.install()
def fails():
    raise RuntimeError("a callback that fails")
stopped = threading.Event()
stop_signals.on_stop(fails)
stop_signals.on_stop(stopped.set)
signal.raise_signal(signal.SIGTERM)
print("stopped" if stopped.wait(10) else "the stop was not seen", flush=True)
"""


def _run(program: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", program], cwd=REPO, capture_output=True, text=True, timeout=30
    )


def test_a_stop_handled_while_the_main_thread_holds_the_events_lock_sets_it() -> None:
    """Before: the handler's ``stopped.set()`` waited for the lock its own thread held, and
    the process hung (this run's timeout)."""
    done = _run(_STOPPED_IN_EVENT_WAIT)
    assert (done.returncode, done.stdout.strip()) == (0, "stopped"), done.stderr


def test_a_forked_child_runs_its_stop_callbacks() -> None:
    done = _run(_STOPPED_IN_A_FORKED_CHILD)
    assert (done.returncode, done.stdout.strip()) == (0, "stopped"), done.stderr


def test_a_callback_that_fails_does_not_keep_the_next_from_running() -> None:
    done = _run(_ONE_CALLBACK_FAILS)
    assert (done.returncode, done.stdout.strip()) == (0, "stopped"), done.stderr
    assert "a callback that fails" in done.stderr
