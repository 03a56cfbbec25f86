"""A test hook: SIGKILL this process at a chosen point of an append or a topic's deletion.

``LOGBROKER_STORE_CRASH_AT=<point>`` makes the first append (or deletion) that reaches
``<point>`` kill its own process with SIGKILL, exactly as a crash would stop it there.  The
contract suite uses it to prove that an append interrupted between its steps leaves no trace,
and that a deletion cut short is finished by the next open; it has no other use.
"""

from __future__ import annotations

import os
import signal

CRASH_AT_ENV = "LOGBROKER_STORE_CRASH_AT"

CRASH_POINTS = {
    "torn-segment-write": "half of the batch is written to its segment file, not synced",
    "after-segment-write": "the batch is fsynced in its segment file and not yet indexed",
    "after-segment-roll": "a new segment file holds the batch; the roll is not indexed",
    "topic-deletion-marked": "a deletion marked one partition deleted, not the others, and "
    "the topic is still in the catalog",
}

_ARMED = os.environ.get(CRASH_AT_ENV) or None
if _ARMED is not None and _ARMED not in CRASH_POINTS:
    raise SystemExit(f"{CRASH_AT_ENV}={_ARMED!r}: use one of {', '.join(CRASH_POINTS)}")


def armed(point: str) -> bool:
    """True if ``point`` is the armed crash point (the code may prepare the crash)."""
    return point == _ARMED


def reach(point: str) -> None:
    """Die here by SIGKILL if ``point`` is the armed crash point."""
    if point == _ARMED:
        os.kill(os.getpid(), signal.SIGKILL)
