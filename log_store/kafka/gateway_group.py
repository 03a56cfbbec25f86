"""Gateways share the partitions out among themselves with a Kafka consumer group.

Every gateway joins the group ``<ns>logbroker-gateways`` subscribed to every logbroker topic of
its namespace, with Kafka's own consumer group protocol (KIP-848, ``group.protocol=consumer``)
and the broker's ``range`` assignor: the broker gives each partition to exactly one live
member and spreads *each topic* over the members (a topic's partitions split 2+2 over two
gateways, not whole topics to one gateway, as the client-side sticky assignor did when it
balanced only the totals).  Partitions move only when members join or leave (a member silent
for ``session_timeout_ms`` is taken for dead), incrementally: a member gives up what it must
before another takes it.  The group's consumer never reads data: its partitions are paused,
only its assignment is used.

The session timeout of this protocol is the group's, not the member's: the gateway sets the
group's ``consumer.session.timeout.ms`` (and a heartbeat of a fifth of it) through the admin
API before joining.  A broker that refuses it (below its
``group.consumer.min.session.timeout.ms``, 45 s by default) keeps its default, with a warning.

- Assigned a partition, a gateway takes it over (``init_transactions`` fences whoever wrote
  it before, see ``partition_owner``) and, once the table is rebuilt, announces itself as its
  owner (``owner_directory``).
- Revoked (or lost), it finishes the transactions in flight, stops writing, and withdraws
  the announcement; what was queued goes to the next owner.
- Every few seconds it compares its standing claims with what it owns: a partition taken
  over whose claim is gone (withdrawn by anyone, or not taken by Kafka) is announced again,
  a claim of a partition it no longer has is withdrawn (see :meth:`GatewayGroup._mend_claims`).
- A transaction for a partition it does not own goes to the announced owner
  (``remote_transaction``).
- Unable to write any of the partitions it was given (none taken over, or taken over again
  after a failure) for ``3 * operation_timeout_s`` while Kafka answers its group member and
  other gateways own partitions, it leaves the group, so the others get them, and joins
  again once its store says Kafka answers it (see :meth:`GatewayGroup._stalled`).  A gateway
  whose Kafka clients stay broken while its membership heartbeats would otherwise keep its
  partitions, without a writer, for ever.
- Its group member failing for good (librdkafka's fatal error: the broker refused its
  heartbeat, as a broker without KIP-848's protocol does), it gives every partition up as
  lost (whoever takes one over fences it), says so in an ERROR line and at ``/readyz`` (see
  :attr:`GatewayGroup.out_of_group`), and joins again with a new member, after 1, 2, 4 ... 30
  s.  A dead member heartbeats no more, so the group gives its partitions to the others; a
  gateway that kept them would write them after the others took them over, and be fenced.

The group decides who *should* write; fencing decides who *can*: even when two gateways both
believe they own a partition for a moment (one was presumed dead and is not), only the one
that called ``init_transactions`` last can commit.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)

from log_store.kafka import naming
from log_store.kafka.bootstrap import (
    check_group_protocol,
    group_fatal_cause,
    group_fatal_error,
    member_joined,
)
from log_store.kafka.owner_directory import OwnerDirectory
from log_store.kafka.remote_transaction import PeerLink, RemoteTransactions
from log_store.kafka.settings import KafkaSettings

if TYPE_CHECKING:
    from log_store.kafka.store import KafkaLogStore

log = logging.getLogger(__name__)

_POLL_S = 0.2
_TOPICS_S = 2.0
_LIST_TOPICS_S = 1.0
"""How long one look at the topics may wait: a stop waits for the look in progress (with
Kafka unreachable, all of it), and a look that fails is made again ``_TOPICS_S`` later."""
LISTING_SAID_S = 30.0
"""While the group member cannot list the topics (every 2 s), how often the log says it."""
_LEAVE_GRACE_S = 5.0
STALLED_TIMEOUTS = 3
"""Operation timeouts a gateway may fail to take over every partition it was given before
it leaves the group (each takeover is tried again meanwhile, after 1, 2, 4, 8, 10 s...)."""
_OUT_CHECK_S = 1.0
_WITHDRAW_S = 1.0
MEND_CLAIMS_S = 2.0
"""How often a gateway compares its claims in the owners' topic with what it owns."""
_REJOIN_BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0)
"""How long a gateway whose group member failed for good waits before each new member."""


