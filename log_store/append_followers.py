"""Who follows the appends of which partition of one embedded store: ``follow_appends``.

Followers are kept by topic *name* and partition, as readers name them.  An append of this
process calls them from the thread that committed it; another process's append reaches them
through the store's one :class:`~log_store.change_watch.ChangeWatcher` thread, on the
partition's ``notify`` file under its topic's id.  A topic deleted and made again (by any
process) has a new id, so the file followed goes away: the followers are called, the topic
is looked up again, and its new id's file is followed, or, while no topic of that name is
there, the topic's directory, for the next one to be made.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from log_store.change_watch import ChangeWatcher, Following

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]


@dataclass(eq=False)
class _Followed:
    topic_id: str | None
    """The id of the topic whose partition's file is followed; None: no topic of that name
    was there, its directory is followed."""
    following: list[Following] = field(default_factory=list)
    followers: list[Callable[[], None]] = field(default_factory=list)


class AppendFollowers:
    """The followers of one store's partitions, with one watch per followed partition."""

    def __init__(
        self,
        watcher: ChangeWatcher,
        topics_dir: Path,
        topic_id_of: Callable[[str], str | None],
    ) -> None:
        """``topic_id_of(name)``: the id of the topic of that name now (None: none)."""
        self._watcher = watcher
        self._topics_dir = topics_dir
        self._topic_id_of = topic_id_of
        self._lock = threading.Lock()
        self._followed: dict[TopicPartition, _Followed] = {}

    def follow(
        self, topic: str, partition: int, topic_id: str, on_append: Callable[[], None]
    ) -> Callable[[], None]:
        """Call ``on_append`` after each change of the partition (``topic_id``: the id of
        the topic now) until the function returned is called."""
        key = (topic, partition)
        with self._lock:
            entry = self._followed.get(key)
            if entry is None:
                entry = self._followed[key] = _Followed(topic_id)
                entry.following = self._watch(key, topic_id)
            entry.followers.append(on_append)
        return functools.partial(self._unfollow, key, on_append)

    @property
    def followed(self) -> int:
        """How many partitions are followed now."""
        with self._lock:
            return len(self._followed)

    def _watch(self, key: TopicPartition, topic_id: str | None) -> list[Following]:
        """Follow the partition's notify file and its topic's directory (moved away first
        when the topic is deleted: the file, held open by its writers, may not be seen to
        go before they let it go); with no topic, the directory of the topic's name."""
        topic, partition = key
        on_change = functools.partial(self._notified, key)
        if topic_id is None:
            return [self._watcher.follow(self._topics_dir / topic, on_change)]
        topic_dir = self._topics_dir / topic / topic_id
        return [
            self._watcher.follow(topic_dir / str(partition) / "notify", on_change),
            self._watcher.follow(topic_dir, on_change, only_gone=True),
        ]

    def _unfollow(self, key: TopicPartition, on_append: Callable[[], None]) -> None:
        with self._lock:
            entry = self._followed.get(key)
            if entry is None or on_append not in entry.followers:
                return
            entry.followers.remove(on_append)
            if entry.followers:
                return
            del self._followed[key]
        for following in entry.following:
            following.cancel()

    def appended(self, topic: str, partition: int) -> None:
        """Call the partition's followers: it changed (in the thread that changed it)."""
        with self._lock:
            entry = self._followed.get((topic, partition))
            followers = tuple(entry.followers) if entry is not None else ()
        for on_append in followers:
            try:
                on_append()
            except Exception:
                # called by the committer thread: a follower's failure is not the append's
                log.exception("a follower of %s/%d failed", topic, partition)

    def _notified(self, key: TopicPartition) -> None:
        """The followed file (or directory) changed: call the followers, and follow the
        topic made again if the one followed is gone.  In the watcher's thread."""
        self.appended(*key)
        with self._lock:
            entry = self._followed.get(key)
            if entry is None:
                return
            stale = entry.topic_id
            if stale is not None and (self._topics_dir / key[0] / stale).exists():
                return  # the usual case: an append
        try:
            topic_id = self._topic_id_of(key[0])
        except Exception as exc:  # the catalog unreadable now: looked at on the next change
            log.debug("looking up %s again: %s", key[0], exc)
            return
        with self._lock:
            entry = self._followed.get(key)
            if entry is None or entry.topic_id != stale or topic_id == stale:
                return
            old = entry.following
            entry.topic_id = topic_id
            entry.following = self._watch(key, topic_id)
        for following in old:
            following.cancel()
        if topic_id is not None:
            self.appended(*key)  # a write may have made it before its file was followed

    def close(self) -> None:
        with self._lock:
            entries = list(self._followed.values())
            self._followed.clear()
        for entry in entries:
            for following in entry.following:
                following.cancel()
