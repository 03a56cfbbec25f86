"""What every route module of the gateway is given: the store, the settings, metrics, auth.

One :class:`GatewayContext` is built per worker process (see :func:`open_context`) and passed
to ``routes(ctx)`` of every module in :data:`ingest_api.app.ROUTE_MODULES`.  Route modules keep
their own state on objects they create in ``routes(ctx)``, never in globals.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import HTTPConnection

from ingest_api.access import access_of
from ingest_api.auth import Authorizer
from ingest_api.metrics import Counter, MetricsRegistry
from ingest_api.settings import GatewaySettings, TokenGrant
from ingest_api.store_gauges import register_store_gauges
from log_store.interface import LogStore
from log_store.topic_quota import TopicLimits, TopicQuota

DEFAULT_STOP_BUDGET_S = 10.0
"""What a gateway's stop may take on a store that names no budget of its own."""
MIN_STOP_STEP_S = 0.5


@dataclass
class GatewayContext:
    """The gateway's shared parts, one per worker process."""

    store: LogStore
    settings: GatewaySettings
    metrics: MetricsRegistry = field(default_factory=MetricsRegistry)
    auth: Authorizer = field(init=False)
    topic_quota: TopicQuota = field(init=False)
    """Every topic a client's request creates or grows goes through it; a topic a token
    creates on first use counts against the token's share (:meth:`topic_creator`)."""
    limit_refusals: Counter = field(init=False)
    """``logbroker_limit_refusals_total{limit}``: requests refused by a limit, per limit."""
    extensions: dict[str, Any] = field(default_factory=dict)
    """Room for route modules to share objects with each other, by module name."""
    stop_deadline: float | None = None
    """Set when the gateway stops (:meth:`begin_stop`): what every part's stop shares."""

    def __post_init__(self) -> None:
        limits = self.settings.limits
        cache_resets = self.metrics.counter(
            "logbroker_auth_cache_resets_total",
            f"times the auth decision cache reached limits.auth_cache_entries "
            f"({limits.auth_cache_entries}) and was emptied",
        )
        self.auth = Authorizer(
            self.settings.tokens,
            peer_token=self.settings.peer_token,
            cache_entries=limits.auth_cache_entries,
            on_cache_reset=lambda: cache_resets.inc(),
        )
        self.metrics.gauge(
            "logbroker_auth_cache_entries",
            "auth decisions cached (token, log type or topic)",
            read=lambda: float(self.auth.cached_decisions),
        )
        self.topic_quota = TopicQuota(
            self.store,
            TopicLimits(
                limits.max_topics, limits.max_partitions_per_topic, limits.topics_per_token
            ),
        )
        quota = self.topic_quota
        self.metrics.collected_gauge(
            "logbroker_topics_created",
            f"topics in the store each token owner created on first use (each may create "
            f"limits.max_topics_per_token, {limits.topics_per_token}), as last counted",
            ("owner",),
            lambda: [((owner,), float(n)) for owner, n in sorted(quota.created_counts().items())],
        )
        open_partitions = getattr(self.store, "open_partitions", None)
        if open_partitions is not None:
            self.metrics.gauge(
                "logbroker_open_partitions",
                f"partitions this worker holds open (idle ones beyond "
                f"limits.max_open_partitions, {limits.max_open_partitions}, are closed)",
                read=lambda: float(getattr(self.store, "open_partitions", 0)),
            )
        self.limit_refusals = self.metrics.counter(
            "logbroker_limit_refusals_total",
            "requests (or sections of a request) refused by a configured limit",
            ("limit",),
        )
        register_store_gauges(
            self.metrics,
            self.store,
            self.settings.data_dir if self.settings.store == "sqlite" else None,
        )

    def begin_stop(self) -> None:
        """The gateway is stopping: its parts' stops (the audit's last publish, leaving the
        gateways' group, closing the store) share one deadline from now on, the store's
        ``stop_budget_s`` (one operation timeout and a grace on Kafka).  Each would otherwise
        wait for its own timeout in turn while Kafka does not answer, and the stop would take
        several; what a part leaves unfinished is what a crash would leave, and acknowledged
        data is committed before its ack."""
        budget = float(getattr(self.store, "stop_budget_s", DEFAULT_STOP_BUDGET_S))
        self.stop_deadline = time.monotonic() + budget

    def stop_time_left(self, most: float) -> float:
        """How long a part of the stop may wait: ``most``, within the stop's deadline (a
        moment at least, so a part that is quick when all is well still gets to finish)."""
        if self.stop_deadline is None:
            return most
        return max(MIN_STOP_STEP_S, min(most, self.stop_deadline - time.monotonic()))

    def grant(self, conn: HTTPConnection) -> TokenGrant | None:
        """The request's token grant (``None`` with auth off), as its route's guard found it.

        Only a declared route's request has one (see :mod:`ingest_api.access`); the guard has
        answered 401 already if the token was missing or unknown.
        """
        return access_of(conn).grant

    def topic_creator(self, grant: TokenGrant | None) -> str | None:
        """Who a topic the request creates on first use is counted against: its token's owner,
        or nobody (``max_topics`` only) for an admin token or a gateway without tokens."""
        if grant is None or grant.admin:
            return None
        return grant.owner

    def topic_for(self, log_type: str) -> str:
        """The topic a log type is written to in this data center: ``<dc>.<log_type>``."""
        return f"{self.settings.dc}.{log_type}"


def open_context(settings: GatewaySettings) -> GatewayContext:
    """Open the configured log store and build the context around it.

    On Kafka with ``kafka_ownership = "group"`` the gateway joins the gateways' group here;
    :mod:`ingest_api.peer_api` serves the other gateways and leaves the group when the app
    stops (see ``docs/kafka.md``).
    """
    import log_store

    store: LogStore
    if settings.store == "kafka":
        from ingest_api.peer_link import HttpPeerLink
        from log_store.kafka import open_kafka_store
        from log_store.kafka.gateway_group import GatewayGroup

        kafka = settings.kafka_settings()
        if settings.kafka_ownership == "group":
            link = HttpPeerLink(settings.peer_token, timeout_s=kafka.operation_timeout_s)
            group = GatewayGroup(kafka, url=settings.url, link=link)
            kafka_store = open_kafka_store(kafka, placement=group)
            # Joined before the app is built: building it already reads and writes state
            # (delivery's internal topic), which needs the partitions' owners.
            group.start(kafka_store)
            store = kafka_store
        else:
            store = open_kafka_store(kafka)
    else:
        store = log_store.open_store(
            settings.data_dir,
            max_open_partitions=settings.limits.max_open_partitions,
            dc=settings.dc,
        )
    return GatewayContext(store=store, settings=settings)
