"""Which installation each ``--server`` group's gateways belong to (``GET /healthz``).

The URLs of one group are gateways of one installation, and two groups are two installations
(``push_client.installations``): the client fails over between groups and writes handovers
into the installation it moves to, so two groups of one log would write them into that one
log, and a URL of another installation in a group would take the group's data (and its
positions, sessions and audit) to a log it does not belong to.

At the start every URL is asked at once (:meth:`GatewayCheck.ask_all`: one ``/healthz`` each,
concurrently, within :data:`~delivery.installations.START_TIMEOUT_S`): a group whose gateways
name two installations, or two groups that name the same one, are refused with
:class:`~delivery.installations.MixedInstallations` (the command exits 2).  A URL that does not
answer then is asked when the client first reaches it (before its first request, or by a
probe): if it names another installation than its group (or the installation of another
group), nothing is written to it; it is said once, at ERROR, naming the URL and both
installations, and its requests fail there as if it were down (:class:`OtherInstallation`).

A gateway is asked again whenever it comes back after failing (:meth:`GatewayCheck.suspect`:
it refused connections, reset them, timed out, hung or answered a 5xx): a name moved by DNS or
a load balancer to another DC's log while it was down would otherwise take the group's data
there, and the seqnos the client holds for acknowledged would live in another log.  Until it
has said its installation again nothing is sent to it (:meth:`GatewayCheck.confirm`); in
steady state nothing is asked (a gateway that answers is not asked again).  A gateway refused
is asked again by the probes of failing gateways: once it names its group's installation
again (the name moved back), it is written to again.

A gateway too old to name its installation is taken as the user gave it, as by the other
commands (:class:`~delivery.installations.OneInstallation`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from delivery.installations import (
    HEALTH_PATH,
    START_TIMEOUT_S,
    MixedInstallations,
    NotAGateway,
    ask_healthz,
    gateway_said,
)
from push_client.installations import InstallationSpec
from push_client.token import BearerToken

log = logging.getLogger("logbroker.push")


class OtherInstallation(httpx.TransportError):
    """A request was not sent: its gateway belongs to another installation than its group
    (or to another group's), see the module docstring."""


class InstallationUnknown(httpx.TransportError):
    """A request was not sent: its gateway, not checked yet (or failing since), answers
    ``/healthz`` without naming its installation (its store does not answer)."""


class GatewayCheck:
    """The installation of every ``--server`` group, learnt from its gateways; thread-safe."""

    def __init__(self, specs: Sequence[InstallationSpec], token: BearerToken) -> None:
        self._specs = tuple(specs)
        self._token = token
        self._lock = threading.Lock()
        self._named: dict[str, tuple[str, str]] = {}
        """Per group: (URL, installation id) of its first gateway that named it."""
        self._checked: set[tuple[str, str]] = set()
        """(group, URL) of the gateways that belong to their group (or are too old to say)."""
        self._refused: dict[tuple[str, str], str] = {}
        """(group, URL) of the gateways of another installation: why."""
        self._said: dict[tuple[str, str], str] = {}
        """(group, URL): the installation it named when it was last found to belong to its
        group (a gateway may come back of another, see :meth:`suspect`)."""

    @property
    def refusals(self) -> list[str]:
        """Why each gateway refused so far may not be written to."""
        with self._lock:
            return list(self._refused.values())

    def refusal(self, group: str, url: str) -> str | None:
        """Why ``url`` of ``group`` may not be written to (None: it may, or is unchecked)."""
        with self._lock:
            return self._refused.get((group, url))

    def ask_all(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Ask every gateway its installation now, at once, and check the answers in the
        order given: raises :class:`MixedInstallations` for the first that is refused."""
        pairs = [(spec.name, url) for spec in self._specs for url in spec.servers]
        if not pairs:
            return
        with httpx.Client(headers=self._token.headers(), timeout=timeout_s) as http:
            answers = ask_healthz([(http, url) for _, url in pairs], timeout_s)
        for (group, url), response in zip(pairs, answers, strict=True):
            if response is not None:
                refusal = self._judge(group, url, response).refusal
                if refusal is not None:
                    raise MixedInstallations(refusal)

    def confirmed(self, group: str, url: str) -> bool:
        """Whether ``url`` of ``group`` was found to belong to its group (or to be too old to
        say) and has not failed since."""
        with self._lock:
            return (group, url) in self._checked

    def suspect(self, group: str, url: str) -> None:
        """``url`` of ``group`` failed (no connection, a reset, a timeout, a hang, a 5xx):
        it is asked its installation again before anything more is sent to it."""
        with self._lock:
            self._checked.discard((group, url))

    def confirm(
        self, group: str, url: str, http: httpx.Client, timeout_s: float = START_TIMEOUT_S
    ) -> httpx.Response | None:
        """Before anything is sent to ``url`` of ``group``: None if it may be (it belongs to
        its group or is too old to say; asked only if it is not known to, see
        :meth:`suspect`).  Raises :class:`OtherInstallation` if it belongs to another
        installation (said once, at ERROR), the ``httpx`` error of a ``/healthz`` that was
        not answered, or :class:`InstallationUnknown`; returns the answer of a ``/healthz``
        answered with a 5xx, 408 or 429 (that request's answer: the gateway cannot take it).
        Nothing is sent until it said."""
        key = (group, url)
        with self._lock:
            if key in self._refused:
                raise OtherInstallation(self._refused[key])
            if key in self._checked:
                return None
        response = http.get(url + HEALTH_PATH, headers=self._token.headers(), timeout=timeout_s)
        verdict = self._judge(group, url, response, say=True)
        if verdict.refusal is not None:
            raise OtherInstallation(verdict.refusal)
        if verdict.checked:
            return None
        if verdict.unanswered:
            return response
        raise InstallationUnknown(
            f"{url}{HEALTH_PATH} names no installation yet (its store does not answer): "
            "nothing is sent to it until it does"
        )

    def check(self, group: str, url: str, http: httpx.Client) -> str | None:
        """For a probe that found ``url`` of ``group`` answering: why it may not be written
        to (it belongs to another installation; said once, at ERROR); None if it may (it
        belongs to its group, is too old to say, or cannot say now: :meth:`confirm` asks
        before a request).  A gateway refused before is asked again: once it names its
        group's installation again, it is written to again."""
        key = (group, url)
        with self._lock:
            if key in self._checked:
                return None
            refused_before = self._refused.get(key)
        (response,) = ask_healthz([(http, url)], headers=self._token.headers())
        if response is None:
            return refused_before
        verdict = self._judge(group, url, response, say=True, again=refused_before is not None)
        if verdict.refusal is None and refused_before is not None:
            if verdict.checked:
                log.warning(
                    "%s belongs to installation %s of %s again: written to again",
                    url,
                    verdict.named or "(unnamed)",
                    group,
                )
                return None
            return refused_before
        return verdict.refusal

    def _judge(
        self,
        group: str,
        url: str,
        response: httpx.Response,
        *,
        say: bool = False,
        again: bool = False,
    ) -> _Verdict:
        """Judge ``response``, ``url``'s answer to ``/healthz``; ``again``: a refusal of it
        before is judged anew (lifted if it names its group's installation now)."""
        key = (group, url)
        try:
            said = gateway_said(url, response)
        except NotAGateway:
            said = {}  # its requests say what answers there
        if said is None:
            return _Verdict(unanswered=True)  # a 5xx: asked again before its next request
        named = said.get("installation")
        if "installation" in said and not isinstance(named, str):
            return _Verdict()  # its store does not answer: it cannot name it yet
        with self._lock:
            previous = self._refused.pop(key, None) if again else None
            if key in self._refused:
                return _Verdict(refusal=self._refused[key])
            refusal = None if named is None else self._conflict(group, url, named)
            if refusal is None:
                self._checked.add(key)
                if named is not None:
                    self._named.setdefault(group, (url, named))
                    self._said[key] = named
                return _Verdict(checked=True, named=named)
            self._checked.discard(key)
            self._refused[key] = refusal
        if say and refusal != previous:  # a probe finding it still refused says nothing new
            log.error("%s; nothing is written there", refusal)
        return _Verdict(refusal=refusal)

    def _conflict(self, group: str, url: str, named: str) -> str | None:
        """Why ``url`` of ``group``, which names installation ``named``, is refused (None:
        it is not); under the lock."""
        first = self._named.get(group)
        before = self._said.get((group, url))
        if before is not None and before != named:
            return (
                f"{url} belongs to installation {named} now, and belonged to {before} "
                "before: it reaches another log than it did (moved while it did not answer?), "
                "which holds none of what was acknowledged there"
            )
        if first is not None and first[1] != named:
            return (
                f"{url} belongs to installation {named}, {first[0]} to {first[1]}: the URLs "
                f"of --server {group}=... must be gateways of one installation"
                if group != _unnamed(self._specs)
                else f"{url} belongs to installation {named}, {first[0]} to {first[1]}: the "
                "URLs of --server must be gateways of one installation"
            )
        for other, (other_url, other_named) in self._named.items():
            if other != group and other_named == named:
                return (
                    f"{url} of {group} belongs to installation {named}, as {other_url} of "
                    f"{other} does: --server groups must be separate installations (failing "
                    "over between them would write handovers into one log)"
                )
        return None


@dataclass(frozen=True)
class _Verdict:
    """What a gateway's ``/healthz`` said of it (see :meth:`GatewayCheck._judge`)."""

    checked: bool = False
    """It belongs to its group (or is too old to say)."""
    refusal: str | None = None
    """Why nothing is written to it (another installation)."""
    unanswered: bool = False
    """A 5xx, 408 or 429: it cannot say now."""
    named: str | None = None
    """The installation it named, if checked and it named one."""


def _unnamed(specs: Sequence[InstallationSpec]) -> str | None:
    """The group's name when ``--server`` named none (one installation)."""
    return specs[0].name if len(specs) == 1 else None
