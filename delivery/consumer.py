"""A reader that follows topics (or a prefix) alone or as a member of a consumer group.

Like ``tail -F``, it waits for a named topic that does not exist yet (and for one deleted
and created again), and reads a topic that appears after it started from the topic's start.

The caller polls, processes what it got, then commits: a commit records the position after
the last message handed out, so a crash between processing and commit re-delivers that
batch (at least once) and a clean :meth:`Consumer.close` hands over exactly where it stopped.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from collections.abc import Sequence
from typing import Any

from audit.records import in_prefix
from delivery.filters import MessageFilter
from delivery.pull_client import (
    GONE_ERRORS,
    FetchedPartition,
    GatewayUnavailable,
    PullClient,
    ReadMessage,
    RequestRefused,
)
from log_store.errors import CorruptData

_log = logging.getLogger(__name__)
_DISCOVER_S = 2.0
"""How soon a reader alone finds a topic created under its prefix, or created again."""
_WAITING_DISCOVER_S = 0.5
"""How soon it finds a named topic it is waiting for."""
_GONE = GONE_ERRORS
"""Errors that mean a topic (or partition) went away under the reader: look again."""

TopicPartition = tuple[str, int]


class Consumer:
    """Follows ``topics`` or every topic under ``prefix``; with ``group``, shares them.

    Nothing is asked of the gateway before the first :meth:`poll` (a group member joins
    there), so a gateway that is away is met, and retried, where every other request is.
    """

    def __init__(
        self,
        client: PullClient,
        *,
        topics: Sequence[str] = (),
        prefix: str | None = None,
        group: str | None = None,
        from_beginning: bool = False,
        message_filter: MessageFilter | None = None,
        max_bytes: int = 4 * 1024 * 1024,
        session_timeout_ms: int = 10_000,
        prefetch: bool = True,
    ) -> None:
        """``prefetch``: while catching up, fetch the next batch while the caller handles the
        last one (one request in flight at a time; positions and commits are unaffected)."""
        if bool(topics) == (prefix is not None):
            raise ValueError("give topics or a prefix")
        self._client = client
        self._topics = tuple(topics)
        self._prefix = prefix
        self._group = group
        self._from_beginning = from_beginning
        self._filter = message_filter
        self._max_bytes = max_bytes
        self._session_timeout_ms = session_timeout_ms
        self._positions: dict[TopicPartition, int] = {}
        self._committed: dict[TopicPartition, int] = {}
        # The identity of each topic the positions belong to; a topic created again gets a
        # new one and its positions restart at the new topic's start.
        self._topic_ids: dict[str, str] = {}
        self._said_created_again: set[str] = set()
        """Topics said to be created again before a look saw their new id (said once)."""
        self._member_id: str | None = None
        self._heartbeat_s = session_timeout_ms / 3000
        self._last_heartbeat = 0.0
        self._last_discovery = 0.0
        self._missing: list[str] = []
        self._prefetcher = (
            concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="logbroker-prefetch")
            if prefetch
            else None
        )
        self._prefetched: (
            tuple[
                tuple[tuple[str, int, int], ...],
                dict[str, str],
                concurrent.futures.Future[list[FetchedPartition]],
            ]
            | None
        ) = None
        self._draining: dict[TopicPartition, int] = {}
        # Partitions the gateway said are not there, with when to ask for them again: the look
        # at the topics (or the group's assignment) it prompts drops them, or reads their topic
        # made again from its start; meanwhile the other partitions are read.
        self._aside: dict[TopicPartition, float] = {}
        self._look_again = False
        self._last_refusal = ""
        self.corrupt: dict[TopicPartition, tuple[int, CorruptData]] = {}
        """The partitions this reader stopped reading, with the position it stopped at: the
        gateway cannot read past it (a batch there fails its checksum).  The position stays
        (and is what a group commits): nothing past the damage is skipped without an
        operator's word."""
        self.behind = False
        """Whether the last :meth:`poll` moved a position on and left it short of its
        partition's end, also when it returned no message (its answer stopped at a budget of
        records that are no envelopes or that the filter left out; or it moved past data
        retention dropped): the next poll reads more at once, the reader is not idle."""

    @property
    def member_id(self) -> str | None:
        return self._member_id

    @property
    def assignment(self) -> list[TopicPartition]:
        return sorted(self._positions)

    @property
    def missing_topics(self) -> list[str]:
        """Named topics this reader waits for (not on the gateway yet, or deleted)."""
        return list(self._missing)

    # -- membership -------------------------------------------------------------------------------
    def _join(self) -> None:
        assert self._group is not None
        state = self._client.join(
            self._group,
            topics=self._topics,
            prefix=self._prefix,
            reset="earliest" if self._from_beginning else "latest",
            session_timeout_ms=self._session_timeout_ms,
        )
        self._member_id = state["member_id"]
        self._heartbeat_s = state["heartbeat_interval_ms"] / 1000
        self._positions = {}
        self._committed = {}
        self._draining = {}
        self._apply(state)

    def _apply(self, state: dict[str, object]) -> None:
        missing = state.get("missing_topics") or []
        assert isinstance(missing, list)
        self._missing = missing
        assigned = state["assignment"]
        assert isinstance(assigned, list)
        owned = {(a["topic"], a["partition"]): a["offset"] for a in assigned}
        for a in assigned:
            topic_id = a.get("topic_id")
            known = self._topic_ids.get(a["topic"])
            if topic_id is None or known == topic_id:
                continue
            if known is not None:
                self._created_again(a["topic"])
                for tp in [tp for tp in self._positions if tp[0] == a["topic"]]:
                    del self._positions[tp]  # the group's offset for the new topic follows
                    self._committed.pop(tp, None)
                    self._aside.pop(tp, None)
                for tp in [tp for tp in self._draining if tp[0] == a["topic"]]:
                    # Still released, but its old topic's offset is not committed.
                    self._committed[tp] = self._draining[tp]
            self._topic_ids[a["topic"]] = topic_id
        revoke = state.get("revoke") or []
        assert isinstance(revoke, list)
        for r in revoke:
            tp = (r["topic"], r["partition"])
            # Stop reading it; what was processed is committed before it is released.
            if tp in self._positions:
                self._draining[tp] = self._positions.pop(tp)
        for tp in list(self._positions):
            if tp not in owned:
                del self._positions[tp]
                self._committed.pop(tp, None)
        for tp, offset in owned.items():
            if tp not in self._positions:
                self._positions[tp] = offset
                self._committed[tp] = offset
        self._last_heartbeat = time.monotonic()
        self._look_again = False

    def _heartbeat(self, *, commit_first: bool = True) -> None:
        assert self._group is not None and self._member_id is not None
        release: list[TopicPartition] = list(self._draining)
        if release and commit_first:
            self.commit()
            release = list(self._draining)
        try:
            state = self._client.heartbeat(self._group, self._member_id, release)
        except RequestRefused as exc:
            if exc.error != "unknown_member":
                raise
            _log.warning("this member was dropped from group %s; joining again", self._group)
            self._join()
            return
        for tp in release:
            self._draining.pop(tp, None)
            self._committed.pop(tp, None)
        self._apply(state)

    def _discover(self) -> None:
        """Standalone reading: start new partitions at the start or the end; forget topics
        and partitions that went away (a topic created again is read from its start, whatever
        its partitions are now)."""
        # the prefix '' is every topic (audit topics aside), not "no prefix"
        topics = self._topics if self._prefix is None else self._client.list_topics(self._prefix)
        present = set()
        missing = []
        for topic in topics:
            if self._prefix is not None and not in_prefix(topic, self._prefix):
                continue
            try:
                info = self._client.describe(topic)
            except RequestRefused as exc:
                if exc.error != "unknown_topic":
                    raise
                missing.append(topic)
                continue
            present.add(topic)
            known = self._topic_ids.get(topic)
            recreated = known is not None and known != info["topic_id"]
            if recreated:
                self._created_again(topic)
            self._topic_ids[topic] = info["topic_id"]
            now_there = {p["partition"] for p in info["partitions"]}
            for tp in [tp for tp in self._positions if tp[0] == topic]:
                if tp[1] not in now_there:
                    # Only the old topic had it: a fetch naming it would be refused for ever.
                    if not recreated:
                        _log.warning("%s/%d is gone; reading the topic's others", *tp)
                    del self._positions[tp]
                elif recreated:
                    self._aside.pop(tp, None)
            for p in info["partitions"]:
                tp = (topic, p["partition"])
                if recreated and tp in self._positions:
                    self._positions[tp] = p["start_offset"]
                if tp not in self._positions:
                    discovered_late = self._last_discovery > 0
                    start = self._from_beginning or discovered_late
                    self._positions[tp] = p["start_offset"] if start else p["end_offset"]
        for tp in [tp for tp in self._positions if tp[0] not in present]:
            del self._positions[tp]  # deleted: if it comes back, it is a new topic
        self._missing = missing
        self._last_discovery = time.monotonic()
        self._look_again = False

    # -- reading ----------------------------------------------------------------------------------
    def poll(self, wait_ms: int = 1000) -> list[ReadMessage]:
        """The next messages of the partitions this reader has, in partition order."""
        self.behind = False
        now = time.monotonic()
        if self._group is not None:
            if self._member_id is None:
                self._join()
            elif (
                now - self._last_heartbeat >= self._heartbeat_s
                or self._draining
                or self._look_again
            ):
                self._heartbeat()
            wait_ms = min(wait_ms, int(self._heartbeat_s * 1000))
        elif self._look_again or now - self._last_discovery >= (
            _WAITING_DISCOVER_S if self._missing else _DISCOVER_S
        ):
            self._discover()
        if not self._positions:
            self._drop_prefetch()
            time.sleep(min(wait_ms, 200) / 1000)
            return []
        positions = self._fetch_positions()
        if not positions:
            self._drop_prefetch()
            time.sleep(min(wait_ms, 200) / 1000)
            return []
        ids = dict(self._topic_ids)
        try:
            fetched = self._take_prefetched(positions, ids)
            if fetched is None:
                fetched = self._fetch(positions, wait_ms, ids)
        except RequestRefused as exc:
            if exc.error == "offset_out_of_range" and "start_offset" in exc.body:
                self._skip_lost(positions)
                return []
            if exc.error in _GONE:
                # A topic was deleted under the reader (maybe to be created again).
                if exc.reason != self._last_refusal:
                    _log.warning("%s; looking at the topics again", exc.reason)
                self._last_refusal = exc.reason
                if self._group is not None:
                    self._heartbeat()
                else:
                    self._discover()
                if self._fetch_positions() == positions:
                    self._set_aside_refused(positions)
                return []
            raise
        changed = self._set_aside_gone(fetched)
        messages: list[ReadMessage] = []
        recreated: dict[str, dict[int, FetchedPartition]] = {}
        for part in fetched:
            tp = (part.topic, part.partition)
            if tp not in self._positions:
                continue
            if part.recreated is not None:
                # Read at an offset of the topic before it was deleted and made again: the
                # gateway read nothing there; the new topic is read from its start.
                recreated.setdefault(part.topic, {})[part.partition] = part
                continue
            if part.topic in changed:
                # A topic with a partition gone may be one made again: what its other
                # partitions answered at the old topic's positions waits for the look at it.
                self.behind = self.behind or bool(part.messages)
                continue
            self._aside.pop(tp, None)
            if part.corrupt is not None:
                self._stop_at_damage(tp, part.corrupt)
                continue
            for skipped in part.not_envelopes:
                # Moving past it is what every reader of the log must do (it holds no lines);
                # saying so is what keeps the move from being a silent loss.
                _log.warning(
                    "skipping a record that is not a logbroker envelope: %s/%d offset %d: %s",
                    part.topic,
                    part.partition,
                    skipped.offset,
                    skipped.reason,
                )
            messages.extend(part.messages)
            if part.next_offset != self._positions[tp] and part.next_offset < part.end_offset:
                self.behind = True
            self._positions[tp] = part.next_offset
            if part.topic_id is not None and part.topic not in self._topic_ids:
                self._topic_ids[part.topic] = part.topic_id  # a look's id, where none was
        if recreated:
            self._start_again(recreated, ids)
            self.behind = True
        if messages and self._prefetcher is not None:
            # Catching up: the next fetch runs while the caller handles this one.
            following = self._fetch_positions()
            following_ids = dict(self._topic_ids)
            self._prefetched = (
                following,
                following_ids,
                self._prefetcher.submit(self._fetch, following, 0, following_ids),
            )
        return messages

    def _start_again(
        self, recreated: dict[str, dict[int, FetchedPartition]], sent: dict[str, str]
    ) -> None:
        """Topics whose reads named the identity they had before they were deleted and made
        again: look at them (a group member at its assignment, which holds the group's
        offsets of the new topic: its start), which says once that each was created again and
        reads it from its start.  A look that does not see the new topic yet (another
        gateway's, a moment behind) leaves it to the reads' answer: every partition of the
        topic starts over where the answer says the new topic starts (0 for one it did not
        name), so the new topic's first offsets are never skipped."""
        if self._group is not None:
            self._heartbeat()
        else:
            self._discover()
        for topic, parts in sorted(recreated.items()):
            if self._topic_ids.get(topic) != sent.get(topic):
                continue  # the look saw the new topic and started it over
            new_id = next(p.topic_id for p in parts.values())
            if new_id is None:
                continue
            self._created_again(topic)
            self._topic_ids[topic] = new_id
            for tp in [tp for tp in self._positions if tp[0] == topic]:
                part = parts.get(tp[1])
                self._positions[tp] = part.next_offset if part is not None else 0
                self._aside.pop(tp, None)

    def _fetch_positions(self) -> tuple[tuple[str, int, int], ...]:
        """Where to read next: every partition this reader has, but those it stopped at
        damaged data and those set aside as not there."""
        # a stop whose position moved (the topic made again, the partition given to another
        # member) no longer holds
        self.corrupt = {
            tp: stop for tp, stop in self.corrupt.items() if self._positions.get(tp) == stop[0]
        }
        self._aside = {tp: t for tp, t in self._aside.items() if tp in self._positions}
        now = time.monotonic()
        return tuple(
            (t, p, o)
            for (t, p), o in sorted(self._positions.items())
            if (t, p) not in self.corrupt and self._aside.get((t, p), now) <= now
        )

    def _set_aside(self, tps: Sequence[TopicPartition], reason: str) -> None:
        """Leave partitions of one topic that the gateway says are not there out of the reads
        for a while, and look at the topics (or the group's assignment) again at once."""
        said = [p for t, p in tps if (t, p) not in self._aside]
        if said:
            named = ",".join(map(str, said))
            _log.warning("%s/%s: %s; looking at the topics again", tps[0][0], named, reason)
        until = time.monotonic() + _DISCOVER_S
        for tp in tps:
            self._aside[tp] = until
        self._look_again = True

    def _set_aside_gone(self, fetched: Sequence[FetchedPartition]) -> set[str]:
        """Set aside the partitions an answer says are not there; the topics they belong to."""
        gone: dict[str, list[TopicPartition]] = {}
        reasons: dict[str, str] = {}
        for part in fetched:
            tp = (part.topic, part.partition)
            if part.gone is not None and tp in self._positions:
                gone.setdefault(part.topic, []).append(tp)
                reasons.setdefault(part.topic, part.gone)
        for topic, tps in gone.items():
            self._set_aside(tps, reasons[topic])
        return set(gone)

    def _set_aside_refused(self, positions: Sequence[tuple[str, int, int]]) -> None:
        """A whole fetch was refused for a partition that is not there, and the look at the
        topics still names it (a gateway from before fetches answered such a partition alone,
        whose look at the topic disagrees with its reads): fetch each topic alone, then each
        partition of a topic refused, and set aside those refused, so that the others are
        read meanwhile."""
        by_topic: dict[str, list[tuple[str, int, int]]] = {}
        for t, p, o in positions:
            by_topic.setdefault(t, []).append((t, p, o))
        for own in by_topic.values():
            if len(by_topic) > 1 and self._refusal_of(own) is None:
                continue
            for t, p, o in own:
                reason = self._refusal_of([(t, p, o)])
                if reason is not None:
                    self._set_aside([(t, p)], reason)
        self._look_again = False  # just looked

    def _refusal_of(self, positions: Sequence[tuple[str, int, int]]) -> str | None:
        """Why the gateway says a partition of ``positions`` is not there, if it does."""
        try:
            # what it reads is read again by the next poll: it asks for little
            answer = self._client.fetch(positions, max_bytes=1)
        except RequestRefused as exc:
            return exc.reason if exc.error in _GONE else None
        return next((part.gone for part in answer if part.gone is not None), None)

    def _stop_at_damage(self, tp: TopicPartition, error: CorruptData) -> None:
        if tp not in self.corrupt:
            _log.error(
                "%s/%d: stopped at offset %d, the gateway cannot read past it: %s",
                tp[0],
                tp[1],
                self._positions[tp],
                error,
            )
        self.corrupt[tp] = (self._positions[tp], error)

    def _fetch(
        self, positions: Sequence[tuple[str, int, int]], wait_ms: int, ids: dict[str, str]
    ) -> list[FetchedPartition]:
        """Read ``positions``, each naming the identity of its topic (``ids``) its offset
        belongs to: a topic made again is answered as such, not read from the old offset."""
        return self._client.fetch(
            positions,
            max_bytes=self._max_bytes,
            wait_ms=wait_ms,
            message_filter=self._filter,
            topic_ids=ids,
        )

    def _take_prefetched(
        self, positions: tuple[tuple[str, int, int], ...], ids: dict[str, str]
    ) -> list[FetchedPartition] | None:
        """The prefetched answer if it was asked for exactly these positions and ids."""
        if self._prefetched is None:
            return None
        asked, asked_ids, future = self._prefetched
        self._prefetched = None
        if asked != positions or asked_ids != ids:
            future.cancel()  # the assignment, a position or a topic's identity moved meanwhile
            return None
        return future.result()

    def _drop_prefetch(self) -> None:
        if self._prefetched is not None:
            self._prefetched[2].cancel()
            self._prefetched = None

    def _skip_lost(self, positions: Sequence[tuple[str, int, int]]) -> None:
        """A position outside its partition's offsets.  Below the start, retention dropped
        data before it was read: move on to the start.  Past the end, the topic was deleted
        and created again: a group member takes the group's position in the new topic from a
        heartbeat; a reader alone reads the new topic from its start."""
        described: dict[str, dict[str, Any]] = {}
        past_end: dict[TopicPartition, tuple[int, int]] = {}
        for topic, partition, offset in positions:
            if topic not in described:
                try:
                    described[topic] = self._client.describe(topic)
                except RequestRefused as exc:
                    if exc.error != "unknown_topic":
                        raise
                    described[topic] = {"partitions": []}  # gone: the next look handles it
            for p in described[topic]["partitions"]:
                if p["partition"] != partition:
                    continue
                if offset < p["start_offset"]:
                    _log.warning(
                        "%s/%d: offsets %d..%d were dropped by retention before being read",
                        topic,
                        partition,
                        offset,
                        p["start_offset"] - 1,
                    )
                    self._positions[(topic, partition)] = p["start_offset"]
                    self.behind = p["start_offset"] < p["end_offset"] or self.behind
                elif offset > p["end_offset"]:
                    # The look below says it once per topic ("... was created again").
                    _log.debug(
                        "%s/%d: position %d is past the end %d: the topic was created again",
                        topic,
                        partition,
                        offset,
                        p["end_offset"],
                    )
                    past_end[(topic, partition)] = (offset, p["start_offset"])
        if past_end:
            # The look notes the new topic's id too: read from its start once, not again when
            # the next look finds the id changed.
            ids_before = dict(self._topic_ids)
            if self._group is not None:
                self._heartbeat()
            else:
                self._discover()
            for topic in sorted({t for t, _ in past_end}):
                if self._topic_ids.get(topic) == ids_before.get(topic):
                    # The look did not say so (it saw no new id yet): said here, and not
                    # again when a later look sees the new id.
                    self._created_again(topic)
                    self._said_created_again.add(topic)
        for tp, (offset, start) in past_end.items():
            if self._positions.get(tp) == offset:
                self._positions[tp] = start

    def _created_again(self, topic: str) -> None:
        if topic in self._said_created_again:
            self._said_created_again.discard(topic)
            return
        _log.warning("%s was created again; reading it from its start", topic)

    def commit(self) -> None:
        """Record the positions after everything :meth:`poll` returned (group readers)."""
        if self._group is None:
            return
        current = {**self._positions, **self._draining}
        pending = [
            (t, p, o) for (t, p), o in sorted(current.items()) if self._committed.get((t, p)) != o
        ]
        if not pending:
            return
        try:
            self._client.commit(self._group, self._member_id, pending, self._topic_ids)
        except RequestRefused as exc:
            if exc.error not in ("not_owner", "unknown_member", "topic_recreated", *_GONE):
                raise
            if exc.error == "topic_recreated":
                # the heartbeat below brings the new topic's positions, and says once that
                # the topic was created again
                _log.info("commit refused (%s)", exc.reason)
            else:
                _log.warning("commit refused (%s); the group rebalanced", exc.reason)
            if self._member_id is not None:
                self._heartbeat(commit_first=False)
            return
        for t, p, o in pending:
            self._committed[(t, p)] = o

    def close(self) -> None:
        """Commit and leave the group, so the partitions move on at once."""
        self._drop_prefetch()
        if self._prefetcher is not None:
            self._prefetcher.shutdown(wait=False, cancel_futures=True)
        if self._group is None or self._member_id is None:
            return
        try:
            self.commit()
            self._client.leave(self._group, self._member_id)
        except (RequestRefused, GatewayUnavailable) as exc:
            _log.warning("could not leave group %s cleanly: %s", self._group, exc)
        self._member_id = None
