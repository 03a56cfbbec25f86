"""Which installation a gateway belongs to: the gateways of one ``--server`` must share one.

A gateway names its installation (the id of the log it serves) in ``/healthz``'s
``installation``.  The URLs of one ``--server URL[,URL...]`` are gateways of one installation:
a request one of them cannot answer goes to the next, and an offset, a position or a change
asked of one is meant for that one log.  A URL of another installation in the list, or a URL
that reaches another installation after an outage (a load balancer or a name moved to another
DC), would carry them into a log they do not belong to; :class:`OneInstallation` refuses it
with :class:`MixedInstallations` before anything else is asked of it.

A command given several URLs asks every one at its start, at once (:func:`ask_every_gateway`:
one ``/healthz`` each, concurrently, within :data:`START_TIMEOUT_S`), so that a mistyped URL
of another installation is refused then, not only once the gateways before it in the list
failed.  A gateway that does not answer then is checked when a request first reaches it.

Every gateway answers ``/healthz`` with 200 and a JSON object whose ``status`` is ``"ok"``;
one older than ``installation`` answers so without it, and its URLs are taken as the user
gave them.  Any other answer (a 404 or 403 of a proxy with no gateway behind it, a page that
is no gateway's JSON) comes from no gateway: with several URLs, :class:`NotAGateway`, naming
the URL and what it answered, before anything else is asked of it (a lone URL has no other
to be mixed with; its own requests say what answers there).  A 5xx, 408 or 429 is an
answer of a moment (a gateway starting or stopping, a balancer without one behind it): the
URL is asked again later, as one that did not answer.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from log_store.errors import BadRequest

_log = logging.getLogger("delivery")

HEALTH_PATH = "/healthz"
START_TIMEOUT_S = 2.0
"""How long :func:`ask_every_gateway` waits for each gateway: one slower than that is taken
as down at the start and checked when first reached."""


class MixedInstallations(BadRequest):
    """A URL of ``--server`` reaches a gateway of another installation than the gateways asked
    before (its ``/healthz`` names another ``installation`` id): nothing else is asked of it."""


class NotAGateway(BadRequest):
    """A URL of ``--server`` answers ``/healthz`` as no logbroker gateway does (see the
    module docstring): nothing else is asked of it."""


_ASK_LATER = frozenset({408, 429})
"""Statuses of ``/healthz`` below 500 that a moment explains (a timeout, a rate limit of a
proxy): the URL is asked again later, as for a 5xx."""


def gateway_said(url: str, response: httpx.Response) -> dict[str, Any] | None:
    """What the gateway at ``url`` says of itself in ``response``, its ``/healthz`` answer:
    None if it cannot say now (a 5xx, 408 or 429: ask again later); raises
    :class:`NotAGateway` for an answer no gateway gives (see the module docstring)."""
    status = response.status_code
    if status >= 500 or status in _ASK_LATER:
        return None
    if not 200 <= status < 300:
        raise NotAGateway(
            f"{url} answered {status} to GET {HEALTH_PATH}, as no logbroker gateway does: "
            "not a gateway's URL (a wrong one, or a proxy with no gateway behind it)"
        )
    try:
        said = response.json()
    except ValueError:
        said = None
    if not isinstance(said, dict) or said.get("status") != "ok":
        shown = response.text[:80].strip() or "an empty body"
        raise NotAGateway(
            f"{url} answered {status} to GET {HEALTH_PATH} with {shown!r}, not a logbroker "
            "gateway's JSON: not a gateway's URL (a wrong one, or a proxy or a page in front "
            "of none)"
        )
    return said


class OneInstallation:
    """The installation the gateways of one ``--server`` belong to, learnt from the first that
    names it; ``why`` ends the refusal of another (what would go wrong there).  ``known``:
    (URL, installation id) learnt before (by the driver of a load whose tasks ask anew)."""

    def __init__(self, why: str, known: tuple[str, str] | None = None) -> None:
        self._why = why
        self._first = known
        """(URL, installation id) of the first gateway that named its installation."""
        self._said_unnamed = False

    @property
    def known(self) -> tuple[str, str] | None:
        """(URL, installation id) of the first gateway that named its installation, if any."""
        return self._first

    def check(self, url: str, response: httpx.Response, *, several: bool) -> str | None:
        """Check ``response``, ``url``'s answer to ``/healthz``: None if ``url`` belongs to
        this installation (or is a gateway too old to say); the failure to say if it cannot
        name it now (its store does not answer, or a 5xx: ask again later); raises
        :class:`MixedInstallations` if it names another, :class:`NotAGateway` if no gateway
        answered, when ``url`` is one of several (alone, it has no other to be mixed with: its
        own requests say what answers there).  ``several``: an older gateway is then said to
        be taken unchecked, once."""
        try:
            healthz = gateway_said(url, response)
        except NotAGateway:
            if several:
                raise
            return None
        if healthz is None:
            return f"answered {response.status_code} to {HEALTH_PATH}"
        if "installation" not in healthz:
            # a gateway too old to name it: the URLs are taken as the user gave them
            if several and not self._said_unnamed:
                self._said_unnamed = True
                _log.warning(
                    "%s does not name its installation (an older gateway): the --server URLs "
                    "are taken to be one installation's unchecked",
                    url,
                )
            return None
        named = healthz["installation"]
        if not isinstance(named, str):
            return "cannot name its installation yet (its store does not answer)"
        if self._first is None:
            self._first = (url, named)
            return None
        first_url, first = self._first
        if named == first:
            return None
        if first_url == url:
            raise MixedInstallations(
                f"{url} belongs to installation {named} now, and belonged to {first} before: "
                f"--server reaches another installation than it did ({self._why})"
            )
        raise MixedInstallations(
            f"{url} belongs to installation {named}, {first_url} to {first}: the URLs "
            f"of --server must be gateways of one installation ({self._why})"
        )


def ask_healthz(
    gateways: Sequence[tuple[httpx.Client, str]],
    timeout_s: float = START_TIMEOUT_S,
    headers: Mapping[str, str] | None = None,
) -> list[httpx.Response | None]:
    """``GET /healthz`` of each (client, URL: "" for a client with the gateway's base URL),
    concurrently, each within ``timeout_s``; None for one that did not answer (down, or no
    http URL: its first request says why)."""

    def ask(gateway: tuple[httpx.Client, str]) -> httpx.Response | None:
        client, url = gateway
        try:
            return client.get(url + HEALTH_PATH, headers=headers, timeout=timeout_s)
        except httpx.HTTPError:
            return None

    if len(gateways) == 1:
        return [ask(gateways[0])]
    with ThreadPoolExecutor(max_workers=min(len(gateways), 16)) as pool:
        return list(pool.map(ask, gateways))


def ask_every_gateway(
    installation: OneInstallation,
    gateways: Sequence[tuple[str, httpx.Client]],
    timeout_s: float = START_TIMEOUT_S,
) -> list[bool]:
    """Ask each of ``gateways`` (its URL and client) its installation at once, concurrently,
    each within ``timeout_s``, and check the answers in the list's order (see the module
    docstring): raises :class:`MixedInstallations` for the first that names another than
    one before it.  Returns, for each, whether it was checked; one that did not answer, or
    cannot name its installation yet, is to be checked when a request first reaches it."""

    answers = ask_healthz([(client, "") for _, client in gateways], timeout_s)
    checked = []
    for (url, _), response in zip(gateways, answers, strict=True):
        checked.append(
            response is not None and installation.check(url, response, several=True) is None
        )
    return checked


def check_one_installation(
    urls: Sequence[str], *, why: str, token: str | None = None
) -> tuple[str, str] | None:
    """Ask each of ``urls`` its installation now, at once (:func:`ask_every_gateway`), for a
    list whose own requests do not check it: :class:`MixedInstallations` if two name
    different ones (one that does not answer now is not checked: check it with
    :func:`ask_one_gateway` when it is first reached).  Returns (URL, installation id) of
    the first that named it, if any."""
    if len(urls) < 2:
        return None
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    clients = [httpx.Client(base_url=url, headers=headers) for url in urls]
    installation = OneInstallation(why)
    try:
        ask_every_gateway(installation, list(zip(urls, clients, strict=True)))
    finally:
        for client in clients:
            client.close()
    return installation.known


def ask_one_gateway(
    installation: OneInstallation,
    url: str,
    *,
    token: str | None = None,
    timeout_s: float = START_TIMEOUT_S,
) -> str | None:
    """Ask ``url`` its installation now and check it (:meth:`OneInstallation.check`, as one
    of several), for a list whose own requests do not check it: None if it belongs to
    ``installation`` (or is a gateway too old to say); the failure to say if it did not
    answer or cannot say now; raises :class:`MixedInstallations` or :class:`NotAGateway`."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        response = httpx.get(url + HEALTH_PATH, headers=headers, timeout=timeout_s)
    except httpx.HTTPError as exc:
        return f"did not answer {HEALTH_PATH}: {type(exc).__name__}: {exc}"
    return installation.check(url, response, several=True)
