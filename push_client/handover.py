"""Where one source's data lies across installations, and what its next session must ask.

With several installations (``push_client.installations``) a file's bytes end up split between
them: each range in exactly one.  The client keeps, per source:

- ``frontier``: every byte below it was acknowledged by some installation, or is *in doubt*;
- ``doubts``: ranges sent to an installation that went down before answering.  They may or may
  not be written there, so they are sent nowhere else: once that installation is up again, a
  session there tells how far it got (``last_seqno``) and the rest of the range is sent to it;
- ``installation``: where the source's newest data went.

A session at an installation with no doubt of the source asks ``acked_elsewhere = frontier``:
the gateway records the handover (a ``handover`` record at that seqno) and the client goes on
from the frontier, so nothing acknowledged elsewhere is sent again.  A session at an
installation holding a doubt asks nothing and resends what did not land; a doubt whose
installation is up is settled before the source goes on at the preferred installation.

Positions only another installation knows (the client's state was lost, or it crashed while
writing elsewhere) are asked for first (a *census*); an installation that is down is waited
for until ``position_wait_s`` has passed, then the client goes on from the highest position it
learned: lines the missing installation holds beyond it may then be written twice, never lost.
The installation a source last wrote to is asked so at every start, a clean stop's or not: a
state restored from a snapshot (or a backup) is clean and older than that installation's log.
The other installations that are up are asked too before the source's first session
(``asked_at_start``), not waited for: the source may have moved to one of them after the
snapshot.

Such a double write is not silent.  The first answer of an installation in a run is a plain
one (no ``acked_elsewhere``), checked against the point from which the source went to another
installation (its *reference*): when the source left it, or, for one not asked yet in this
run, where the source's data went first.  An answer above that point is an *overlap*: the
bytes between are in both installations (:class:`Overlap`, logged, counted and shown by the
caller).  When it holds more than every other installation was sent, the source goes on there
from its answer, so nothing beyond is written twice.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

log = logging.getLogger("logbroker.push")


@dataclass(frozen=True, order=True)
class Doubt:
    """Bytes ``[start, end)`` sent to ``installation``, which went down before it answered."""

    start: int
    end: int
    installation: str

    def as_list(self) -> list[str | int]:
        return [self.installation, self.start, self.end]

    @classmethod
    def from_list(cls, raw: list[str | int]) -> Doubt:
        name, start, end = raw
        return cls(int(start), int(end), str(name))


@dataclass(frozen=True)
class Overlap:
    """Bytes ``[start, end)`` of a source that are in ``installation`` and in ``elsewhere``:
    ``installation`` answered a last seqno above ``start``, the point from which the source
    was sent to ``elsewhere`` (its positions were older than ``installation``'s log)."""

    start: int
    end: int
    installation: str
    elsewhere: str

    @property
    def size(self) -> int:
        return self.end - self.start

    def as_list(self) -> list[str | int]:
        return [self.installation, self.elsewhere, self.start, self.end]


@dataclass(frozen=True)
class Step:
    """What a session's answer means for the source.

    ``reopen``: open another session before sending (a handover is needed first); otherwise
    send from ``resume_at``, up to ``until`` when settling a doubt (None: follow the file).
    """

    resume_at: int = 0
    until: int | None = None
    reopen: bool = False
    overlap: Overlap | None = None
    """Bytes the answering installation holds that went elsewhere too (see :class:`Overlap`)."""


@dataclass
class SourceHandover:
    """One source's cross-installation position (see the module docstring)."""

    installation: str = ""
    frontier: int = 0
    doubts: list[Doubt] = field(default_factory=list)
    census: set[str] = field(default_factory=set)
    """Installations whose position of this source must be learned before sending."""
    census_deadline: float = 0.0
    asked_at_start: set[str] = field(default_factory=set)
    """Installations to ask how far they hold the source before its first session, if they
    are up, not waited for when down: one of them may hold more than the state says (a state
    restored from a snapshot, and the source moved there after it)."""
    resend_end: int | None = None
    """While settling a doubt: the end of the range being resent."""
    _handover_to: tuple[str, int] | None = None
    """A handover a step asked for: (installation, seqno)."""
    _failed: list[tuple[int, int, bool]] = field(default_factory=list)
    _failed_at: str = ""
    overlaps: list[Overlap] = field(default_factory=list)
    """Ranges found in two installations in this run (see the module docstring)."""
    _answered: set[str] = field(default_factory=set)
    """Installations that said how far they hold the source in this run."""
    _first: tuple[int, str] | None = None
    """Where the source's data went first in this run: (seqno, installation)."""
    _left: dict[str, tuple[int, str]] = field(default_factory=dict)
    """Per installation the source left in this run: (seqno, the installation it went to)."""

    # -- what to ask ----------------------------------------------------------------------------
    def census_pending(self, now: float) -> bool:
        return bool(self.census) and now < self.census_deadline

    def census_missed(self) -> list[str]:
        """Installations that never answered the census (the deadline passed)."""
        return sorted(self.census)

    def target(self, current: str, is_up: Callable[[str], bool]) -> str:
        """The installation of the next session: a doubt's, when it is up, else ``current``."""
        for doubt in sorted(self.doubts):
            if is_up(doubt.installation):
                return doubt.installation
        return current

    def session_fields(self, installation: str, multi: bool) -> dict[str, bool | int]:
        """Extra fields of the source's session request at ``installation``."""
        fields: dict[str, bool | int] = {"fence": True}
        if not multi:
            return fields
        if self._handover_to is not None and self._handover_to[0] == installation:
            fields["acked_elsewhere"] = self._handover_to[1]
        elif (
            self.frontier > 0
            and not any(d.installation == installation for d in self.doubts)
            and self._reference(installation) is None
        ):
            fields["acked_elsewhere"] = self.frontier
        return fields

    def _reference(self, installation: str) -> tuple[int, str] | None:
        """The point from which ``installation`` must hold nothing of the source, and where
        the source went from there; None if nothing of it went elsewhere meanwhile."""
        left = self._left.get(installation)
        if left is not None:
            return left
        if installation in self._answered or self._first is None:
            return None
        return self._first if self._first[1] != installation else None

    def _answer(self, installation: str, last_seqno: int) -> Overlap | None:
        """``installation`` holds the source up to ``last_seqno``: an overlap, if it holds
        bytes the source sent elsewhere from its reference point on."""
        reference = self._reference(installation)
        self._answered.add(installation)
        self._left.pop(installation, None)
        if reference is None or last_seqno <= reference[0]:
            return None
        start, elsewhere = reference
        end = min(last_seqno, max(self.frontier, start))
        if end <= start:
            return None
        overlap = Overlap(start, end, installation, elsewhere)
        self.overlaps.append(overlap)
        return overlap

    def _went_to(self, installation: str, seqno: int) -> None:
        """The source's data goes to ``installation`` from ``seqno`` on."""
        if self._first is None:
            self._first = (seqno, installation)
        before = self.installation
        if before and before != installation:
            self._left[before] = (seqno, installation)

    # -- answers ----------------------------------------------------------------------------------
    def to_ask(self, target: str, is_up: Callable[[str], bool]) -> str | None:
        """An installation of ``asked_at_start`` to ask before a session at ``target`` (whose
        answer is its own); None if none is up."""
        self.asked_at_start.discard(target)
        return next((n for n in sorted(self.asked_at_start) if is_up(n)), None)

    def on_census(self, installation: str, last_seqno: int) -> Overlap | None:
        self.census.discard(installation)
        self.asked_at_start.discard(installation)
        overlap = self._answer(installation, last_seqno)
        if last_seqno > self.frontier:
            self.frontier = last_seqno
            self.installation = installation
        return overlap

    def on_session(self, installation: str, last_seqno: int, multi: bool) -> Step:
        """The installation holds the source up to ``last_seqno``: where to go on from."""
        self._handover_to = None
        self.resend_end = None
        if not multi:
            # One installation: its last seqno is the truth, also when it is below ours.
            self.installation = installation
            self.frontier = last_seqno
            return Step(resume_at=last_seqno)
        # A session there says what a census would (it is never sent acked_elsewhere while
        # its position is not known, see session_fields).
        self.census.discard(installation)
        self.asked_at_start.discard(installation)
        overlap = self._answer(installation, last_seqno)
        step = self._step(installation, last_seqno)
        return step if overlap is None else dataclasses.replace(step, overlap=overlap)

    def _step(self, installation: str, last_seqno: int) -> Step:
        mine = sorted(d for d in self.doubts if d.installation == installation)
        landed = [d for d in mine if d.end <= last_seqno]
        for doubt in landed:
            self.doubts.remove(doubt)
        pending = [d for d in mine if d.end > last_seqno]
        if pending:
            doubt = pending[0]
            if last_seqno < doubt.start:
                # It holds less than was acknowledged before the doubt: that data is lost
                # there, and sending it here again could duplicate what went elsewhere.
                log.error(
                    "installation %s holds the source up to %d, below the %d it acknowledged; "
                    "the bytes between are not in its log",
                    installation,
                    last_seqno,
                    doubt.start,
                )
                self._handover_to = (installation, doubt.start)
                return Step(reopen=True)
            self.resend_end = doubt.end
            return Step(resume_at=last_seqno, until=doubt.end)
        if last_seqno < self.frontier:
            self._handover_to = (installation, self.frontier)
            return Step(reopen=True)
        self._went_to(installation, self.frontier)
        self.installation = installation
        self.frontier = last_seqno
        return Step(resume_at=last_seqno)

    def resend_done(self, installation: str, acked: int) -> None:
        """A doubt's missing part was acknowledged by its installation: it is settled."""
        self.doubts = [d for d in self.doubts if d.installation != installation or d.end > acked]
        self.resend_end = None

    def on_acked(self, acked: int) -> None:
        if self.resend_end is None and acked > self.frontier:
            self.frontier = acked

    # -- failures -------------------------------------------------------------------------------
    def on_failed(self, installation: str, start: int, end: int, maybe_written: bool) -> None:
        """A request of ``[start, end)`` to ``installation`` failed with it going down."""
        self._failed.append((start, end, maybe_written))
        self._failed_at = installation

    def settle_failures(self) -> Doubt | None:
        """Once no request of the source is in flight: the failed ranges as one doubt, if any
        of them may have been written (a later request may only land after an earlier one,
        so one doubt from the first failed byte to the last covers every case)."""
        failed, self._failed = self._failed, []
        if not failed or not any(maybe for _, _, maybe in failed):
            return None
        doubt = Doubt(min(s for s, _, _ in failed), max(e for _, e, _ in failed), self._failed_at)
        self.add_doubt(doubt)
        return doubt

    @property
    def has_failures(self) -> bool:
        return bool(self._failed)

    def add_doubt(self, doubt: Doubt) -> None:
        """Record ``doubt``, merged with the installation's overlapping or adjacent ones."""
        start, end = doubt.start, doubt.end
        kept: list[Doubt] = []
        for other in self.doubts:
            if (
                other.installation == doubt.installation
                and other.start <= end
                and start <= other.end
            ):
                start, end = min(start, other.start), max(end, other.end)
            else:
                kept.append(other)
        kept.append(Doubt(start, end, doubt.installation))
        self.doubts = sorted(kept)
        self.frontier = max(self.frontier, end)

    def forget_doubts(self, installations: Iterable[str]) -> list[Doubt]:
        """Drop the doubts at ``installations`` (no longer configured); return them."""
        names = set(installations)
        gone = [d for d in self.doubts if d.installation in names]
        self.doubts = [d for d in self.doubts if d.installation not in names]
        return gone

    @property
    def doubt_bytes(self) -> int:
        return sum(d.end - d.start for d in self.doubts)
