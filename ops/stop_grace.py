"""A bounded stop for a command whose clean stop waits on a peer that may not answer.

``logbroker read`` stops after the batch in hand: it commits its group's offsets and leaves
the group, each a request to the gateway, and a request already in flight waits up to its
timeout.  :func:`exit_after_grace` starts a watchdog that ends the process ``grace_s`` after a
stop signal if the command has not ended by then, never in the middle of a piece of output
written under the given lock (unless that write itself is stuck: then after another
``grace_s``, with status 1, since its last line may be cut).

The watchdog looks at :func:`ops.stop_signals.stop_requested` every 0.1 s instead of being
woken from the signal handler: a handler that took a lock (``Event.set``) could deadlock on a
second Ctrl-C arriving while the first was in it.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from typing import BinaryIO

from ops import stop_signals

_LOOK_S = 0.1


def exit_after_grace(grace_s: float, writing: threading.Lock, out: BinaryIO, what: str) -> None:
    """Start the watchdog (a daemon thread) for a command named ``what`` in its messages."""
    threading.Thread(
        target=_watch, args=(grace_s, writing, out, what), name="stop-grace", daemon=True
    ).start()


def _watch(grace_s: float, writing: threading.Lock, out: BinaryIO, what: str) -> None:
    while not stop_signals.stop_requested():
        time.sleep(_LOOK_S)
    time.sleep(grace_s)
    whole = writing.acquire(timeout=grace_s)
    if whole:
        with contextlib.suppress(Exception):
            out.flush()
        # not writing: what holds the command is a request still waiting for the gateway
        said = f"the gateway did not let go within {grace_s:g} s of the stop"
    else:
        # still in one write all this time: whatever reads the output takes nothing (a full
        # pipe); the gateway is not to blame, and a flush would wait on the stuck write's lock
        said = (
            f"the output was stuck (nothing took what was written) for {2 * grace_s:g} s "
            "after the stop"
        )
    print(
        f"{what}: {said}; exiting without committing or leaving the group"
        + ("" if whole else " (its last line may be cut)"),
        file=sys.stderr,
        flush=True,
    )
    os._exit(0 if whole else 1)
