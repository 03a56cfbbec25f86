"""Bearer tokens: who a request's token belongs to and which names its grant covers.

With no tokens configured every request is allowed (the gateway then listens on loopback only,
see :class:`~ingest_api.settings.GatewaySettings`).  With tokens, a missing or unknown token is
401.  Which route needs which grant is declared with the route (:mod:`ingest_api.access`).

A presented token is looked up by its SHA-256 digest, so the lookup costs the same whatever
the token and however many tokens are configured.  Glob decisions ("may this token write log
type X") are cached per token; the cache holds at most ``auth_cache_entries`` decisions and
is emptied when full (counted by ``logbroker_auth_cache_resets_total``), so a client sending
ever new names cannot grow it.
"""

from __future__ import annotations

import fnmatch
import hashlib
from collections.abc import Callable, Mapping

from starlette.requests import HTTPConnection

from ingest_api.errors import ApiError
from ingest_api.settings import TokenGrant

_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="logbroker"'}
DEFAULT_CACHE_ENTRIES = 100_000


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


def unauthorized(reason: str) -> ApiError:
    return ApiError(401, "unauthorized", reason, headers=_CHALLENGE)


def forbidden(reason: str) -> ApiError:
    return ApiError(403, "forbidden", reason)


class _DecisionCache:
    """``(owner, kind, name) -> allowed``, at most ``capacity`` entries."""

    def __init__(self, capacity: int, on_reset: Callable[[], None]) -> None:
        self.capacity = capacity
        self._on_reset = on_reset
        self._decisions: dict[tuple[str, str, str], bool] = {}

    def __len__(self) -> int:
        return len(self._decisions)

    def decide(self, key: tuple[str, str, str], globs: tuple[str, ...]) -> bool:
        allowed = self._decisions.get(key)
        if allowed is None:
            allowed = any(fnmatch.fnmatchcase(key[2], g) for g in globs)
            if len(self._decisions) >= self.capacity:
                self._decisions = {}
                self._on_reset()
            self._decisions[key] = allowed
        return allowed


def _covers_prefix(glob: str, prefix: str) -> bool:
    """Whether ``glob`` matches every name that starts with ``prefix`` (judged safely: a glob
    that would need reasoning about ``?`` or ``[...]`` covers no prefix)."""
    if not glob.endswith("*"):
        return False
    fixed = glob.rstrip("*")
    return not any(c in fixed for c in "*?[") and prefix.startswith(fixed)


class Authorizer:
    """Finds a request's grant and answers "may this grant write X / read Y / replicate Z"."""

    def __init__(
        self,
        tokens: Mapping[str, TokenGrant],
        *,
        peer_token: str | None = None,
        cache_entries: int = DEFAULT_CACHE_ENTRIES,
        on_cache_reset: Callable[[], None] = lambda: None,
    ) -> None:
        self._by_digest = {_digest(token): grant for token, grant in tokens.items()}
        # Tokens of one name grant the same (settings refuse anything else): one grant a name.
        self._by_owner = {grant.owner: grant for grant in tokens.values()}
        self._peer_digest = _digest(peer_token) if peer_token else None
        self._cache = _DecisionCache(cache_entries, on_cache_reset)

    @property
    def enabled(self) -> bool:
        return bool(self._by_digest)

    @property
    def cached_decisions(self) -> int:
        return len(self._cache)

    def grant(self, conn: HTTPConnection) -> TokenGrant | None:
        """The grant of the request's bearer token; ``None`` when auth is off.

        Raises 401 if auth is on and the token is missing or unknown.
        """
        if not self._by_digest:
            return None
        header = conn.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise unauthorized("missing 'Authorization: Bearer <token>'")
        # Looked up by digest: how long the lookup takes says nothing about a stored token,
        # since a client cannot choose the digest of what it sends.
        grant = self._by_digest.get(_digest(token))
        if grant is None:
            raise unauthorized("unknown bearer token")
        return grant

    def grant_of(self, owner: str) -> TokenGrant | None:
        """The grant of the tokens named ``owner`` (the holder of a group or subscription);
        ``None`` when no configured token has that owner any more."""
        return self._by_owner.get(owner)

    def require_peer(self, conn: HTTPConnection) -> None:
        """401 unless the request carries the gateways' ``peer_token`` (no client token will
        do).  Without a peer token configured (auth is off then) every request passes."""
        if self._peer_digest is None:
            if self._by_digest:
                raise unauthorized("internal calls need a peer_token, and none is configured")
            return
        scheme, _, token = conn.headers.get("authorization", "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or _digest(token) != self._peer_digest:
            raise unauthorized("internal calls need the peer token")

    def _may(self, grant: TokenGrant | None, kind: str, name: str, globs: tuple[str, ...]) -> bool:
        if grant is None:
            return not self._by_digest
        if grant.admin:
            return True
        return self._cache.decide((grant.owner, kind, name), globs)

    def may_write(self, grant: TokenGrant | None, log_type: str) -> bool:
        return self._may(grant, "write", log_type, grant.write_log_types if grant else ())

    def may_write_source(self, grant: TokenGrant | None, source_id: str) -> bool:
        """Whether ``grant`` may write the source ``source_id`` (of a log type it may write):
        any source unless the token has ``sources`` globs, then those they match."""
        if grant is None:
            return not self._by_digest
        if grant.admin or grant.write_sources is None:
            return True
        # Not cached: source ids are many (every file of every host), and each would push a
        # log type's or topic's decision out of the bounded cache; three globs cost ~1 µs.
        return any(fnmatch.fnmatchcase(source_id, glob) for glob in grant.write_sources)

    def may_read_prefix(self, grant: TokenGrant | None, prefix: str) -> bool:
        """Whether ``grant`` may read every topic whose name starts with ``prefix``.

        Decided on the globs' structure, not by matching ``prefix*`` against them: ``?`` and
        ``[...]`` match a literal ``*``, so ``dc1.ap?`` would pass for the prefix ``dc1.ap``
        and let a group list ``dc1.apple-secret``.  A glob covers the prefix when it is
        ``P*`` with ``P`` free of glob characters and a prefix of ``prefix``.
        """
        if grant is None:
            return not self._by_digest
        if grant.admin:
            return True
        return any(_covers_prefix(glob, prefix) for glob in grant.read_topics)

    def may_read(self, grant: TokenGrant | None, topic: str) -> bool:
        return self._may(grant, "read", topic, grant.read_topics if grant else ())

    def may_replicate(self, grant: TokenGrant | None, topic: str) -> bool:
        return self._may(grant, "replicate", topic, grant.replicate_topics if grant else ())
