"""Which gateway owns a source's partition, so that its sections can go there directly.

With several gateways over one Kafka cluster, a gateway that receives a section of a partition
it does not own forwards it to the owner: a second HTTP hop and a second gateway's CPU.  With
``direct_to_owner`` the client asks the gateways who owns each partition of its topics
(``GET /v1/owners?log_type=T``) and sends each source's sections to its owner's URL, batching
the sources of one owner.  The map is only a hint:

- a source whose owner is unknown, not allowed, or failed recently goes to the configured
  gateways as before (any gateway accepts any write);
- an owner that fails a request (unreachable, 5xx, any refusal) is *shunned* for
  ``refresh_s`` and the map is refreshed at once; the request goes to the configured gateways;
- ownership moves when gateways join or leave: a section sent to a former owner is forwarded
  by it, and its answer says so (``Logbroker-Forwarded: N``), which has the map refreshed at
  once (besides every ``refresh_s``); a stale entry costs the forward that direct sending
  saves, never a wrong write.

Exactly-once does not depend on where a request goes: every gateway deduplicates by seqno and
``prev_seqno``, and a request resent elsewhere is answered ``duplicate`` for what landed.

**Token safety.**  The owners' URLs come from the gateways (each announces its
``advertised_url``).  The bearer token goes to an owner URL only if its ``scheme://host[:port]``
matches one of the operator's ``direct_to_owner`` globs, has no user info, query or fragment,
and is ``https`` whenever a configured gateway of the installation is ``https`` (no downgrade).
"""

from __future__ import annotations

import fnmatch
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

OWNERS_PATH = "/v1/owners"
FORWARDED_HEADER = "Logbroker-Forwarded"
"""On a write answer: how many sections the gateway wrote through another gateway."""


@dataclass(frozen=True)
class OwnerPolicy:
    """Which owner URLs the client may send its token to."""

    allowed: tuple[str, ...]
    """Globs over ``scheme://host[:port]`` (lower case), e.g. ``https://gw*.example.org``."""
    https_only: bool
    """A configured gateway is ``https``: never send the token over plain ``http``."""

    @classmethod
    def for_servers(cls, allowed: Iterable[str], servers: Iterable[str]) -> OwnerPolicy:
        https = any(s.lower().startswith("https://") for s in servers)
        return cls(tuple(g.lower().rstrip("/") for g in allowed), https)

    def origin_of(self, url: object) -> str | None:
        """``url`` as an origin (``scheme://host[:port]``) if the token may go there, else None."""
        if not isinstance(url, str) or len(url) > 2048:
            return None
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 - raises ValueError for a port that is not a number
        except ValueError:
            return None
        scheme = parts.scheme.lower()
        if scheme not in ("http", "https") or not parts.hostname:
            return None
        if parts.username is not None or parts.password is not None:
            return None
        if parts.query or parts.fragment or parts.path not in ("", "/"):
            return None
        if self.https_only and scheme != "https":
            return None
        origin = f"{scheme}://{parts.netloc.lower()}"
        if not any(fnmatch.fnmatchcase(origin, glob) for glob in self.allowed):
            return None
        return origin


@dataclass
class _Topic:
    owners: dict[int, str] = field(default_factory=dict)
    fetched_at: float = float("-inf")


class OwnerRoutes:
    """The owners' map of one installation's topics; thread-safe (senders report failures)."""

    def __init__(self, policy: OwnerPolicy, *, refresh_s: float) -> None:
        self.policy = policy
        self.refresh_s = refresh_s
        self._lock = threading.Lock()
        self._by_log_type: dict[str, _Topic] = {}
        self._topic_of: dict[str, str] = {}
        self._shunned: dict[str, float] = {}
        self.refreshing = False
        self.refreshes = 0
        self.untrusted = 0
        """Owner URLs the policy refused (counted once per answer)."""

    def owner(self, log_type: str, topic: str, partition: int, now: float) -> str | None:
        """The URL to send a section of ``topic``'s ``partition`` to, or None (the gateways)."""
        with self._lock:
            known = self._by_log_type.get(log_type)
            if known is None or self._topic_of.get(log_type) != topic:
                return None
            url = known.owners.get(partition)
            if url is None or self._shunned.get(url, 0.0) > now:
                return None
            return url

    def due(self, log_types: Iterable[str], now: float) -> list[str]:
        """The log types whose map is older than ``refresh_s`` (or was never fetched)."""
        with self._lock:
            if self.refreshing:
                return []
            due = []
            for log_type in log_types:
                known = self._by_log_type.setdefault(log_type, _Topic())
                if now - known.fetched_at >= self.refresh_s:
                    due.append(log_type)
            return due

    def on_answer(self, log_type: str, answer: Any, now: float) -> None:
        """Apply a ``GET /v1/owners`` answer (None: it failed; try again after ``refresh_s``)."""
        owners: dict[int, str] = {}
        topic = ""
        untrusted = 0
        if isinstance(answer, dict):
            topic = str(answer.get("topic", ""))
            for item in answer.get("partitions", ()):
                if not isinstance(item, dict) or not isinstance(item.get("partition"), int):
                    continue
                if item.get("owner") is None:
                    continue
                origin = self.policy.origin_of(item["owner"])
                if origin is None:
                    untrusted += 1
                    continue
                owners[item["partition"]] = origin
        with self._lock:
            known = self._by_log_type.setdefault(log_type, _Topic())
            known.fetched_at = now
            if answer is not None:
                known.owners = owners
                self._topic_of[log_type] = topic
            self.untrusted += untrusted
            self.refreshes += 1

    def on_failed(self, url: str, now: float) -> None:
        """A request to owner ``url`` failed: shun it for ``refresh_s`` and refresh every map."""
        with self._lock:
            self._shunned[url] = now + self.refresh_s
            for known in self._by_log_type.values():
                known.fetched_at = float("-inf")
            for gone in [u for u, until in self._shunned.items() if until <= now]:
                del self._shunned[gone]

    def on_moved(self) -> None:
        """An owner answered, but wrote some sections through another gateway (their
        partitions moved since the map was fetched): ask for every map again at once."""
        with self._lock:
            for known in self._by_log_type.values():
                known.fetched_at = float("-inf")

    def known(self) -> int:
        """Partitions whose owner may be written to directly (for the metrics)."""
        with self._lock:
            return sum(len(t.owners) for t in self._by_log_type.values())

    def owners(self) -> dict[str, dict[int, str]]:
        """Per topic, the owners known now (for status and tests)."""
        with self._lock:
            return {
                self._topic_of.get(lt, lt): dict(t.owners) for lt, t in self._by_log_type.items()
            }
