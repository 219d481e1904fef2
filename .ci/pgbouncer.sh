#!/usr/bin/env bash
# A private PgBouncer in transaction pooling mode in front of the test PostgreSQL.
#
#   .ci/pgbouncer.sh          start it on 127.0.0.1:6432 (does nothing if the port answers)
#   .ci/pgbouncer.sh stop     stop the one this script started
#   .ci/pgbouncer.sh xacts    print total_xact_count of database `test` (SHOW STATS)
#
# Settings (environment): PGBOUNCER_PORT (6432), PGBOUNCER_DIR (config, pid and log;
# default $TMPDIR/celery-singlebeat-pgbouncer), PG_HOST/PG_PORT of the real server
# (127.0.0.1:5432). Database `test`, user postgres, auth_type trust on both hops.
set -euo pipefail

PORT=${PGBOUNCER_PORT:-6432}
PG_HOST=${PG_HOST:-127.0.0.1}
PG_PORT=${PG_PORT:-5432}
DIR=${PGBOUNCER_DIR:-${TMPDIR:-/tmp}/celery-singlebeat-pgbouncer}
BIN=${PGBOUNCER_BIN:-$(command -v pgbouncer || echo /usr/sbin/pgbouncer)}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

admin() {
  # the admin console speaks the simple query protocol only: psql, not psycopg
  psql -X -At -F ' ' -h 127.0.0.1 -p "$PORT" -U postgres pgbouncer -c "$1"
}

start() {
  if port_open "$PORT"; then
    # e.g. the distribution's own pgbouncer service, started by its package
    if [ "$(admin 'SHOW CONFIG' 2>/dev/null | awk '$1 == "pool_mode" { print $2 }')" != transaction ]; then
      echo "pgbouncer: something else answers on 127.0.0.1:$PORT (not a PgBouncer in" \
        "transaction pooling mode whose admin console trusts postgres): stop it, or set" \
        "PGBOUNCER_PORT" >&2
      return 1
    fi
    echo "pgbouncer: 127.0.0.1:$PORT already answers (transaction pooling)"
    return 0
  fi
  mkdir -p "$DIR"
  # "trust" still wants the user listed in the auth file
  echo '"postgres" ""' >"$DIR/userlist.txt"
  cat >"$DIR/pgbouncer.ini" <<EOF
[databases]
test = host=$PG_HOST port=$PG_PORT dbname=test user=postgres

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $PORT
unix_socket_dir =
auth_type = trust
auth_file = $DIR/userlist.txt
admin_users = postgres
stats_users = postgres
pool_mode = transaction
default_pool_size = 20
max_client_conn = 500
logfile = $DIR/pgbouncer.log
pidfile = $DIR/pgbouncer.pid
EOF
  local as_user=()
  if [ "$(id -u)" = 0 ]; then
    # pgbouncer refuses to run as root: -u drops to an unprivileged user
    local user=postgres
    getent passwd postgres >/dev/null || user=nobody
    chown -R "$user" "$DIR"
    as_user=(-u "$user")
  fi
  rm -f "$DIR/pgbouncer.pid"
  "$BIN" -d "${as_user[@]}" "$DIR/pgbouncer.ini"
  for _ in $(seq 1 50); do
    port_open "$PORT" && { echo "pgbouncer: up on 127.0.0.1:$PORT (transaction pooling, $DIR)"; return 0; }
    sleep 0.2
  done
  echo "pgbouncer: did not come up on $PORT; log:" >&2
  tail -20 "$DIR/pgbouncer.log" >&2 || true
  return 1
}

stop() {
  local pidfile=$DIR/pgbouncer.pid
  if [ ! -s "$pidfile" ]; then
    echo "pgbouncer: not started by this script ($pidfile missing)"
    return 0
  fi
  local pid
  pid=$(cat "$pidfile")
  if kill "$pid" 2>/dev/null; then
    for _ in $(seq 1 50); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    echo "pgbouncer: stopped ($pid)"
  fi
  rm -f "$pidfile"
}

xacts() {
  admin 'SHOW STATS' |
    awk '$1 == "test" { print $2; found = 1 } END { if (!found) print 0 }'
}

case "${1:-start}" in
  start) start ;;
  stop) stop ;;
  xacts) xacts ;;
  *) echo "usage: $0 [start|stop|xacts]" >&2; exit 2 ;;
esac
