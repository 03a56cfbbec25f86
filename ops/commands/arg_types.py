"""Argument types the commands share, so a value is refused the same way everywhere.

argparse turns an ``ArgumentTypeError`` into ``<command>: error: argument --flag: <reason>``
and exit status 2, before the command runs.
"""

from __future__ import annotations

import argparse
import math


def seconds(text: str) -> float:
    """A duration in seconds: a finite number, 0 or more (``nan``, ``inf`` and negative
    numbers are refused: a wait that never ends, or ends at once, is never what was meant)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 <= value < math.inf:
        raise argparse.ArgumentTypeError(
            f"must be a finite number of seconds, 0 or more, not {text}"
        )
    return value


LOG_LEVELS = ("debug", "info", "warning", "error")


def add_log_level(parser: argparse.ArgumentParser, default: str) -> None:
    """``--log-level``, the same four levels in any case for every command; the value is
    lower case (``logging`` wants it upper: ``args.log_level.upper()``)."""
    parser.add_argument(
        "--log-level",
        default=default,
        type=str.lower,
        choices=LOG_LEVELS,
        help=f"{', '.join(LOG_LEVELS)}, in any case ({default})",
    )
