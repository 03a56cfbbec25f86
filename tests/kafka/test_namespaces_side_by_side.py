"""Two installations on one Kafka cluster: one on the default empty namespace, one on ``ks2.``.

Every Kafka topic name starts with the empty namespace, so the first installation took the
second's topics for its own: it listed them, read them, took their partitions over in its
gateways' group and deleted them (acknowledged lines of the other installation lost).  An
installation's gateways keep an ownership topic, ``__<ns>logbroker-owners``; a namespace seen
there that starts with this one's is another installation's, and its topics are not this
one's.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from log_store import TopicConfig, UnknownTopic
from log_store.errors import BadRequest
from log_store.kafka import KafkaLogStore, KafkaSettings, naming, open_kafka_store

pytestmark = pytest.mark.kafka


def test_names_of_another_installation_are_not_this_ones() -> None:
    topics = ["__ks2.logbroker-owners", "__logbroker-owners", "ks2.dc1.app", "dc1.app"]
    beside = naming.namespaces_beside("", topics)
    assert beside == ("ks2.",)
    assert naming.logbroker_topic("", "ks2.dc1.app", beside) is None
    assert naming.logbroker_topic("", "dc1.app", beside) == "dc1.app"
    # a longer namespace under a shorter one, and never one's own or a shorter one
    assert naming.namespaces_beside("ks", ["__ks.b.logbroker-owners"]) == ("ks.b.",)
    assert naming.namespaces_beside("ks2.", topics) == ()


@pytest.fixture
def stores(kafka_cluster: Any, kafka_namespace: str) -> Iterator[tuple[KafkaLogStore, str]]:
    """A store on ``kafka_namespace`` whose installation ran gateways (its ownership topic
    exists), and one on a namespace that is a prefix of it (the empty one's case, kept away
    from the other tests' topics on the shared broker)."""
    admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap})
    owners = naming.owners_topic(kafka_namespace)
    admin.create_topics([NewTopic(owners, 1, 1)])[owners].result(30)
    outer_ns = kafka_namespace[:3]  # "tXX": the other namespace starts with it
    outer = open_kafka_store(KafkaSettings(kafka_cluster.bootstrap, namespace=outer_ns))
    try:
        yield outer, kafka_namespace[3:]
    finally:
        outer.close()


def test_an_installation_leaves_the_topics_of_a_namespace_under_its_own_alone(
    stores: tuple[KafkaLogStore, str], kafka_store: Any
) -> None:
    outer, rest = stores
    kafka_store.create_topic("dc1.app", TopicConfig(partitions=2))
    theirs = rest + "dc1.app"  # the other installation's topic, as this one names it
    assert theirs not in [t.name for t in outer.list_topics()]
    with pytest.raises(UnknownTopic, match="installation of namespace"):
        outer.describe_topic(theirs)
    with pytest.raises(UnknownTopic):
        outer.delete_topic(theirs)
    with pytest.raises(BadRequest, match="installation of namespace"):
        outer.create_topic(rest + "dc1.new", TopicConfig(partitions=1))
    assert kafka_store.describe_topic("dc1.app").partitions
