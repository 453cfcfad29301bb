#!/usr/bin/env bash
# Install gradacc's Python packages into a virtual environment, .venv, in this checkout; the README's commands
# then run .venv/bin/python. A system python3 on Debian 12 or Ubuntu 24.04 is "externally managed" (PEP 668):
# pip refuses to install into it, so nothing is installed outside .venv.
#
#   bash scripts/install.sh [REQUIREMENTS]      (default requirements.txt; the test script passes requirements-dev.txt)
#
# An existing .venv is reused (pip only adds what is missing; it is never deleted). PYTHON picks the interpreter
# that creates it (default python3). Where that python3 cannot create one (Debian and Ubuntu ship venv's pip
# bootstrap, ensurepip, in the separate python3-venv package), it installs python3-venv with apt-get, as root or
# with sudo.
set -euo pipefail
cd "$(dirname "$0")/.."
requirements="${1:-requirements.txt}"
python="${PYTHON:-python3}"

if [ ! -x .venv/bin/python ]; then
    if ! "$python" -c "import ensurepip, venv" >/dev/null 2>&1; then
        echo "$python cannot create a virtual environment: installing python3-venv" >&2
        sudo=""
        if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
        $sudo apt-get update
        $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y python3-venv
    fi
    "$python" -m venv .venv
fi
.venv/bin/python -m pip install -r "$requirements"
