"""What makes a file one source: device, inode and a fingerprint of its first bytes.

The fingerprint hashes the first line (or the first ``FINGERPRINT_BYTES`` bytes if that line is
longer).  Both are fixed once they exist, so the fingerprint of a growing file never changes;
before the first line is complete there is nothing to ship and no fingerprint either.
A truncated, copy-truncated or re-created file gets a different first line and so a new source;
when the new first line happens to equal the old one, a generation suffix tells them apart.

The path is not part of a source's identity: a file renamed by rotation is the same file, and a
client that lost its state and finds it again under its rotated name must ask the gateway for
the same source.  Readers see the path in the chunks' ``file`` field instead.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass

FINGERPRINT_BYTES = 256
MAX_SOURCE_ID_BYTES = 512


@dataclass(frozen=True)
class FileIdentity:
    """One file's identity; equal identities mean the same bytes at the same offsets."""

    dev: int
    ino: int
    fingerprint: str

    @property
    def key(self) -> tuple[int, int, str]:
        return (self.dev, self.ino, self.fingerprint)


def read_fingerprint(fd: int, *, final: bool = False) -> str | None:
    """The fingerprint of an open file, or None while its first line is still incomplete.

    ``final`` fingerprints whatever is there: for a file that will never grow again.
    """
    return fingerprint_of(os.pread(fd, FINGERPRINT_BYTES, 0), final=final)


def fingerprint_of(head: bytes, *, final: bool = False) -> str | None:
    """The fingerprint of a file that starts with ``head`` (its first ``FINGERPRINT_BYTES``
    bytes, or all of it if shorter): of a compressed file's decompressed start, say."""
    head = head[:FINGERPRINT_BYTES]
    newline = head.find(b"\n")
    if newline >= 0:
        head = head[: newline + 1]
    elif len(head) < FINGERPRINT_BYTES and not (final and head):
        return None
    return hashlib.blake2b(head, digest_size=8).hexdigest()


NOT_SHOWN = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
"""What the gateway refuses in a chunk's ``file`` (docs/protocol.md): the control characters
(C0, DEL, C1), the line and paragraph separators and the bidirectional controls."""


def display_path(path: str) -> str:
    """``path`` as UTF-8 text the gateway takes as a ``file``: undecodable bytes, control,
    separator and bidirectional-control characters escaped (``\\x0a``, ``\\u202e``), so that
    no file name, however odd, gets its file refused."""
    if path.isascii() and path.isprintable():
        return path  # the usual case, at C speed: the status names every file every second
    text = os.fsencode(path).decode("utf-8", "backslashreplace")
    return NOT_SHOWN.sub(_escaped, text)


def _escaped(found: re.Match[str]) -> str:
    code = ord(found.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def make_source_id(host: str, identity: FileIdentity, generation: int = 0) -> str:
    """``host:dev:ino:fingerprint[#gN]``, within the protocol's 512 bytes.

    Sources recorded by earlier versions (``host:path:dev:ino:fingerprint``) keep their ids:
    the state file stores every id as it was made (see ``PushDaemon``'s resume).
    """
    tail = f":{identity.dev}:{identity.ino}:{identity.fingerprint}"
    if generation:
        tail += f"#g{generation}"
    shown = display_path(host)
    if len(shown.encode()) + len(tail.encode()) > MAX_SOURCE_ID_BYTES:
        shown = hashlib.blake2b(shown.encode(), digest_size=16).hexdigest()
    return f"{shown}{tail}"
