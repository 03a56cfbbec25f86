#!/usr/bin/env bash
# A whole pipeline on one machine: a gateway on the embedded store, a sample log that rotates,
# a push-client shipping it, and a reader printing every line as it arrives.  Ctrl-C stops all.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
LOGBROKER_EXTRAS="" source scripts/bootstrap.sh
PORT="${PORT:-8080}"
DEMO="${DEMO_DIR:-$PWD/demo-data}"
mkdir -p "$DEMO/logs"
pids=()
stopping=""
term_all() {
  local pid
  for pid in "${pids[@]}"; do
    kill -TERM "$pid" 2>/dev/null || true
  done
}
cleanup() {
  stopping=1
  echo; echo "quickstart: stopping" >&2
  # Newest first: the reader leaves its group and the push-client saves its state while
  # the gateway still answers.  A signal during a wait runs on_signal, which stops the wait.
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    kill -TERM "${pids[i]}" 2>/dev/null || true
    while kill -0 "${pids[i]}" 2>/dev/null; do
      wait "${pids[i]}" 2>/dev/null || true
    done
  done
}
# Whatever signal arrives, and however often (timeout(1) sends TERM to the script and again to
# its process group), every process started here gets TERM: the gateway and the push-client
# run in sessions of their own, so nothing else would stop them.
on_signal() {
  if [[ -n $stopping ]]; then
    term_all
    return
  fi
  cleanup
  exit "$1"
}
trap 'on_signal 129' HUP
trap 'on_signal 130' INT
trap 'on_signal 143' TERM
trap '[[ -n $stopping ]] || cleanup' EXIT

# Whatever answers on a port in use is not our gateway: the demo would ship into it.
if ! python -c "import socket; socket.create_server(('127.0.0.1', $PORT)).close()" 2>/dev/null; then
  echo "quickstart: port $PORT is in use (another gateway?); run it on another: PORT=8090 $0" >&2
  exit 1
fi
# Own sessions: a Ctrl-C reaches the reader only; the trap stops the rest in order.
setsid logbroker serve --data-dir "$DEMO/store" --port "$PORT" --dc dc1 >"$DEMO/gateway.log" 2>&1 &
pids+=($!)
gateway=$!
# A busy host may take many seconds to start it; a gateway that exited will never answer.
up=""
deadline=$((SECONDS + 120))
while ((SECONDS < deadline)); do
  kill -0 "$gateway" 2>/dev/null || break
  if python -c "import httpx,sys; sys.exit(httpx.get('http://127.0.0.1:$PORT/healthz').status_code!=200)" \
    2>/dev/null; then
    # answered by ours only if ours still runs (one that lost the port exits at once)
    sleep 0.5
    kill -0 "$gateway" 2>/dev/null && up=1
    break
  fi
  sleep 0.1
done
if [[ -z $up ]]; then
  if kill -0 "$gateway" 2>/dev/null; then
    echo "quickstart: the gateway did not answer http://127.0.0.1:$PORT/healthz within 120 s" >&2
  else
    echo "quickstart: the gateway exited before it answered on port $PORT" >&2
  fi
  echo "quickstart: its log, $DEMO/gateway.log, ends:" >&2
  tail -n 5 "$DEMO/gateway.log" >&2 || true
  exit 1
fi
echo "quickstart: gateway on http://127.0.0.1:$PORT (log: $DEMO/gateway.log)" >&2

python scripts/sample_log.py "$DEMO/logs/access.log" --rate 5 --rotate-every 50 &
pids+=($!)
setsid logbroker push --server "http://127.0.0.1:$PORT" --log-type access --state-dir "$DEMO/push-state" \
  "$DEMO/logs/access.log*" >"$DEMO/push.log" 2>&1 &
pids+=($!)
echo "quickstart: push-client shipping $DEMO/logs/access.log* (log: $DEMO/push.log)" >&2
# The gateway creates the topic with the first chunk it takes.
for _ in $(seq 100); do
  python -c "import httpx,sys; sys.exit(httpx.get('http://127.0.0.1:$PORT/v1/topics/dc1.access').status_code!=200)" \
    2>/dev/null && break
  sleep 0.1
done
echo "quickstart: reading topic dc1.access; Ctrl-C to stop" >&2
logbroker read --server "http://127.0.0.1:$PORT" --topic dc1.access --group quickstart \
  --from-beginning --format lines &
pids+=($!)
wait
