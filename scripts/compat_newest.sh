#!/usr/bin/env bash
# The audit against the newest transformers, TRL, PEFT, Accelerate and Lightning on the package registry: the
# contracts of the internals gradacc relies on (tests/training/test_compat.py, each failure names the project, its
# version and the internal) and the audit's own tests. torch stays pinned (a newer wheel could be a multi-GB CUDA
# build).
#
#   bash scripts/compat_newest.sh            # a fresh .venv-newest beside .venv; prints the versions it tested
#
# Not part of the README's test command: a new release may break it before gradacc follows (docs/audit.md lists the
# versions gradacc is tested on). .github/workflows/compat-newest.yml runs it weekly, non-gating.
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"
rm -rf .venv-newest
"$python" -m venv .venv-newest
.venv-newest/bin/python -m pip install -q -r requirements-dev.txt
.venv-newest/bin/python -m pip install -q --upgrade transformers trl peft accelerate lightning
.venv-newest/bin/python -c "import accelerate, lightning, peft, transformers, trl; print('newest:', ', '.join(f'{m.__name__} {m.__version__}' for m in (transformers, trl, peft, accelerate, lightning)))"
.venv-newest/bin/python -m pytest -n 2 -p no:cacheprovider tests/training/test_compat.py tests/training/test_audit.py \
    tests/training/test_audit_trl.py tests/training/test_audit_accelerate.py tests/training/test_audit_loop.py \
    tests/training/test_audit_objectives.py tests/training/test_audit_cli.py tests/training/test_audit_lightning.py
