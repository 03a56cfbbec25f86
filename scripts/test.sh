#!/usr/bin/env bash
# The whole test suite: lint, format check, types, and every test group (contract, gateway,
# push-client, delivery, Spark, faults).  Installs what it needs first.  Extra arguments go to
# pytest, e.g. `scripts/test.sh -m "not spark"` while developing.  Tests run on two pytest-xdist
# workers (LOGBROKER_TEST_WORKERS=N for another number, 0 for none); the tests that share the
# session's Kafka broker or Spark session stay together on one worker (tests/conftest.py).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/bootstrap.sh
exec python -m pytest -p no:cacheprovider -n "${LOGBROKER_TEST_WORKERS:-2}" --dist loadgroup "$@"
