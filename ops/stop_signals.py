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

The callbacks do not run in the signal handler but in a thread of their own, woken by it
(``queue.SimpleQueue.put`` takes no lock a handler could wait on).  A handler runs in the main
thread, between two of its instructions: one that sets a ``threading.Event`` takes the event's
lock, which the main thread holds for a moment in each ``Event.wait`` on it, and when the
signal came in that moment the handler waited for the lock forever.  A gateway stopped while
it waited for Kafka at its start (an ``Event.wait`` every half second) was seen not to exit.
"""

from __future__ import annotations

import logging
import os
import queue
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
_arrived: queue.SimpleQueue[int] = queue.SimpleQueue()
"""The signals whose callbacks are still to run, for :func:`_run_callbacks`."""
_runner: threading.Thread | None = None
_installed = False

log = logging.getLogger(__name__)


def _record(signum: int, frame: FrameType | None) -> None:
    _received.append(signum)
    _arrived.put(signum)


def _record_reload(signum: int, frame: FrameType | None) -> None:
    _reloads.append(signum)
    _arrived.put(signum)


def _run_callbacks(arrived: queue.SimpleQueue[int]) -> None:
    """Run the callbacks of each signal recorded, in order, for good (a daemon thread)."""
    while True:
        signum = arrived.get()
        with _lock:
            callbacks = list(_reload_callbacks if signum == signal.SIGHUP else _callbacks)
        for callback in callbacks:
            try:
                callback()
            except Exception:  # one failing callback must not keep the others from a stop
                log.exception("the callback %r of signal %d failed", callback, signum)


def _start_runner() -> None:
    global _runner
    with _lock:
        if _runner is not None:
            return
        _runner = threading.Thread(
            target=_run_callbacks, args=(_arrived,), name="stop-signals", daemon=True
        )
    _runner.start()


def _after_fork_in_child() -> None:
    """A forked child has no runner (only the forking thread goes on), and the queue's state
    is the parent's: a new queue, and a runner once the child names a callback (not here: a
    child about to exec another program should not start a thread first)."""
    global _arrived, _runner, _lock
    _arrived, _runner, _lock = queue.SimpleQueue(), None, threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def install() -> None:
    """Record stop signals and SIGHUP from now on (main thread only; a no-op elsewhere)."""
    global _installed
    if threading.current_thread() is not threading.main_thread():
        return
    _installed = True
    _start_runner()
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

    ``callback`` runs in the signals' own thread (see above), or in the caller's if the
    signal came first: it must be quick (set flags or events), and may run twice for one
    signal that came while it was being added.
    """
    with _lock:
        _reload_callbacks.append(callback)
    if _installed:
        _start_runner()
    if _reloads:
        callback()


def on_stop(callback: Callable[[], None]) -> None:
    """Call ``callback`` when a stop signal arrives, or now if one already has.

    ``callback`` runs in the signals' own thread (see above), or in the caller's if the
    signal came first: it must be quick (set flags or events), and may run twice for one
    signal that came while it was being added.
    """
    with _lock:
        _callbacks.append(callback)
    if _installed:
        _start_runner()
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
