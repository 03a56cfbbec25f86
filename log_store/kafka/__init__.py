"""The Kafka backend of the log store: exactly once on Apache Kafka, any number of gateways.

``open_kafka_store(KafkaSettings(bootstrap=...))`` opens it; the design is in docs/kafka.md.
One module per part, named after Kafka Streams' exactly-once design:

- :mod:`~log_store.kafka.partition_owner`: the single writer of a partition, fencing, takeover,
  group commit;
- :mod:`~log_store.kafka.state_changelog`: the state area's changelog and snapshots;
- :mod:`~log_store.kafka.fetcher`: read_committed reads, waits and replays;
- :mod:`~log_store.kafka.topic_admin`: data and state topics;
- :mod:`~log_store.kafka.placement`, :mod:`~log_store.kafka.gateway_group`,
  :mod:`~log_store.kafka.owner_directory`, :mod:`~log_store.kafka.remote_transaction`: which
  gateway owns which partition, and how the others send it their transactions.
"""

from __future__ import annotations

from log_store.kafka.bootstrap import check_bootstrap_names
from log_store.kafka.placement import OnDemand, Placement
from log_store.kafka.settings import KafkaSettings
from log_store.kafka.store import KafkaLogStore


def open_kafka_store(
    settings: KafkaSettings, *, placement: Placement | None = None
) -> KafkaLogStore:
    """Open the log store on the Kafka cluster ``settings.bootstrap`` names.

    BadRequest at once if no bootstrap host's name exists (librdkafka would wait for such a
    cluster as for one that is down), or if librdkafka refuses a property or its value.
    """
    check_bootstrap_names(settings.bootstrap)
    return KafkaLogStore(settings, placement=placement)  # its TopicAdmin checks the properties


__all__ = ["KafkaLogStore", "KafkaSettings", "OnDemand", "Placement", "open_kafka_store"]
