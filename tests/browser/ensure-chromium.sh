#!/usr/bin/env bash
# Headless Chromium for the report tests (tests/plan/test_plan_report_browser.py), from Debian's packages.
# `make unit` runs this first; a machine where it cannot be installed fails here, not with skipped tests.
set -euo pipefail
for bin in chromium chromium-browser; do
  if command -v "$bin" >/dev/null 2>&1; then exit 0; fi
done
if [ "$(id -u)" -eq 0 ]; then SUDO=""; elif command -v sudo >/dev/null 2>&1; then SUDO="sudo -n"; else
  echo "ensure-chromium: chromium is missing and neither root nor sudo is available to apt-get install it" >&2
  exit 1
fi
echo "ensure-chromium: installing Debian's chromium package (headless report tests)" >&2
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends chromium >/dev/null
command -v chromium >/dev/null
