"""Telling the service manager (systemd's ``sd_notify`` protocol) that the client is ready.

A unit of ``Type=notify`` is "activating" until its process sends ``READY=1``; systemd holds
a ``systemctl reload`` back (merged into the start) until then, so its SIGHUP cannot reach an
interpreter that is still starting and has no handler yet (which would end the client with
status 129).  Without ``NOTIFY_SOCKET`` in the environment (not started by systemd, or a
unit of another type) nothing is sent.
"""

from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger("logbroker.push")


def notify_service_manager(state: str) -> bool:
    """Send ``state`` (``READY=1``, ``STOPPING=1``) to ``$NOTIFY_SOCKET``; whether it was sent.

    A socket that cannot be reached is logged once per call and otherwise ignored: the
    client ships logs whether or not its service manager listens.
    """
    address = os.environ.get("NOTIFY_SOCKET", "")
    if not address:
        return False
    if address.startswith("@"):  # an abstract socket
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(state.encode())
    except OSError as exc:
        log.warning(
            "cannot tell the service manager %s at NOTIFY_SOCKET %s: %s",
            state,
            address.replace("\0", "@"),
            exc.strerror or exc,
        )
        return False
    return True
