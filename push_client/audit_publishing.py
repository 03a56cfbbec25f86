"""The push-client's tier of the audit: each installation's counts, published to whichever of
its gateways answers.

A chunk is counted (tier ``push-client``) when a gateway acknowledges it, in the counts of the
installation that acknowledged it, and each installation's counts are published to that
installation's log: the audit reads a DC's audit topic as that DC's tiers, so counts of one
installation's topics written into another's would show there as another DC's tier
(``push-client@dc2``), not as the source the gateway tier is compared with.

Within an installation the counts follow the data: they go first to the gateway the data goes
to now (:attr:`GatewayClient.current_server`, the last one that answered), then to the others
in the configured order, so a gateway that died does not keep the tier out of the audit; only
to gateways that said they belong to the installation since they last failed (the requests of
the data ask them, see :mod:`push_client.gateway_check`), so that counts never go to a
gateway that came back as another installation's.  An
installation whose gateways all fail keeps its counts until the next publication (every
interval, see :mod:`audit.publisher`); at exit the last publication gets one try at each of its
gateways, and what it could not publish is said in one line.

The counts survive a crash (:class:`PushAuditCounts`): their totals are saved in the state
file with the positions, and every acknowledgement's counts are appended to a journal beside
it before they are counted in memory, so a client SIGKILLed and started again goes on from
exactly what it had acknowledged, under the same instance name.  The push-client is the
source tier of the audit: counts it lost would show as lines duplicated at every tier after it.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson

from audit.publisher import AuditPublisher, interval_from_env
from audit.sinks import AuditForbidden, AuditWriteFailed, HttpAuditSink, incarnation_id
from audit.windows import WindowCounts, window_start
from push_client.installations import InstallationSet
from push_client.transport import GatewayClient

TIER = "push-client"
WRITE_TIMEOUT_S = 10.0
"""How long one gateway is given for one audit write before the next one is tried."""
JOURNAL_NAME = "audit-journal"
FORGET_AFTER_S = 7 * 24 * 3600.0 + 3600.0
"""Windows that started this long ago are dropped from the counts (and the state file) once
published, as the gateway drops its own: the client's create times are its clock when it cut
the chunk, so a window that old gets no more lines."""

log = logging.getLogger("logbroker.push")


SentKey = tuple[str, str, int]
"""(installation, source id, seqno) of a chunk sent."""
Sent = tuple[str, int, int]
"""(topic, window, lines) of a chunk sent."""


class PushAuditCounts:
    """The lines each installation acknowledged, per topic and window, kept across restarts.

    A chunk is counted once the push-client knows that an installation's log holds it: when a
    gateway acknowledges it (``written`` or ``duplicate``), or, for a chunk sent whose answer
    never came (the request timed out, the installation went down, the client was killed),
    when a session of its source learns that the log holds the source up to its seqno or
    beyond (:meth:`settle`).  So every chunk counted by a gateway is counted here too, once,
    whatever became of its answer.  The chunks sent and not settled are kept until then
    (:attr:`sent_chunks`).

    Three parts, all in the state dir:

    - the totals and the chunks sent as of the last save of the positions, in the state file
      (``audit``: the instance name, a generation, per instance (one per installation)
      ``[topic, window, messages, lines]``, and the chunks in flight);
    - the journal ``audit-journal``: a first line naming the generation of the save it
      follows, then one line per request sent (its chunks) and one per answer or settlement
      (the counts it adds and the chunks it settles).  It is written (not synced: a SIGKILL
      leaves what was written in the page cache) before a request goes out and before counts
      change in memory, so nothing can be published, nor written to a log, that it lacks;
    - the counts in memory (:attr:`counts`), which the publishers read.

    A save of the positions writes the totals with the next generation and then starts a new
    journal of that generation; a journal of another generation than the state file's (a
    crash between the two) holds only what the totals hold already and is ignored.  At the
    start the totals and the journal of their generation give back exactly the counts and the
    chunks in flight at the crash, which the sessions of the restart settle.  The instance
    name is kept in the state file: a restarted client goes on with the totals of the same
    instance, whose latest record replaces the earlier ones.  A state dir without saved counts
    (the first start, a client of an earlier version, a lost or corrupt state file) starts a
    new instance from zero: the records of the earlier one stay in the audit and add to it.

    Owned by the loop thread; the publishers read :attr:`counts` from theirs.
    """

    def __init__(self, state_dir: Path, *, multi: bool = False) -> None:
        self.path = state_dir / JOURNAL_NAME
        self.multi = multi
        self.counts: dict[str, WindowCounts] = {}
        """Per instance (:meth:`label`): its totals.  Instances of installations no longer
        configured (or of a client that had one installation and has several now, or the
        other way round) are kept and saved as they are, not published: their records stay
        in the audit and add to the new instances'."""
        self.sent_chunks: dict[tuple[str, str], dict[int, Sent]] = {}
        """Per (instance, source id): the chunks sent whose fate is not known yet."""
        self.instance = ""
        """The instance name of the push-client tier (:meth:`restore` sets it)."""
        self.generation = 0
        self._fd = -1
        self._trouble = ""
        """The last error writing the journal (said once)."""
        self.restored_from_journal = 0
        """How many of the journal's lines :meth:`restore` took up after the saved totals."""

    # -- start ----------------------------------------------------------------------------------
    def restore(self, saved: Any) -> None:
        """Take up the totals of a state file (its ``audit``, None without) and the journal
        written after them; then start journaling again."""
        if saved is not None and not self._restore_totals(saved):
            log.warning(
                "the audit counts in the state file are not readable; counting anew as a new "
                "audit instance"
            )
            saved = None
        if saved is None:
            self.instance, self.generation = incarnation_id(), 0
            self._start_journal()
            return
        entries = self._read_journal()
        if entries is None:
            self._start_journal()
            return
        for doc in entries:
            self._apply(doc)
        self.restored_from_journal = len(entries)
        self._open_journal()

    def label(self, name: str) -> str:
        """The instance name of installation ``name``'s counts: the state dir's, with the
        installation's name added when there are several (two installations may hold
        topics of the same name, and the audit adds the totals of different instances)."""
        return f"{self.instance}-{name}" if self.multi else self.instance

    def of(self, name: str) -> WindowCounts:
        """Installation ``name``'s counts (after :meth:`restore`)."""
        return self._counts_of(self.label(name))

    def _counts_of(self, label: str) -> WindowCounts:
        counts = self.counts.get(label)
        if counts is None:
            counts = self.counts[label] = WindowCounts()
        return counts

    def _restore_totals(self, saved: Any) -> bool:
        if not isinstance(saved, dict):
            return False
        instance, generation = saved.get("instance"), saved.get("generation")
        totals, in_flight = saved.get("counts"), saved.get("in_flight", [])
        if not (
            isinstance(instance, str)
            and instance
            and isinstance(generation, int)
            and isinstance(totals, dict)
            and isinstance(in_flight, list)
            and all(_is_sent_row(row, with_name=True) for row in in_flight)
        ):
            return False
        keys: list[tuple[str, str, int, int, int]] = []
        for label, rows in totals.items():
            if not isinstance(rows, list) or not all(_is_key_row(row) for row in rows):
                return False
            keys.extend((label, *row) for row in rows)
        for label, topic, window, messages, lines in keys:
            self._counts_of(label).set(topic, window, messages, lines)
        for label, source_id, seqno, topic, window, lines in in_flight:
            self.sent_chunks.setdefault((label, source_id), {})[seqno] = (topic, window, lines)
        self.instance, self.generation = instance, generation
        return True

    def _read_journal(self) -> list[dict[str, Any]] | None:
        """The lines of the journal that follows the saved totals; None when it does not
        follow them (a crash right after a save, or no journal)."""
        try:
            raw = self.path.read_bytes()
        except OSError:
            return None
        lines = raw.split(b"\n")
        try:
            head = orjson.loads(lines[0])
        except orjson.JSONDecodeError:
            return None
        if not isinstance(head, dict) or head.get("generation") != self.generation:
            return None
        if head.get("instance") != self.instance:
            return None
        entries = []
        for line in lines[1:]:
            try:
                doc = _loads(line)
            except ValueError:
                continue  # a line torn by a crash of the machine
            if _is_journal_line(doc):
                entries.append(doc)
        return entries

    def _apply(self, doc: dict[str, Any]) -> None:
        """One journal line: chunks sent (``s``), or counts added and chunks settled (``i``)."""
        if "s" in doc:
            for source_id, seqno, topic, window, lines in doc["k"]:
                self.sent_chunks.setdefault((doc["s"], source_id), {})[seqno] = (
                    topic,
                    window,
                    lines,
                )
            return
        name = doc["i"]
        for source_id, seqno in doc.get("a", []):
            self._forget_sent(name, source_id, seqno)
        counts = self._counts_of(name)
        for topic, window, messages, lines in doc["c"]:
            counts.add(topic, window * 1000, messages, lines)

    # -- the journal ----------------------------------------------------------------------------
    def _open_journal(self) -> None:
        self._close_journal()
        try:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        except OSError as exc:
            self._journal_trouble(exc)

    def _start_journal(self) -> None:
        """A new journal, of the generation of the totals saved last."""
        self._close_journal()
        head = orjson.dumps({"generation": self.generation, "instance": self.instance}) + b"\n"
        try:
            self._fd = os.open(
                self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC, 0o644
            )
            os.write(self._fd, head)
        except OSError as exc:
            self._journal_trouble(exc)
            self._close_journal()

    def _close_journal(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1

    def _journal(self, doc: dict[str, Any]) -> None:
        if self._fd < 0:
            return
        try:
            os.write(self._fd, _dumps(doc) + b"\n")
        except OSError as exc:
            self._journal_trouble(exc)

    def _journal_trouble(self, exc: OSError) -> None:
        text = exc.strerror or str(exc)
        if text != self._trouble:
            self._trouble = text
            log.warning(
                "cannot write the audit journal %s: %s; the audit counts since the last save "
                "of the positions are lost if the client is killed",
                self.path,
                text,
            )

    # -- counting -------------------------------------------------------------------------------
    def sent(self, name: str, chunks: Sequence[tuple[str, int, str, int, int]]) -> None:
        """Chunks about to be sent to installation ``name``: (source id, seqno, topic, create
        time ms, lines).  Journaled before the request goes out."""
        rows = [
            (source_id, seqno, topic, window_start(create_time_ms), lines)
            for source_id, seqno, topic, create_time_ms, lines in chunks
        ]
        if not rows:
            return
        label = self.label(name)
        self._journal({"s": label, "k": rows})
        for source_id, seqno, topic, window, lines in rows:
            self.sent_chunks.setdefault((label, source_id), {})[seqno] = (topic, window, lines)

    def acked(self, name: str, chunks: Sequence[tuple[str, int]]) -> None:
        """Chunks installation ``name`` acknowledged: (source id, seqno).  Each is counted
        once, as it was sent (a chunk acknowledged twice, sent twice and answered twice, is
        one chunk in the log)."""
        label = self.label(name)
        keys: dict[tuple[str, int], list[int]] = {}
        settled = []
        for source_id, seqno in chunks:
            sent = self._forget_sent(label, source_id, seqno)
            if sent is not None:
                settled.append([source_id, seqno])
                _add(keys, sent)
        self._count(label, keys, settled)

    def settle(self, name: str, source_id: str, last_seqno: int) -> None:
        """Installation ``name``'s log holds ``source_id`` up to ``last_seqno`` (a session's
        answer, with nothing of the source in flight): the chunks sent there and never
        answered are in its log up to there (counted) and not beyond (forgotten: what is
        sent again is counted when it is acknowledged)."""
        label = self.label(name)
        sent = self.sent_chunks.pop((label, source_id), None)
        if not sent:
            return
        keys: dict[tuple[str, int], list[int]] = {}
        for seqno, chunk in sent.items():
            if seqno <= last_seqno:
                _add(keys, chunk)
        self._count(label, keys, [[source_id, seqno] for seqno in sent])

    def _forget_sent(self, name: str, source_id: str, seqno: int) -> Sent | None:
        chunks = self.sent_chunks.get((name, source_id))
        if chunks is None:
            return None
        sent = chunks.pop(seqno, None)
        if not chunks:
            del self.sent_chunks[(name, source_id)]
        return sent

    def _count(
        self, name: str, keys: dict[tuple[str, int], list[int]], settled: list[list[Any]]
    ) -> None:
        """Journal, then count in memory (where the publisher may see it)."""
        if not settled:
            return
        self._journal(
            {"i": name, "c": [[t, w, m, n] for (t, w), (m, n) in keys.items()], "a": settled}
        )
        counts = self._counts_of(name)
        for (topic, window), (messages, lines) in keys.items():
            counts.add(topic, window * 1000, messages, lines)

    # -- saving ---------------------------------------------------------------------------------
    def to_state(self) -> dict[str, Any]:
        """The totals to save with the positions (the next generation)."""
        oldest = window_start(int((time.time() - FORGET_AFTER_S) * 1000))
        return {
            "instance": self.instance,
            "generation": self.generation + 1,
            "counts": {
                label: [
                    [t, w, m, n]
                    for (t, w), (m, n) in sorted(counts.snapshot().items())
                    if w >= oldest
                ]
                for label, counts in self.counts.items()
            },
            # (a source whose session never opens again, deleted while the client was down,
            # leaves its chunks here until their window is as old as the counts kept)
            "in_flight": [
                [name, source_id, seqno, *chunk]
                for (name, source_id), chunks in self.sent_chunks.items()
                for seqno, chunk in chunks.items()
                if chunk[1] >= oldest
            ],
        }

    def saved(self, state: dict[str, Any]) -> None:
        """``state`` (from :meth:`to_state`) is in the state file: journal after it."""
        self.generation = int(state["generation"])
        self._start_journal()

    def close(self) -> None:
        self._close_journal()


def _dumps(doc: dict[str, Any]) -> bytes:
    try:
        return orjson.dumps(doc)
    except TypeError:
        # a source id of an earlier version with a path that is not UTF-8 in it (surrogate
        # escapes, which orjson refuses): written as \udcXX escapes, read back the same
        return json.dumps(doc, separators=(",", ":")).encode("ascii")


def _loads(line: bytes) -> Any:
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError:
        return json.loads(line)


def _add(keys: dict[tuple[str, int], list[int]], sent: Sent) -> None:
    topic, window, lines = sent
    total = keys.setdefault((topic, window), [0, 0])
    total[0] += 1
    total[1] += lines


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_key_row(row: Any) -> bool:
    """``[topic, window, messages, lines]``."""
    return (
        isinstance(row, list)
        and len(row) == 4
        and isinstance(row[0], str)
        and all(_is_count(v) for v in row[1:])
    )


def _is_sent_row(row: Any, *, with_name: bool = False) -> bool:
    """``[source id, seqno, topic, window, lines]``, with the installation first."""
    if with_name:
        if not isinstance(row, list) or not row or not isinstance(row[0], str):
            return False
        row = row[1:]
    return (
        isinstance(row, list)
        and len(row) == 5
        and isinstance(row[0], str)
        and _is_count(row[1])
        and isinstance(row[2], str)
        and _is_count(row[3])
        and _is_count(row[4])
    )


def _is_journal_line(doc: Any) -> bool:
    if not isinstance(doc, dict):
        return False
    if "s" in doc:
        return (
            isinstance(doc["s"], str)
            and isinstance(doc.get("k"), list)
            and all(_is_sent_row(row) for row in doc["k"])
        )
    settled = doc.get("a", [])
    return (
        isinstance(doc.get("i"), str)
        and isinstance(doc.get("c"), list)
        and all(_is_key_row(row) for row in doc["c"])
        and isinstance(settled, list)
        and all(
            isinstance(a, list) and len(a) == 2 and isinstance(a[0], str) and _is_count(a[1])
            for a in settled
        )
    )


def gateways_in_order(client: GatewayClient) -> list[str]:
    """The installation's gateways known to belong to it now (each said so since it last
    failed: one that comes back as another installation's is not written to), the one its
    data goes to now first."""
    confirmed = client.confirmed_servers
    current = client.current_server
    first = [current] if current in confirmed else []
    return [*first, *(url for url in confirmed if url != current)]


class FailoverAuditSink:
    """Writes an audit chunk to the first gateway of ``servers()`` that takes it.

    Trying the next gateway with the same chunk is safe: the gateways of one installation share
    one log, which answers a chunk it holds already as a duplicate (and the publisher then
    writes it again above it).  A token that may not write the audit log type is refused by
    every gateway alike, so that refusal ends the attempt at once.
    """

    def __init__(
        self,
        servers: Callable[[], Sequence[str]],
        *,
        auth_headers: Callable[[], dict[str, str]] | None = None,
        timeout_s: float = WRITE_TIMEOUT_S,
    ) -> None:
        self._servers = servers
        self._auth_headers = auth_headers
        self._timeout_s = timeout_s
        self._sinks: dict[str, HttpAuditSink] = {}
        self._lock = threading.Lock()
        self.last_server = ""
        """The gateway that took the last write."""

    def _sink(self, url: str) -> HttpAuditSink:
        with self._lock:
            sink = self._sinks.get(url)
            if sink is None:
                sink = HttpAuditSink(
                    url, auth_headers=self._auth_headers, timeout_s=self._timeout_s
                )
                self._sinks[url] = sink
            return sink

    def write(self, source_id: str, seqno: int, data: bytes) -> tuple[bool, int]:
        failures = []
        for url in self._servers():
            try:
                answer = self._sink(url).write(source_id, seqno, data)
            except AuditForbidden:
                raise
            except AuditWriteFailed as exc:
                failures.append(f"{url}: {exc}")
                continue
            self.last_server = url
            return answer
        raise AuditWriteFailed("no gateway took it: " + "; ".join(failures))


class PushAuditPublishers:
    """One started :class:`AuditPublisher` per installation, of the counts it acknowledged.

    The instance names are the state dir's (:meth:`PushAuditCounts.label`).
    """

    def __init__(
        self,
        counts: PushAuditCounts,
        installations: InstallationSet,
        clients: dict[str, GatewayClient],
        *,
        auth_headers: Callable[[], dict[str, str]] | None = None,
        interval_s: float | None = None,
    ) -> None:
        self.sinks: dict[str, FailoverAuditSink] = {}
        self.publishers: dict[str, AuditPublisher] = {}
        for member in installations.members:
            client = clients[member.name]
            sink = FailoverAuditSink(
                functools.partial(gateways_in_order, client), auth_headers=auth_headers
            )
            self.sinks[member.name] = sink
            self.publishers[member.name] = AuditPublisher(
                TIER,
                counts.label(member.name),
                counts.of(member.name),
                sink,
                interval_s=interval_from_env() if interval_s is None else interval_s,
                forget_after_s=FORGET_AFTER_S,
                # saved with the positions: a stop's last publish that fails is not a loss
                kept_for_next=f"the state dir {counts.path.parent}",
            )

    def start(self) -> PushAuditPublishers:
        for publisher in self.publishers.values():
            publisher.start()
        return self

    def stop(self, timeout_s: float) -> None:
        """Publish what is left of every installation at once, taking at most ``timeout_s``
        (each publisher says in one line what it could not publish)."""
        stoppers = [
            threading.Thread(
                target=publisher.stop,
                args=(timeout_s,),
                name=f"audit-stop-{name}",
                daemon=True,
            )
            for name, publisher in self.publishers.items()
        ]
        for stopper in stoppers:
            stopper.start()
        for stopper in stoppers:
            # each stop keeps to timeout_s itself; the margin is for starting its threads.
            # The sinks stay open: a last publish left to itself may still be using one.
            stopper.join(timeout_s + 1.0)
