#!/usr/bin/env bash
# The whole test suite: lint, format check, types, and every test group (contract, gateway,
# push-client, delivery, Spark, faults).  Installs what it needs first.  Extra arguments go to
# pytest, e.g. `scripts/test.sh -m "not spark"` while developing.  Tests run on five
# pytest-xdist workers (LOGBROKER_TEST_WORKERS=N for another number, 0 for none), each test on
# whichever is free (most tests wait more than they compute: five fill two cores); each
# worker starts the Kafka broker and the Spark session once, when it first needs them
# (tests/conftest.py).  The tests of a module that sets up something dear once (the standalone
# Spark cluster of tests/yt_loader/test_cluster.py) run on one worker together, so it is set
# up once in the run, not once on each worker its tests land on (tests/conftest.py:
# ONE_WORKER_MODULES, scheduled by --dist loadgroup).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/bootstrap.sh
# The tests start hundreds of processes (gateways, push-clients, readers) that import the
# project; where PYTHONDONTWRITEBYTECODE is set, as on many CI images, each would compile it
# again (0.1 s of CPU each).  Compiled once here, they all read the same bytecode.
python -m compileall -q -j 0 -x '/\.[a-z]' . > /dev/null
exec python -m pytest -p no:cacheprovider -n "${LOGBROKER_TEST_WORKERS:-5}" --dist loadgroup "$@"
