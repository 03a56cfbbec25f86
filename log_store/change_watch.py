"""Wake readers when another process appends: inotify on each partition's notify file.

Appends made by this process wake readers directly.  A process that commits an append also
writes a byte to the partition's ``notify`` file after the commit is visible, so readers in
other processes (other uvicorn workers, a second gateway on the same data dir) are woken by
inotify without any polling.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from pathlib import Path

from inotify_simple import INotify, flags

log = logging.getLogger(__name__)

_MASK = flags.MODIFY | flags.CLOSE_WRITE | flags.CREATE | flags.MOVED_TO


class ChangeWatcher:
    """One inotify instance and thread per store, started on the first watch."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._inotify: INotify | None = None
        self._callbacks: dict[int, Callable[[], None]] = {}
        self._by_path: dict[Path, int] = {}
        self._thread: threading.Thread | None = None
        self._closed = False

    def watch(self, path: Path, on_change: Callable[[], None]) -> bool:
        """Call ``on_change`` whenever ``path`` is written; False if that cannot be watched."""
        with self._lock:
            if self._closed:
                return False
            if path in self._by_path:
                return True
            try:
                if self._inotify is None:
                    self._inotify = INotify()
                wd = self._inotify.add_watch(str(path), _MASK)
            except OSError as exc:
                log.warning("cannot watch %s for changes (%s); readers poll instead", path, exc)
                return False
            self._callbacks[wd] = on_change
            self._by_path[path] = wd
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="logbroker-change-watch", daemon=True
                )
                self._thread.start()
            return True

    def unwatch(self, path: Path) -> None:
        with self._lock:
            wd = self._by_path.pop(path, None)
            if wd is None or self._inotify is None:
                return
            self._callbacks.pop(wd, None)
            # The path may be gone already, and its watch with it.
            with contextlib.suppress(OSError):
                self._inotify.rm_watch(wd)

    def _run(self) -> None:
        inotify = self._inotify
        assert inotify is not None
        while not self._closed:
            try:
                events = inotify.read(timeout=500)
            except OSError:
                return
            seen: set[int] = set()
            for event in events:
                if event.wd in seen:
                    continue
                seen.add(event.wd)
                callback = self._callbacks.get(event.wd)
                if callback is not None:
                    callback()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            inotify, self._inotify = self._inotify, None
        if self._thread is not None:
            self._thread.join(2)
        if inotify is not None:
            inotify.close()
