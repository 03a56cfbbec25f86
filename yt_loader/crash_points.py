"""A test hook: stop the loader at a chosen point so that a test can SIGKILL it there.

``LOGBROKER_LOADER_CRASH_AT=<point>`` makes the loader print one line on stderr when it reaches
the point and then wait, doing nothing, until it is killed.  The crash tests use it to kill a
real loader process at exactly the moment they want to prove safe; it has no other use.
"""

from __future__ import annotations

import os
import sys
import time

from yt_loader.errors import BadSourceOptions

CRASH_AT_ENV = "LOGBROKER_LOADER_CRASH_AT"

CRASH_POINTS = {
    "while-writing": "a task has written part of a file into staging and not closed it",
    "after-files": "every file of the batch is in staging; the batch is not committed",
    "after-commit": "the commit record is durable; no file has been moved into the tables",
    "mid-publish": "the batch is committed and only some of its files are in the tables",
}

REACHED_MARKER = "logbroker load: test hook reached:"


def armed_point() -> str | None:
    """The point named by the environment, if any; an unknown name is an error."""
    point = os.environ.get(CRASH_AT_ENV) or None
    if point is not None and point not in CRASH_POINTS:
        raise BadSourceOptions(
            f"{CRASH_AT_ENV}={point!r} is not a crash point; use one of {', '.join(CRASH_POINTS)}"
        )
    return point


def reach(point: str, armed: str | None) -> None:
    """If ``point`` is the armed one, announce it and wait to be killed."""
    if armed != point:
        return
    print(f"{REACHED_MARKER} {point} ({CRASH_POINTS[point]})", file=sys.stderr, flush=True)
    while True:
        time.sleep(3600)
