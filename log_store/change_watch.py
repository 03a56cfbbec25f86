"""Wake readers when another process appends: inotify on each partition's notify file.

Appends made by this process wake readers directly.  A process that commits an append also
writes a byte to the partition's ``notify`` file after the commit is visible, so readers in
other processes (other uvicorn workers, a second gateway on the same data dir) are woken by
inotify without any polling.

A partition no write has made yet has no notify file (nor, perhaps, a directory): its
follower watches the nearest directory above that exists, for the next one down to be made,
and moves down as they are, to the file itself, which wakes it when it is made.  One inotify
instance and one thread serve every followed path of a store, whatever their number.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from inotify_simple import INotify, flags

log = logging.getLogger(__name__)

_FILE_MASK = flags.MODIFY | flags.CLOSE_WRITE | flags.CREATE | flags.MOVED_TO | flags.DELETE_SELF
_DIR_MASK = flags.CREATE | flags.MOVED_TO | flags.DELETE_SELF | flags.MOVE_SELF | flags.ONLYDIR
"""A directory's: an entry made or moved in, the directory removed or moved away (a file's
removal is seen only once no process holds it open: the topic directory's move is what a
deletion is seen by at once)."""
_UNWATCHED_S = 0.5
"""How often a follower the kernel refused a watch for (``max_user_watches`` reached, a file
system without inotify) is called, and its watch tried again: its readers look then."""


class Following:
    """One caller's interest in one path: ``on_change`` is called (in the watcher's thread)
    after every change of the file (of a directory: an entry made in it), after it is made,
    and after it is removed or moved away."""

    def __init__(
        self,
        owner: ChangeWatcher,
        target: Path,
        on_change: Callable[[], None],
        only_gone: bool,
    ):
        self._owner = owner
        self.target = target
        self.on_change = on_change
        self.only_gone = only_gone
        """Called only when the target is removed or moved away."""
        self.at: Path | None = None
        """The path watched for it now: ``target`` or a directory above; None: unwatched."""
        self.cancelled = False

    @property
    def watched(self) -> bool:
        """Whether the kernel watches for it (else it is called every half second)."""
        return self.at is not None

    def cancel(self) -> None:
        """Stop calling ``on_change``; its watch goes when no one else follows the path."""
        self._owner.release(self)


class ChangeWatcher:
    """One inotify instance and thread per store, started on the first watch."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._inotify: INotify | None = None
        self._wds: dict[Path, int] = {}
        self._paths: dict[int, Path] = {}
        self._followers: dict[int, set[Following]] = {}
        self._unwatched: set[Following] = set()
        self._thread: threading.Thread | None = None
        self._closed = False

    def follow(
        self, path: Path, on_change: Callable[[], None], *, only_gone: bool = False
    ) -> Following:
        """Call ``on_change`` whenever the file ``path`` is made, written or removed (with
        ``only_gone``: removed or moved away), until the answer is cancelled."""
        following = Following(self, path, on_change, only_gone)
        with self._lock:
            if self._closed:
                self._unwatched.add(following)
                return following
            self._place(following)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="logbroker-change-watch", daemon=True
                )
                self._thread.start()
        return following

    def release(self, following: Following) -> None:
        with self._lock:
            following.cancelled = True
            self._unwatched.discard(following)
            self._move(following, None)

    @property
    def watches(self) -> int:
        """How many paths the kernel watches for this store now."""
        with self._lock:
            return len(self._wds)

    def _place(self, following: Following) -> bool:
        """Watch the deepest existing path on the way to the target (lock held); True if
        that is the target itself."""
        target = following.target
        while True:
            probe = target
            while probe != probe.parent and not probe.exists():
                probe = probe.parent
            try:
                if self._inotify is None:
                    self._inotify = INotify()
                wd = self._wds.get(probe)
                if wd is None:
                    mask = _FILE_MASK if probe == target and not probe.is_dir() else _DIR_MASK
                    wd = self._inotify.add_watch(str(probe), mask)
                    self._wds[probe] = wd
                    self._paths[wd] = probe
            except OSError as exc:
                if following not in self._unwatched:
                    log.warning(
                        "cannot watch %s for changes (%s); its readers look every %.1f s",
                        probe,
                        exc,
                        _UNWATCHED_S,
                    )
                self._move(following, None)
                self._unwatched.add(following)
                return False
            self._unwatched.discard(following)
            self._move(following, probe)
            if probe == target:
                return True
            # made between the look and the watch, its creation unseen: go down now
            if not Path(*target.parts[: len(probe.parts) + 1]).exists():
                return False

    def _move(self, following: Following, to: Path | None) -> None:
        """Follow ``following`` at ``to`` instead of where it was (lock held); a watch
        nobody follows any more is removed."""
        old = following.at
        if old == to:
            return
        if old is not None:
            wd = self._wds[old]
            left = self._followers[wd]
            left.discard(following)
            if not left:
                self._forget(old, wd, remove=True)
        following.at = to
        if to is not None:
            self._followers.setdefault(self._wds[to], set()).add(following)

    def _forget(self, path: Path, wd: int, *, remove: bool) -> None:
        del self._wds[path], self._paths[wd]
        self._followers.pop(wd, None)
        if remove and self._inotify is not None:
            with contextlib.suppress(OSError):  # the path is gone, and its watch with it
                self._inotify.rm_watch(wd)

    def _run(self) -> None:
        inotify = self._inotify
        looked = time.monotonic()
        while not self._closed:
            if inotify is None:
                events = []
                time.sleep(_UNWATCHED_S)
            else:
                try:
                    events = inotify.read(timeout=int(_UNWATCHED_S * 1000))
                except OSError:
                    return
            called: dict[Following, None] = {}
            with self._lock:
                for event in events:
                    self._seen(event.wd, event.mask, event.name, called)
                if self._unwatched and time.monotonic() - looked >= _UNWATCHED_S:
                    looked = time.monotonic()
                    for following in list(self._unwatched):
                        self._place(following)
                        called[following] = None
            for following in called:
                if not following.cancelled:
                    following.on_change()

    def _seen(self, wd: int, mask: int, name: str, called: dict[Following, None]) -> None:
        """What one event means to the followers of its watch (lock held)."""
        path = self._paths.get(wd)
        if path is None:
            return  # removed meanwhile
        followers = list(self._followers.get(wd, ()))
        if mask & (flags.IGNORED | flags.DELETE_SELF | flags.MOVE_SELF):
            # the path is gone (its topic deleted): down from a directory that is there
            self._forget(path, wd, remove=not mask & flags.IGNORED)
            for following in followers:
                following.at = None
                self._place(following)
                called[following] = None
            return
        for following in followers:
            if following.target == path:
                reached = True
            else:
                # an ancestor: reached if the next directory down (or the file) was made,
                # and then a write may have come already
                reached = name == following.target.parts[len(path.parts)] and self._place(following)
            if reached and not following.only_gone:
                called[following] = None

    def close(self) -> None:
        with self._lock:
            self._closed = True
            inotify, self._inotify = self._inotify, None
        if self._thread is not None:
            self._thread.join(2)
        if inotify is not None:
            inotify.close()
