#!/usr/bin/env bash
# The Debian packages the test suite drives itself, in one `apt-get update` (only when
# something is missing) and one `apt-get install -y`:
#   pgbouncer                 tests/integration/test_pgbouncer_postgres.py runs the binary
#   faketime                  tests/fault/ runs beat nodes on skewed and DST-eve clocks
#   chromium chromium-driver  tests/flower/test_browser.py, tests/fault/test_security.py
#   prometheus                tests/examples/test_prometheus_rules.py runs its promtool
# Idempotent: installs nothing when every command is present.
set -euo pipefail

need=()
have() { command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ] || [ -x "/usr/bin/$1" ]; }
have pgbouncer || need+=(pgbouncer)
have faketime || need+=(faketime)
have chromium || need+=(chromium)
have chromedriver || need+=(chromium-driver)
have promtool || need+=(prometheus)

if [ ${#need[@]} -eq 0 ]; then
  echo "install-packages: pgbouncer, faketime, chromium, chromedriver and promtool are present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
echo "install-packages: installing ${need[*]}"
$SUDO apt-get update -q
$SUDO apt-get install -y -q "${need[@]}"
