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

A gateway too old to name its installation is taken as the user gave it, as by the other
commands (:class:`~delivery.installations.OneInstallation`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

import httpx

from delivery.installations import (
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
                refusal = self._judge(group, url, response)
                if refusal is not None:
                    raise MixedInstallations(refusal)

    def check(self, group: str, url: str, http: httpx.Client) -> str | None:
        """Before ``url`` of ``group`` is written to: why it may not be (it belongs to another
        installation; said once, at ERROR); None if it may (it belongs to its group, is too
        old to say, or cannot say now: its request then tells how it fails)."""
        key = (group, url)
        with self._lock:
            if key in self._refused:
                return self._refused[key]
            if key in self._checked:
                return None
        (response,) = ask_healthz([(http, url)], headers=self._token.headers())
        if response is None:
            return None
        return self._judge(group, url, response, say=True)

    def _judge(
        self, group: str, url: str, response: httpx.Response, *, say: bool = False
    ) -> str | None:
        key = (group, url)
        try:
            said = gateway_said(url, response)
        except NotAGateway:
            said = {}  # its requests say what answers there
        if said is None:
            return None  # a 5xx: asked again before its next request
        named = said.get("installation")
        if "installation" in said and not isinstance(named, str):
            return None  # its store does not answer: it cannot name it yet
        with self._lock:
            if key in self._refused or key in self._checked:
                return self._refused.get(key)
            refusal = None if named is None else self._conflict(group, url, named)
            if refusal is None:
                self._checked.add(key)
                if named is not None:
                    self._named.setdefault(group, (url, named))
                return None
            self._refused[key] = refusal
        if say:
            log.error("%s; nothing is written there", refusal)
        return refusal

    def _conflict(self, group: str, url: str, named: str) -> str | None:
        """Why ``url`` of ``group``, which names installation ``named``, is refused (None:
        it is not); under the lock."""
        first = self._named.get(group)
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


def _unnamed(specs: Sequence[InstallationSpec]) -> str | None:
    """The group's name when ``--server`` named none (one installation)."""
    return specs[0].name if len(specs) == 1 else None
