"""SIGTERM and SIGINT from the first instruction of a command on, never lost.

A long-running command spends its first few hundred milliseconds importing libraries and
reading its configuration.  A service manager that stops it in that window must not kill it
by the signal's default action (exit status -15 instead of a clean 0), and a stop asked for
then must still be honoured once the command is running.  :func:`install` records the signal
from the start; the command names what a stop means with :func:`on_stop`, which runs at once if
the signal came earlier.  A command that does not handle stops gets the default back with
:func:`restore_default`, dying by a signal that came early as it would have.

SIGHUP ("reload your configuration") is recorded the same way, so that a reload asked for
while a daemon starts does not kill it: the command names what a reload means with
:func:`on_reload`; :func:`restore_default_reload` gives commands without one the default back.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from types import FrameType

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

_received: list[int] = []
_callbacks: list[Callable[[], None]] = []
_reloads: list[int] = []
_reload_callbacks: list[Callable[[], None]] = []
_lock = threading.Lock()


def _record(signum: int, frame: FrameType | None) -> None:
    _received.append(signum)
    for callback in list(_callbacks):
        callback()


def _record_reload(signum: int, frame: FrameType | None) -> None:
    _reloads.append(signum)
    for callback in list(_reload_callbacks):
        callback()


def install() -> None:
    """Record stop signals and SIGHUP from now on (main thread only; a no-op elsewhere)."""
    if threading.current_thread() is not threading.main_thread():
        return
    # SIGHUP first: a launcher that sees the SIGTERM handler in place (its only sign that the
    # command has started) may send a reload at once.
    signal.signal(signal.SIGHUP, _record_reload)
    for signum in STOP_SIGNALS:
        signal.signal(signum, _record)
    # A launcher that must signal at once starts the command with these blocked (nothing of
    # a Python program runs before the interpreter has started, tens of milliseconds): a
    # blocked signal stays pending across exec, and stayed pending for good (a reload, or a
    # stop by SIGTERM, never seen).  Recorded from now on, they are let in.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGHUP, *STOP_SIGNALS})


def on_reload(callback: Callable[[], None]) -> None:
    """Call ``callback`` on SIGHUP, or now if one came since :func:`install`.

    ``callback`` runs in the signal handler: it must only set flags or events.
    """
    with _lock:
        _reload_callbacks.append(callback)
    if _reloads:
        callback()


def on_stop(callback: Callable[[], None]) -> None:
    """Call ``callback`` when a stop signal arrives, or now if one already has.

    ``callback`` runs in the signal handler: it must only set flags or events.
    """
    with _lock:
        _callbacks.append(callback)
    if _received:
        callback()


def stop_requested() -> bool:
    """Whether a stop signal has arrived since :func:`install`."""
    return bool(_received)


def restore_default() -> None:
    """Give the stop signals their default action back, and act on one that came early."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in STOP_SIGNALS:
        signal.signal(
            signum, signal.SIG_DFL if signum == signal.SIGTERM else signal.default_int_handler
        )
    if _received:
        os.kill(os.getpid(), _received[0])
    restore_default_reload()


def restore_default_reload() -> None:
    """Give SIGHUP its default action back (the end of the process), acting on an early one."""
    if threading.current_thread() is not threading.main_thread():
        return
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    if _reloads:
        os.kill(os.getpid(), signal.SIGHUP)
