#!/usr/bin/env bash
# Install Debian's PostgreSQL for the store's tests (tests/helpers/postgres.py starts a throwaway
# server per run from its binaries, on a Unix socket in a temporary folder). Nothing to do when
# the server binaries are there; otherwise apt-get, which needs root (CI runs as root). The
# package also creates the `postgres` user a server runs as when the tests run as root.
set -euo pipefail
if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && id postgres >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "error: PostgreSQL is missing and installing it needs root: apt-get install postgresql" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends postgresql >/dev/null
ls /usr/lib/postgresql/*/bin/initdb
