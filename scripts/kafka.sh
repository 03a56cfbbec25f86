#!/usr/bin/env bash
# A local Apache Kafka (KRaft) on free loopback ports: fetched through Maven once (or taken
# from $KAFKA_HOME), formatted, started, stopped.  See ops/local_kafka.py.
#   scripts/kafka.sh fetch
#   scripts/kafka.sh start --dir /tmp/kafka [--nodes 3]    # prints the bootstrap servers;
#                                                           # fresh storage and ports every start
#   scripts/kafka.sh restart --dir /tmp/kafka [--down-for 30]  # same ports and storage
#   scripts/kafka.sh stop --dir /tmp/kafka      # restart starts it again on its ports
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# only what running Kafka takes: no test or Spark packages for trying it out
LOGBROKER_EXTRAS="${LOGBROKER_EXTRAS-}" LOGBROKER_KAFKA=1 source scripts/bootstrap.sh
exec python -m ops.local_kafka "$@"
