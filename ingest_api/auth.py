"""Bearer-token checks: which log types a token may write and which topics it may read.

With no tokens configured every request is allowed (the gateway then listens on loopback only,
see :class:`~ingest_api.settings.GatewaySettings`).  With tokens, a missing or unknown token is
401 and a known token outside its grant is 403.
"""

from __future__ import annotations

import fnmatch
import hmac
from collections.abc import Mapping

from starlette.requests import HTTPConnection

from ingest_api.errors import ApiError
from ingest_api.settings import TokenGrant

_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="logbroker"'}


class Authorizer:
    """Answers "may this request write log type X / read topic Y", raising 401/403 if not."""

    def __init__(self, tokens: Mapping[str, TokenGrant]) -> None:
        self._tokens = dict(tokens)
        self._write_cache: dict[tuple[int, str], bool] = {}
        self._read_cache: dict[tuple[int, str], bool] = {}

    @property
    def enabled(self) -> bool:
        return bool(self._tokens)

    def grant(self, conn: HTTPConnection) -> TokenGrant | None:
        """The grant of the request's bearer token; ``None`` when auth is off.

        Raises 401 if auth is on and the token is missing or unknown.
        """
        if not self._tokens:
            return None
        header = conn.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise ApiError(
                401, "unauthorized", "missing 'Authorization: Bearer <token>'", headers=_CHALLENGE
            )
        token = token.strip()
        for known, grant in self._tokens.items():
            # compare_digest keeps the check's time independent of how much of a token matched
            if hmac.compare_digest(known.encode(), token.encode()):
                return grant
        raise ApiError(401, "unauthorized", "unknown bearer token", headers=_CHALLENGE)

    def may_write(self, grant: TokenGrant | None, log_type: str) -> bool:
        if grant is None:
            return not self._tokens
        key = (id(grant), log_type)
        allowed = self._write_cache.get(key)
        if allowed is None:
            allowed = any(fnmatch.fnmatchcase(log_type, g) for g in grant.write_log_types)
            self._write_cache[key] = allowed
        return allowed

    def may_read(self, grant: TokenGrant | None, topic: str) -> bool:
        if grant is None:
            return not self._tokens
        key = (id(grant), topic)
        allowed = self._read_cache.get(key)
        if allowed is None:
            allowed = any(fnmatch.fnmatchcase(topic, g) for g in grant.read_topics)
            self._read_cache[key] = allowed
        return allowed

    def require_write(self, conn: HTTPConnection, log_type: str) -> None:
        """Raise 401/403 unless the request may write ``log_type``."""
        grant = self.grant(conn)
        if not self.may_write(grant, log_type):
            raise ApiError(403, "forbidden", f"this token may not write log type {log_type!r}")

    def require_read(self, conn: HTTPConnection, topic: str) -> None:
        """Raise 401/403 unless the request may read ``topic``."""
        grant = self.grant(conn)
        if not self.may_read(grant, topic):
            raise ApiError(403, "forbidden", f"this token may not read topic {topic!r}")
