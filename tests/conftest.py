import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


@pytest.fixture(autouse=True, scope="session")
def gradacc_home(tmp_path_factory):
    """Every test session gets its own GRADACC_HOME: no test reads a developer's cache or runs."""
    home = tmp_path_factory.mktemp("gradacc-home")
    os.environ["GRADACC_HOME"] = str(home)
    os.environ.setdefault("GRADACC_DEVICE", "cpu")
    os.environ["HF_HUB_OFFLINE"] = "1"
    yield home
