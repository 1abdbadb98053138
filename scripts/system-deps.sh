#!/usr/bin/env bash
# Debian packages the browser test needs: Chromium and its driver (browser downloads by
# test tools do not work on these machines, so we use the distribution's build).
set -euo pipefail
if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  SUDO=sudo
else
  SUDO=
fi
echo "Installing chromium and chromium-driver (Debian packages) for the browser test" >&2
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium chromium-driver >/dev/null
