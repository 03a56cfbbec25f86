#!/usr/bin/env bash
# The whole test suite: lint, format check, types, and every test group (contract, gateway,
# push-client, delivery, Spark, faults).  Installs what it needs first.  Extra arguments go to
# pytest, e.g. `scripts/test.sh -m "not spark"` while developing.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/bootstrap.sh
exec python -m pytest -p no:cacheprovider "$@"
