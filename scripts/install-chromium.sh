#!/usr/bin/env bash
# Install Debian's Chromium for the browser tests (the HTML report, the status page): they drive
# /usr/bin/chromium through Playwright, which never downloads a browser of its own. Nothing to do
# when it is already there; otherwise apt-get, which needs root (CI runs as root).
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "error: chromium is missing and installing it needs root: apt-get install chromium" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends chromium >/dev/null
command -v chromium
