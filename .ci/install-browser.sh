#!/usr/bin/env bash
# Headless Chromium and its driver, from Debian's packages, for tests/flower
# (the browser test drives /usr/bin/chromium through /usr/bin/chromedriver with
# selenium; nothing is downloaded at test time). Idempotent: does nothing when
# both are installed, and runs `apt-get update` only when the install needs it.
set -euo pipefail

if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
  echo "install-browser: $(chromium --version 2>/dev/null | head -n1), chromedriver present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
install() { $SUDO apt-get install -y -q chromium chromium-driver; }

if ! install; then
  echo "install-browser: refreshing the package lists"
  $SUDO apt-get update -q
  install
fi
chromium --version
chromedriver --version
