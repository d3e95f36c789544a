#!/usr/bin/env bash
# Start a throwaway PostgreSQL server for the store tests, on 127.0.0.1 only.
#
#     eval "$(bash .ci/postgres.sh)"
#
# Installs Debian's `postgresql` package when no server binaries are present (needs root and
# apt-get), creates a cluster in $PERSEUS_PG_DATA (default /tmp/perseus-pg) listening on
# $PERSEUS_PG_PORT (default 54329), a user and a database, and prints exactly one line on
# stdout:
#
#     export PERSEUS_TEST_POSTGRES_URL=postgresql+psycopg://perseus:...@127.0.0.1:54329/perseus_test
#
# Everything else goes to stderr. Running it again reuses a running server. No systemd is
# needed: the server is started with pg_ctl, as the `postgres` user when run as root.
set -euo pipefail
exec 3>&1 1>&2

port=${PERSEUS_PG_PORT:-54329}
data=${PERSEUS_PG_DATA:-/tmp/perseus-pg}
user=perseus
password=perseus
database=perseus_test

find_bin() {
    local dir
    dir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
    [ -n "$dir" ] && [ -x "$dir/pg_ctl" ] && echo "$dir"
}

bin=$(find_bin || true)
if [ -z "$bin" ]; then
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
        echo "postgres.sh: no PostgreSQL server binaries and cannot apt-get install them" >&2
        exit 1
    fi
    echo "postgres.sh: installing Debian's postgresql package"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # Without an init system the package's own "start the server" step must be skipped:
    # policy-rc.d answering 101 tells invoke-rc.d not to start services.
    added_policy=0
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
        chmod +x /usr/sbin/policy-rc.d
        added_policy=1
    fi
    apt-get install -y -qq --no-install-recommends postgresql >/dev/null
    if [ "$added_policy" = 1 ]; then
        rm -f /usr/sbin/policy-rc.d
    fi
    bin=$(find_bin)
fi
echo "postgres.sh: using $bin"

as_owner() {
    if [ "$(id -u)" = 0 ]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

if as_owner "$bin/pg_ctl" -D "$data" status >/dev/null 2>&1; then
    echo "postgres.sh: reusing the server running in $data"
else
    rm -rf "$data"
    mkdir -p "$data"
    if [ "$(id -u)" = 0 ]; then
        chown postgres:postgres "$data"
    fi
    chmod 700 "$data"
    as_owner "$bin/initdb" -D "$data" -U postgres -E UTF8 --locale=C.UTF-8 \
        --auth-local=trust --auth-host=scram-sha-256 >/dev/null
    as_owner "$bin/pg_ctl" -D "$data" -l "$data/server.log" -w -t 60 \
        -o "-c listen_addresses=127.0.0.1 -p $port -k $data -c max_connections=200" start \
        </dev/null 3>&-  # the server must not hold the caller's $(...) open
fi

psql_admin() {
    as_owner "$bin/psql" -h "$data" -p "$port" -U postgres -v ON_ERROR_STOP=1 -qAt "$@"
}
if [ -z "$(psql_admin -c "SELECT 1 FROM pg_roles WHERE rolname = '$user'")" ]; then
    psql_admin -c "CREATE ROLE $user LOGIN PASSWORD '$password'"
fi
if [ -z "$(psql_admin -c "SELECT 1 FROM pg_database WHERE datname = '$database'")" ]; then
    psql_admin -c "CREATE DATABASE $database OWNER $user"
fi
echo "postgres.sh: PostgreSQL $("$bin/postgres" --version | awk '{print $3}') on 127.0.0.1:$port"

echo "export PERSEUS_TEST_POSTGRES_URL=postgresql+psycopg://$user:$password@127.0.0.1:$port/$database" >&3
