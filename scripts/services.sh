#!/usr/bin/env bash
# Starts every service the tests need when it is not already running, all
# bound to 127.0.0.1, and waits until each answers:
#
#   scripts/services.sh            # RabbitMQ, PostgreSQL, the SQS/SNS emulator and Chromium
#   scripts/services.sh rabbitmq   # only the ones named (rabbitmq, postgres, sqs, chromium)
#
# Chromium is no service: the web console's browser test drives it
# headless (console/browser_test.go); it is installed when absent.
#
# It is idempotent: a service that already answers is left alone.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

up() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_port() { # name port seconds
  local deadline=$((SECONDS + $3))
  until up "$2"; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "services: $1 did not answer on 127.0.0.1:$2 within $3s" >&2
      return 1
    fi
    sleep 0.5
  done
  echo "services: $1 answers on 127.0.0.1:$2"
}

rabbitmq() {
  if up 5672; then echo "services: RabbitMQ already answers on 127.0.0.1:5672"; return; fi
  if ! command -v rabbitmq-server >/dev/null; then
    echo "services: installing rabbitmq-server" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rabbitmq-server >/dev/null
  fi
  # Bind to loopback only.
  export RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
  export RABBITMQ_DIST_PORT=${RABBITMQ_DIST_PORT:-25672}
  export ERL_EPMD_ADDRESS=127.0.0.1
  rabbitmq-server -detached || true
  rabbitmqctl await_startup --timeout 120 >/dev/null 2>&1 || true
  wait_port RabbitMQ 5672 120
}

postgres() {
  if up 5432; then echo "services: PostgreSQL already answers on 127.0.0.1:5432"; return; fi
  if ! ls /etc/postgresql >/dev/null 2>&1; then
    echo "services: installing postgresql" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
  fi
  local v
  v=$(ls /etc/postgresql | sort -V | tail -1)
  pg_ctlcluster --skip-systemctl-redirect "$v" main start -- -o "-c listen_addresses=127.0.0.1" || true
  wait_port PostgreSQL 5432 60
  # The tests use database "test" as user postgres without a password.
  if ! su postgres -c "psql -tAc \"SELECT 1 FROM pg_database WHERE datname='test'\"" | grep -q 1; then
    su postgres -c "createdb test"
  fi
}

sqs() {
  tools/fauxqs/start.sh
}

chromium() {
  if [ -x /usr/bin/chromium ]; then echo "services: Chromium already installed"; return; fi
  echo "services: installing chromium" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  echo "services: Chromium installed at /usr/bin/chromium"
}

services=("$@")
[ ${#services[@]} -eq 0 ] && services=(rabbitmq postgres sqs chromium)
for s in "${services[@]}"; do
  case "$s" in
    rabbitmq|postgres|sqs|chromium) "$s" ;;
    *) echo "services: unknown service $s (rabbitmq, postgres, sqs, chromium)" >&2; exit 2 ;;
  esac
done