class GatewayGroup:
    """This gateway's membership in the gateways' group: which partitions it writes."""

    def __init__(self, settings: KafkaSettings, *, url: str, link: PeerLink) -> None:
        self._settings = settings
        self.url = url
        self.directory = OwnerDirectory(settings, self_url=url)
        self.remote_transactions = RemoteTransactions(
            self.directory,
            link,
            timeout_s=settings.operation_timeout_s,
            partition_check=self._check_partition,
        )
        self._assigned: set[tuple[str, int]] = set()
        self._unwritable: dict[tuple[str, int], float] = {}
        """Partitions given that this gateway cannot write (not taken over, or its owner
        broken), with since when, counted only while Kafka answers the group's member."""
        self.rejoins = 0
        """How many times this gateway left the group for want of takeovers, and came back."""
        self._out_cause: str | None = None
        self._failed_members = 0
        """Group members that failed for good in a row (the backoff before the next one)."""
        self._lock = threading.Lock()
        self._store: KafkaLogStore | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._poke = threading.Event()
        self._listing_failed_said = float("-inf")

    # -- Placement ------------------------------------------------------------------------------
    def owns(self, topic: str, partition: int) -> bool:
        with self._lock:
            return (topic, partition) in self._assigned

    def remote(self) -> RemoteTransactions:
        return self.remote_transactions

    def _check_partition(self, topic: str, partition: int) -> None:
        if self._store is not None:
            self._store.check_partition(topic, partition)

    def assigned(self) -> set[tuple[str, int]]:
        with self._lock:
            return set(self._assigned)

    @property
    def out_of_group(self) -> str | None:
        """Why this gateway is out of the gateways' group (its member failed for good, and
        the new one has not joined yet), or None; the store's readiness says it."""
        with self._lock:
            return self._out_cause

    # -- life -----------------------------------------------------------------------------------
    def start(self, store: KafkaLogStore) -> None:
        """Join the group; partitions arrive (and are taken over) in the background.

        BadRequest, before anything is joined, if the cluster refuses a member of KIP-848's
        consumer group protocol (see :func:`~log_store.kafka.bootstrap.check_group_protocol`):
        the gateway would otherwise serve, ready, and own no partition.
        """
        if not check_group_protocol(self._settings):
            log.warning(
                "gateway %s: Kafka neither took nor refused a member of a consumer group in "
                "%g s; joining the gateways' group all the same",
                self.url,
                self._settings.operation_timeout_s,
            )
        self._store = store
        store.takeover_listener = self._on_takeover
        self.directory.start()
        self._thread = threading.Thread(target=self._run, name="logbroker-group", daemon=True)
        self._thread.start()

    @property
    def stop_budget_s(self) -> float:
        """What :meth:`stop` waits at most unless told less."""
        return self._settings.operation_timeout_s + _LEAVE_GRACE_S

    def stop(self, timeout_s: float | None = None) -> None:
        """Leave the group: every partition is finished, released and handed on at once.

        Bounded by ``timeout_s`` (default :attr:`stop_budget_s`, ``operation_timeout_s`` and a
        few seconds; a gateway's stop gives what is left of its own): leaving (the owners finish the
        transactions in flight, each within the operation timeout; the directory keeps
        reading meanwhile, so what was queued finds the next owner), then stopping the
        directory, whose withdrawals Kafka takes in milliseconds when it is reachable.  With
        Kafka unreachable the group thread is left behind at the bound (a daemon thread):
        the broker cannot hear the leave anyway, and the partitions move once the session
        times out, as after a crash; nothing acknowledged depends on it.
        """
        self._stopping.set()
        deadline = time.monotonic() + (self.stop_budget_s if timeout_s is None else timeout_s)
        if self._thread is not None:
            # what is left for the withdrawals, which take milliseconds when Kafka answers
            self._thread.join(max(0.0, deadline - time.monotonic() - _WITHDRAW_S))
            if self._thread.is_alive():
                log.warning("gateway %s: leaving the group did not finish in time", self.url)
        self.directory.stop(min(_WITHDRAW_S, max(0.1, deadline - time.monotonic())))

    def _consumer_config(self) -> dict[str, object]:
        return {
            **self._settings.client_base(),
            "group.id": naming.gateway_group(self._settings.namespace),
            "group.protocol": "consumer",
            "group.remote.assignor": "range",
            "enable.auto.commit": False,
            "auto.offset.reset": "latest",
            "max.poll.interval.ms": 300_000,
        }

    def _set_group_timeouts(self) -> None:
        """The group's session timeout and heartbeat, set on the broker (KIP-848 keeps them
        per group); a refusal leaves the broker's defaults, with a warning."""
        session = self._settings.session_timeout_ms
        group = naming.gateway_group(self._settings.namespace)
        resource = ConfigResource(
            ResourceType.GROUP,
            group,
            incremental_configs=[
                ConfigEntry(
                    "consumer.session.timeout.ms",
                    str(session),
                    incremental_operation=AlterConfigOpType.SET,
                ),
                ConfigEntry(
                    "consumer.heartbeat.interval.ms",
                    str(max(100, session // 5)),
                    incremental_operation=AlterConfigOpType.SET,
                ),
            ],
        )
        admin = AdminClient(self._settings.client_base())
        timeout = self._settings.operation_timeout_s
        try:
            for future in admin.incremental_alter_configs([resource]).values():
                future.result(timeout=timeout)
        except (KafkaException, TimeoutError) as exc:
            log.warning(
                "gateways' group %s keeps the broker's session timeout, not %d ms: %s "
                "(the broker's group.consumer.min.session.timeout.ms must allow it)",
                group,
                session,
                exc,
            )

    def _topics(self, consumer: Consumer) -> list[str] | None:
        """The namespace's topics whose partitions all have a leader (None if unknown now).

        An explicit list, not a pattern subscription: librdkafka's pattern subscription may
        catch a topic in the moment its partitions have no leader yet, leave it out of the
        assignment, and not look again (seen with three brokers).
        """
        try:
            metadata = consumer.list_topics(timeout=_LIST_TOPICS_S)
        except Exception as exc:
            # asked every 2 s: said once per LISTING_SAID_S while it fails (Kafka away: the
            # store says that itself), the other times at DEBUG
            now = time.monotonic()
            if now - self._listing_failed_said >= LISTING_SAID_S:
                self._listing_failed_said = now
                log.warning("gateways' group: listing topics: %s", exc)
            else:
                log.debug("gateways' group: listing topics: %s", exc)
            return None
        self._listing_failed_said = float("-inf")
        ready = []
        namespace = self._settings.namespace
        beside = naming.namespaces_beside(namespace, metadata.topics)
        for kafka_name, topic in metadata.topics.items():
            if naming.logbroker_topic(namespace, kafka_name, beside) is None:
                continue
            if topic.error is not None or not topic.partitions:
                continue
            if all(p.leader >= 0 and p.error is None for p in topic.partitions.values()):
                ready.append(kafka_name)
        return sorted(ready)

    def _new_consumer(self) -> Consumer:
        return Consumer(self._consumer_config())

    def _run(self) -> None:
        self._set_group_timeouts()
        consumer: Consumer | None = self._new_consumer()
        subscribed: list[str] = []
        looked = 0.0
        mended = time.monotonic()
        try:
            while not self._stopping.is_set():
                assert consumer is not None
                now = time.monotonic()
                if now - mended >= MEND_CLAIMS_S:
                    mended = now
                    try:
                        self._mend_claims()
                    except Exception:  # the group's thread must outlive a failed mend
                        log.exception("mending this gateway's ownership claims")
                if now - looked >= _TOPICS_S or self._poke.is_set():
                    self._poke.clear()
                    looked = now
                    topics = self._topics(consumer)
                    if topics and topics != subscribed:
                        consumer.subscribe(
                            topics,
                            on_assign=self._on_assign,
                            on_revoke=self._on_revoke,
                            on_lost=self._on_lost,
                        )
                        subscribed = topics
                    if subscribed and self.out_of_group is not None:
                        self._check_joined(consumer)
                    if self._stalled(now, kafka_answers=topics is not None):
                        consumer.close()  # on_revoke gives every partition up
                        consumer = None
                        if not self._stay_out():
                            return
                        consumer = self._new_consumer()
                        subscribed = []
                        looked = 0.0
                        self._unwritable.clear()
                        self.rejoins += 1
                        continue
                try:
                    event = consumer.poll(_POLL_S)
                except Exception as exc:  # keep the membership alive through broker hiccups
                    log.warning("gateways' group: %s", exc)
                    continue
                fatal = group_fatal_error(event)
                if fatal is None:
                    continue
                self._member_failed(consumer, fatal)
                consumer = None
                backoff = _REJOIN_BACKOFF_S[min(self._failed_members, len(_REJOIN_BACKOFF_S)) - 1]
                if self._stopping.wait(backoff):
                    return
                consumer = self._new_consumer()
                subscribed = []
                looked = 0.0
                self._unwritable.clear()
        finally:
            # leaving runs on_revoke for everything this gateway holds
            if consumer is not None:
                consumer.close()

    def _member_failed(self, consumer: Consumer, reason: str) -> None:
        """The group member ``consumer`` failed for good: give every partition up, as lost,
        and close it.  It heartbeats no more, so the group gives its partitions to others
        once its session times out; they fence this gateway's writers anyway."""
        cause = group_fatal_cause(reason)
        with self._lock:
            self._out_cause = cause
            self._failed_members += 1
            held = set(self._assigned)
        try:
            partitions = list(consumer.assignment())
        except KafkaException:
            partitions = []
        named = set(self._names(partitions))
        namespace = self._settings.namespace
        partitions += [
            TopicPartition(naming.data_topic(namespace, topic), partition)
            for topic, partition in sorted(held - named)
        ]
        log.error(
            "gateway %s is out of the gateways' group: its member failed for good: %s; it "
            "gives up %s (the group hands its partitions to the other gateways) and joins "
            "again with a new member",
            self.url,
            cause,
            _listed(partitions),
        )
        self._give_up(partitions)
        try:
            consumer.close()
        except Exception as exc:  # a dead consumer: nothing of it is needed any more
            log.warning("gateways' group: closing the failed member: %s", exc)

    def _check_joined(self, consumer: Consumer) -> None:
        """Back in the group once the broker took the new member (a member given no
        partition hears of no assignment): its member epoch says so, without asking the
        broker (see :func:`~log_store.kafka.bootstrap.member_joined`)."""
        if member_joined(consumer):
            self._joined()

    def _joined(self) -> None:
        with self._lock:
            if self._out_cause is None:
                return
            self._out_cause = None
            self._failed_members = 0
        log.info("gateway %s is in the gateways' group again", self.url)

    def _stalled(self, now: float, *, kafka_answers: bool) -> bool:
        """Whether this gateway should leave: it could write none of the partitions it was
        given (each not taken over, or its owner broken and failing to take it over again)
        for ``STALLED_TIMEOUTS`` operation timeouts, all the while Kafka answered its
        group member (``kafka_answers``: the caller just listed topics), and other gateways
        own partitions (so the trouble is this gateway's, not the cluster's; one partition
        that no gateway can take over is not passed round, since the others write theirs).

        Leaving is safe for exactly-once: a partition not taken over has no writer here, and
        whoever takes it next fences every earlier one."""
        store = self._store
        assert store is not None
        if not kafka_answers:
            self._unwritable.clear()  # an outage of the cluster: its clock starts again after
            return False
        assigned = self.assigned()
        for at in assigned:
            owner = store.local_owner(*at)
            if owner is not None and not owner.broken:
                self._unwritable.pop(at, None)
            else:
                self._unwritable.setdefault(at, now)
        for at in set(self._unwritable) - assigned:
            del self._unwritable[at]
        if not assigned or len(self._unwritable) != len(assigned):
            return False
        since = max(self._unwritable.values())  # all of them unwritable since then
        if now - since < STALLED_TIMEOUTS * self._settings.operation_timeout_s:
            return False
        others = {url for url in self.directory.snapshot().values() if url != self.url}
        if not others:
            return False
        log.warning(
            "gateway %s could write none of the %d partitions the group gave it for %.0f s, "
            "while Kafka answers and %d other gateway(s) own partitions: leaving the group so "
            "that they get them; joining again once Kafka answers this gateway's store",
            self.url,
            len(assigned),
            now - since,
            len(others),
        )
        return True

    def _stay_out(self) -> bool:
        """Out of the group for an operation timeout at least (the others take the partitions
        over meanwhile), and until the store says Kafka answers it; False: stopping."""
        store = self._store
        assert store is not None
        back = time.monotonic() + self._settings.operation_timeout_s
        while not self._stopping.wait(_OUT_CHECK_S):
            if time.monotonic() >= back and store.readiness() is None:
                log.info("gateway %s joins the gateways' group again", self.url)
                return True
        return False

    def _mend_claims(self) -> None:
        """Announce again each partition this gateway owns and took over whose claim is
        gone; withdraw the claims of partitions it does not own (a takeover that ended just
        as the partition was revoked announces it after the withdrawal).

        A claim can go while its owner lives: before claims were per process, a second
        gateway started with this one's URL withdrew them at its start and its stop, and
        the partitions stayed without an owner for the other gateways until the next
        takeover, which nothing caused.  Mended here within :data:`MEND_CLAIMS_S`."""
        store = self._store
        assert store is not None
        claimed = self.directory.own_claims()
        assigned = self.assigned()
        for topic, partition in sorted(assigned - claimed):
            owner = store.local_owner(topic, partition)
            if owner is None or owner.broken or not owner.ready.is_set():
                continue  # announced when its takeover ends
            if not self.owns(topic, partition):
                continue
            log.warning(
                "gateway %s owns %s/%d but its claim is gone: claiming it again",
                self.url,
                topic,
                partition,
            )
            self.directory.announce(topic, partition)
        for topic, partition in sorted(claimed - assigned):
            if not self.owns(topic, partition):
                self.directory.withdraw(topic, partition)

    def topics_changed(self) -> None:
        """Look at the topics now (this gateway just created one or grew one)."""
        self._poke.set()

    def _names(self, partitions: list[TopicPartition]) -> list[tuple[str, int]]:
        found = []
        for tp in partitions:
            name = naming.logbroker_topic(self._settings.namespace, tp.topic)
            if name is not None:
                found.append((name, tp.partition))
        return found

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        consumer.incremental_assign(partitions)
        if partitions:
            consumer.pause(partitions)
            self._joined()
        store = self._store
        assert store is not None
        for topic, partition in self._names(partitions):
            with self._lock:
                self._assigned.add((topic, partition))
            store.take_over(topic, partition)
        log.info("gateway %s was given %s", self.url, _listed(partitions))

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if partitions:
            log.info("gateway %s gives up %s", self.url, _listed(partitions))
        self._give_up(partitions)
        consumer.incremental_unassign(partitions)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        log.warning("gateway %s lost %s to the group", self.url, _listed(partitions))
        self._give_up(partitions)
        consumer.incremental_unassign(partitions)

    def _give_up(self, partitions: list[TopicPartition]) -> None:
        store = self._store
        assert store is not None
        names = self._names(partitions)
        # every claim first: peers stop sending here while the owners below finish
        for topic, partition in names:
            with self._lock:
                self._assigned.discard((topic, partition))
            self.directory.withdraw(topic, partition)
        for topic, partition in names:
            store.release(topic, partition, wait=True)

    def _on_takeover(self, topic: str, partition: int, seconds: float, entries: int) -> None:
        if self.owns(topic, partition):
            self.directory.announce(topic, partition)


def _listed(partitions: list[TopicPartition]) -> str:
    """``topic/0,1 other/3``: partitions named for the log."""
    by_topic: dict[str, list[int]] = {}
    for tp in partitions:
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    named = [f"{t}/{','.join(map(str, sorted(ps)))}" for t, ps in sorted(by_topic.items())]
    return " ".join(named) or "no partition"
