# Sourced by .ci/lowest: start a local server when it does not answer on its port.
# (The same two functions as in .ci/run, which keeps its own copy for now.)
# shellcheck shell=bash

answers() { python3 - "$1" "$2" <<'PY'
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2).close()
except OSError:
    sys.exit(1)
PY
}

ensure() {  # name port start-command...
  local name=$1 port=$2; shift 2
  if answers 127.0.0.1 "$port"; then echo "ci: $name answers on $port"; return; fi
  echo "ci: $name does not answer on $port; starting it"
  "$@" || true
  for _ in $(seq 1 90); do
    if answers 127.0.0.1 "$port"; then echo "ci: $name started"; return; fi
    sleep 1
  done
  echo "ci: $name did not start on port $port" >&2
  exit 1
}

ensure_postgresql() {
  ensure postgresql 5432 bash -c 'pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql)" main start'
}

ensure_redis() {
  ensure redis 6379 redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" \
    --appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log
}

ensure_mariadb() {
  ensure mariadb 3306 start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd
}
