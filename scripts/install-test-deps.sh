#!/usr/bin/env bash
# Install what the test suite needs on a Debian machine: Chromium for the browser tests (Debian's,
# since Playwright's own browser download needs network access we may not have), an emoji font so
# screenshots show the page icons, and the pinned Python packages in .venv (scripts/install.sh). Safe
# to run again: it skips what is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=()
[ -x /usr/bin/chromium ] || packages+=(chromium)
dpkg -s fonts-noto-color-emoji >/dev/null 2>&1 || packages+=(fonts-noto-color-emoji)
if [ ${#packages[@]} -gt 0 ]; then
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
    $sudo apt-get update
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y "${packages[@]}"
fi

# requirements.txt pins torch==2.13.0 exactly: a range could pull a multi-GB CUDA build.
bash scripts/install.sh requirements-dev.txt
