"""Run the CUDA tests on a machine with an NVIDIA GPU and keep their figures: a thin runner.

    python scripts/cuda_checks.py [--out FOLDER]

The checks themselves are pytest tests marked ``cuda`` (tests/training/test_cuda.py, with the CUDA-only tests
of test_budget.py and test_memory.py): every precision on every backend, gradient equivalence, activations
across m and k, a memory budget on the real allocator, the levers. This runs exactly those (``pytest -m cuda``)
and writes FOLDER/cuda.xml (JUnit), where each test's measured figures are its recorded properties. Without a
GPU it says so and exits 1 instead of reporting skipped tests as a pass.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT") or "cuda-out")
    out = Path(parser.parse_args().out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    import torch

    if not torch.cuda.is_available():
        print("error: no CUDA GPU here; the cuda tests would only be skipped", file=sys.stderr)
        return 1
    return subprocess.call([sys.executable, "-m", "pytest", "-m", "cuda", "-o", "addopts=-ra", "-o", "junit_family=xunit1",
                            "-p", "no:cacheprovider",
                            "-q", f"--junitxml={out / 'cuda.xml'}", "tests/training/test_cuda.py",
                            "tests/training/test_budget.py", "tests/training/test_memory.py"], cwd=ROOT)


if __name__ == "__main__":
    sys.exit(main())
