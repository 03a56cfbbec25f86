#!/usr/bin/env bash
# Installs what logbroker needs on a fresh Debian machine: Debian packages (only when missing),
# a virtual environment in .venv and the Python packages.  Safe to run again; quick when done.
# Sourced by quickstart.sh, test.sh and kafka.sh.  Set LOGBROKER_EXTRAS to choose pip extras,
# LOGBROKER_KAFKA=1 for what running Apache Kafka locally takes (Java, and Maven to fetch it).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$REPO/.venv"
EXTRAS="${LOGBROKER_EXTRAS-test,spark}"
# the test suite runs Apache Kafka itself, fetched through Maven (ops/local_kafka.py)
[[ ",$EXTRAS," != *",test,"* ]] || LOGBROKER_KAFKA=1

need_apt=()
command -v python3 >/dev/null || need_apt+=(python3)
python3 -c 'import venv, ensurepip' 2>/dev/null || need_apt+=(python3-venv)
if [[ ",$EXTRAS," == *",spark,"* || ${LOGBROKER_KAFKA-} == 1 ]] && ! command -v java >/dev/null; then
  need_apt+=(openjdk-17-jre-headless)
fi
if [[ ${LOGBROKER_KAFKA-} == 1 && -z ${KAFKA_HOME-} ]] && ! command -v mvn >/dev/null; then
  need_apt+=(maven)
fi
command -v mount >/dev/null || need_apt+=(mount)
if [[ ",$EXTRAS," == *",test,"* ]]; then
  # the dashboard's browser test drives Debian's headless Chromium
  command -v chromium >/dev/null || need_apt+=(chromium)
  command -v chromedriver >/dev/null || need_apt+=(chromium-driver)
fi
if ((${#need_apt[@]})); then
  echo "bootstrap: installing Debian packages: ${need_apt[*]}" >&2
  SUDO=""; [[ $(id -u) == 0 ]] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

if [[ ! -x "$VENV/bin/python" ]]; then
  echo "bootstrap: creating $VENV" >&2
  python3 -m venv "$VENV"
fi
digest="$(sha1sum "$REPO/pyproject.toml" | cut -c1-12)"
stamp="$VENV/.installed-$digest-${EXTRAS//,/_}"
# An install with more extras covers this one: installing again would rewrite the venv's
# scripts (`logbroker`) under whatever already runs from it (the quick start inside the tests).
covered=""
for done_stamp in "$VENV"/.installed-"$digest"-*; do
  [[ -f $done_stamp ]] || continue
  have=",${done_stamp##*/.installed-"$digest"-},"
  have="${have//_/,}"
  covered=1
  IFS=, read -ra wanted <<<"$EXTRAS"
  for extra in "${wanted[@]}"; do
    [[ -z $extra || $have == *",$extra,"* ]] || covered=""
  done
  [[ -z $covered ]] || break
done
if [[ -z $covered ]]; then
  echo "bootstrap: installing Python packages ($EXTRAS)" >&2
  "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
  target="$REPO"; [[ -z $EXTRAS ]] || target="$REPO[$EXTRAS]"
  if ! "$VENV/bin/python" -m pip install -q -e "$target" >"$VENV/pip-install.log" 2>&1; then
    grep -v '^WARNING: Location' "$VENV/pip-install.log" >&2
    echo "bootstrap: Python packages failed to install" >&2
    exit 1
  fi
  touch "$stamp"
fi
export PATH="$VENV/bin:$PATH"
