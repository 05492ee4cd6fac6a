#!/usr/bin/env bash
# Starts the local SQS/SNS emulator (fauxqs) on 127.0.0.1:4566 for the
# tests of transports/sqs, unless something already answers there.
#
#   tools/fauxqs/start.sh          # install if needed, start, wait until ready
#
# Environment: FAUXQS_PORT (default 4566), FAUXQS_LOG (default
# tools/fauxqs/fauxqs.log), FAUXQS_WAIT seconds to wait (default 30).
# Stop it with: kill "$(cat tools/fauxqs/fauxqs.pid)"
set -euo pipefail

dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
port="${FAUXQS_PORT:-4566}"
log="${FAUXQS_LOG:-$dir/fauxqs.log}"
wait_s="${FAUXQS_WAIT:-30}"

answering() {
  # Any HTTP answer counts: the emulator replies 400 to a bare GET.
  curl -s -o /dev/null --max-time 2 "http://127.0.0.1:$port/" 2>/dev/null && return 0
  (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null
}

if answering; then
  echo "fauxqs: 127.0.0.1:$port already answers"
  exit 0
fi

if ! command -v node >/dev/null 2>&1; then
  echo "fauxqs: node is not installed (Node 20 or later is needed: apt-get install -y nodejs npm)" >&2
  exit 1
fi

if [ ! -d "$dir/node_modules/fauxqs" ]; then
  echo "fauxqs: installing with npm ci"
  (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error)
fi

echo "fauxqs: starting on 127.0.0.1:$port, log in $log"
FAUXQS_PORT="$port" nohup node "$dir/launcher.mjs" >"$log" 2>&1 </dev/null &
pid=$!
echo "$pid" >"$dir/fauxqs.pid"

deadline=$((SECONDS + wait_s))
until answering; do
  if ! kill -0 "$pid" 2>/dev/null; then
    echo "fauxqs: exited before answering; its log:" >&2
    cat "$log" >&2
    exit 1
  fi
  if [ "$SECONDS" -ge "$deadline" ]; then
    echo "fauxqs: not answering on 127.0.0.1:$port after ${wait_s}s; its log:" >&2
    cat "$log" >&2
    exit 1
  fi
  sleep 0.2
done
echo "fauxqs: ready (pid $pid)"
