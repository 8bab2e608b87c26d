#!/bin/sh
# Chromium and its WebDriver for the console's browser tests (issue 24), from Debian's
# packages: `make test` runs this first. Bounded; says why when it cannot install.
set -u
if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "install-browser: chromium and chromium-driver are missing and this is not root:" \
    "run 'apt-get install chromium chromium-driver' as root" >&2
  exit 1
fi
echo "install-browser: installing chromium and chromium-driver (apt-get)" >&2
if ! timeout 600 apt-get update -q >/dev/null; then
  echo "install-browser: 'apt-get update' failed or took over 10 minutes" >&2
  exit 1
fi
if ! DEBIAN_FRONTEND=noninteractive timeout 1200 apt-get install -y -q \
    --no-install-recommends chromium chromium-driver >/dev/null; then
  echo "install-browser: 'apt-get install chromium chromium-driver' failed or took over" \
    "20 minutes" >&2
  exit 1
fi
