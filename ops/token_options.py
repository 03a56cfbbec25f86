"""``--token`` and ``--token-file`` for the commands that read from or mirror through a gateway
(``read``, ``mirror``, ``topics``, ``load``; ``push`` has its own, re-read when it changes).

A token on the command line is visible to every user of the machine (``ps``); prefer a file
readable only by its owner (``--token-file``, or ``LOGBROKER_TOKEN_FILE``).  Precedence:
``--token-file``, ``--token``, ``LOGBROKER_TOKEN_FILE``, ``LOGBROKER_TOKEN``.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from log_store.errors import BadRequest


class TokenFileError(BadRequest):
    """A token file that cannot be used (unreadable, readable by others, not one token)."""


def read_token_file(path: Path) -> str:
    """The bearer token kept in ``path``: one line, readable by its owner only.

    A token on the command line is visible to every user (``ps``); a file that others may
    read is refused for the same reason.
    """
    try:
        mode = path.stat().st_mode
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise TokenFileError(f"cannot read token file {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise TokenFileError(f"token file {path} is not UTF-8 text") from None
    if mode & 0o077:
        raise TokenFileError(
            f"token file {path} may be read by other users (mode {mode & 0o777:o}); "
            f"run: chmod 600 {path}"
        )
    token = text.strip()
    if not token or any(c.isspace() for c in token):
        raise TokenFileError(f"token file {path} must hold one token on one line")
    return token


def add_token_options(parser: argparse.ArgumentParser, **defaults: Any) -> None:
    """Add the two options (mutually exclusive); ``defaults`` as for ``add_argument``."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--token",
        help="bearer token (visible to other users in ps: prefer --token-file)",
        **defaults,
    )
    group.add_argument(
        "--token-file",
        type=Path,
        help="file holding the bearer token, readable by its owner only (chmod 600)",
        **defaults,
    )


def token_from(args: argparse.Namespace) -> str | None:
    """The bearer token the command line or the environment gives; ``ConfigError`` (exit 2)
    for a token file that cannot be used."""
    token_file = getattr(args, "token_file", None)
    if token_file is not None:
        return read_token_file(Path(token_file))
    token: str | None = getattr(args, "token", None)
    if token:
        return token
    if os.environ.get("LOGBROKER_TOKEN_FILE"):
        return read_token_file(Path(os.environ["LOGBROKER_TOKEN_FILE"]))
    return os.environ.get("LOGBROKER_TOKEN") or None
