#!/usr/bin/env bash
# Start the services the tests need (if not already up) and print `export` lines for them:
#
#   eval "$(scripts/test-services.sh)"      # start / reuse, export ATE_TEST_* variables
#   scripts/test-services.sh stop           # stop exactly what this script started
#   scripts/test-services.sh stop postgres  # ... only one of them (names: postgres, moto)
#
# The start output also sets ATE_TEST_SERVICES_STARTED to the services this call started (empty when all
# were already running), so a caller can stop only those:
#   [[ -z $ATE_TEST_SERVICES_STARTED ]] || scripts/test-services.sh stop $ATE_TEST_SERVICES_STARTED
#
# PostgreSQL 15: runs as the `postgres` user on a throwaway cluster in /tmp/ate-test-pg, port 55432,
#                socket dir inside that directory, 127.0.0.1 only, trust auth.
# moto_server:   S3 API on 127.0.0.1:55000.
#
# Only the export lines go to stdout; progress goes to stderr.
set -euo pipefail

PG_BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
PG_ROOT=${ATE_TEST_PG_ROOT:-/tmp/ate-test-pg}
PG_DATA=$PG_ROOT/data
PG_SOCK=$PG_ROOT/sock
PG_PORT=${ATE_TEST_PG_PORT:-55432}
PG_STARTED_MARK=$PG_ROOT/started-by-test-services

MOTO_DIR=${ATE_TEST_MOTO_DIR:-/tmp/ate-test-moto}
MOTO_PID=$MOTO_DIR/moto.pid
MOTO_LOG=$MOTO_DIR/moto.log
MOTO_PORT=${ATE_TEST_MOTO_PORT:-55000}

log() { printf '[test-services] %s\n' "$*" >&2; }
die() { printf '[test-services] ERROR: %s\n' "$*" >&2; exit 1; }

as_postgres() {
  if [[ $(id -un) == postgres ]]; then
    "$@"
  elif [[ $(id -u) -eq 0 ]]; then
    if command -v runuser >/dev/null 2>&1; then
      runuser -u postgres -- "$@"
    else
      su postgres -s /bin/sh -c "$(printf '%q ' "$@")"
    fi
  else
    die "PostgreSQL must run as the postgres user: run this script as root or postgres"
  fi
}

pg_ready() { "$PG_BIN/pg_isready" -q -h 127.0.0.1 -p "$PG_PORT" -t 1 >/dev/null 2>&1; }
moto_ready() { curl -fsS -o /dev/null --max-time 1 "http://127.0.0.1:$MOTO_PORT/moto-api/" 2>/dev/null \
  || curl -sS -o /dev/null --max-time 1 "http://127.0.0.1:$MOTO_PORT/" 2>/dev/null; }

start_postgres() {
  if pg_ready; then
    log "PostgreSQL already answering on 127.0.0.1:$PG_PORT; reusing it"
    return
  fi
  [[ -x $PG_BIN/postgres ]] || die "$PG_BIN/postgres missing (run scripts/setup.sh)"
  if [[ ! -s $PG_DATA/PG_VERSION ]]; then
    log "initdb in $PG_DATA"
    rm -rf "$PG_ROOT"
    mkdir -p "$PG_DATA" "$PG_SOCK"
    chown -R postgres: "$PG_ROOT" 2>/dev/null || true
    chmod 0700 "$PG_DATA"
    as_postgres "$PG_BIN/initdb" -D "$PG_DATA" -U postgres --auth=trust --encoding=UTF8 --locale=C.UTF-8 \
      >"$PG_ROOT/initdb.log" 2>&1 || { cat "$PG_ROOT/initdb.log" >&2; die "initdb failed"; }
  fi
  mkdir -p "$PG_SOCK"
  chown postgres: "$PG_SOCK" 2>/dev/null || true
  log "starting PostgreSQL on 127.0.0.1:$PG_PORT"
  # -w waits for startup (bounded by -t seconds).
  if ! as_postgres "$PG_BIN/pg_ctl" -D "$PG_DATA" -l "$PG_ROOT/postgres.log" -w -t 60 \
    -o "-p $PG_PORT -c listen_addresses=127.0.0.1 -k $PG_SOCK -c fsync=off -c max_connections=200" start >&2; then
    tail -n 30 "$PG_ROOT/postgres.log" >&2 || true
    die "PostgreSQL did not start"
  fi
  touch "$PG_STARTED_MARK"
  STARTED+=(postgres)
  for _ in $(seq 1 100); do pg_ready && return; sleep 0.1; done
  die "PostgreSQL started but pg_isready fails"
}

start_moto() {
  if moto_ready; then
    log "moto_server already answering on 127.0.0.1:$MOTO_PORT; reusing it"
    return
  fi
  command -v moto_server >/dev/null 2>&1 || die "moto_server missing (run scripts/setup.sh)"
  mkdir -p "$MOTO_DIR"
  log "starting moto_server on 127.0.0.1:$MOTO_PORT"
  # setsid: a session of its own, so it outlives this script and stop can signal its group.
  setsid moto_server -H 127.0.0.1 -p "$MOTO_PORT" </dev/null >"$MOTO_LOG" 2>&1 &
  echo $! >"$MOTO_PID"
  STARTED+=(moto)
  for _ in $(seq 1 300); do  # up to 30 s
    moto_ready && return
    if ! kill -0 "$(cat "$MOTO_PID")" 2>/dev/null; then
      tail -n 30 "$MOTO_LOG" >&2 || true
      die "moto_server exited"
    fi
    sleep 0.1
  done
  tail -n 30 "$MOTO_LOG" >&2 || true
  die "moto_server did not answer within 30 s"
}

stop_postgres() {
  if [[ -f $PG_STARTED_MARK && -s $PG_DATA/postmaster.pid ]]; then
    log "stopping PostgreSQL ($PG_DATA)"
    as_postgres "$PG_BIN/pg_ctl" -D "$PG_DATA" -m fast -w -t 30 stop >&2 || log "pg_ctl stop failed"
    rm -f "$PG_STARTED_MARK"
  else
    log "PostgreSQL: not started by this script; leaving it"
  fi
}

stop_moto() {
  if [[ -f $MOTO_PID ]]; then
    local pid
    pid=$(cat "$MOTO_PID")
    if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then
      log "stopping moto_server (pid $pid)"
      # Its own process group (setsid): signal the group so the pyenv shim's child goes too.
      kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
      for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -KILL -- "-$pid" 2>/dev/null || true
    fi
    rm -f "$MOTO_PID"
  else
    log "moto_server: not started by this script; leaving it"
  fi
}

STARTED=()
case ${1:-start} in
  start)
    start_postgres
    start_moto
    cat <<EOF
export ATE_TEST_POSTGRES_URL=postgres://postgres@127.0.0.1:$PG_PORT/postgres
export ATE_TEST_S3_ENDPOINT=http://127.0.0.1:$MOTO_PORT
export AWS_ACCESS_KEY_ID=testing
export AWS_SECRET_ACCESS_KEY=testing
export AWS_DEFAULT_REGION=us-east-1
export AWS_REGION=us-east-1
export ATE_TEST_SERVICES_STARTED="${STARTED[*]}"
EOF
    ;;
  stop)
    shift
    if (($# == 0)); then
      # Bare `stop`: everything this script ever started.  `stop` with names: only those.
      set -- postgres moto
    fi
    for svc in "$@"; do
      case $svc in
        postgres) stop_postgres ;;
        moto) stop_moto ;;
        *) die "unknown service: $svc" ;;
      esac
    done
    ;;
  *) die "usage: $0 [start|stop]" ;;
esac
