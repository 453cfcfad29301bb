"""Fixtures shared by the whole suite (browser-only ones are in tests/browser/conftest.py).

Plain helpers are in support.py (polling, ports, a real Streamlit server), app_support.py (driving pages
with AppTest) and attack_support.py (the CLI in-process, sabotaged models, a browserless visitor).
"""

import os
import sys
import tempfile

import pytest

from support import LIMIT_VARIABLES, ROOT

# Trackio reads its folder (TRACKIO_DIR) once per process, when first imported, and TRL's GRPOTrainer and Lightning
# import it: each test process gets a folder of its own before any test runs (the tracker tests write there).
os.environ["TRACKIO_DIR"] = tempfile.mkdtemp(prefix="gradacc-test-trackio-")

sys.path.insert(0, str(ROOT))  # gradacc itself, without installing it
# One intra-op thread for torch in this process and every process it starts, whatever order the tests run in and
# whatever the developer's shell says: tiny models on a busy 2-core machine train several times faster on one
# (the app's own setting), and a run's floats depend on the thread count, so a recipe's F1 must not depend on
# which test ran before it. The pin itself is the session fixture ``torch_threads_pinned`` below.
TORCH_THREADS = 1
os.environ["OMP_NUM_THREADS"] = str(TORCH_THREADS)

for _name in LIMIT_VARIABLES:  # a test sets the limits it means (monkeypatch); none leaks in from the shell
    os.environ.pop(_name, None)


# The browser demos, the longest tests, go first; then the folders whose modules take longest, so the quick unit tests
# fill in at the end.
BROWSER_DEMOS = "test_browser_demos.py"
HEAVY_FIRST = ("browser", "training", "bench", "attack", "app")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which reads the groups
def pytest_collection_modifyitems(items):
    """How pytest-xdist shares the tests between its two workers (pytest.ini: -n 2 --dist loadgroup
    --no-loadscope-reorder): a worker takes a group whole, in this order. Each browser demo, the longest tests, is a
    group of its own and goes first, so that no worker ends with a long one while the other waits; every other test
    goes with its module, whose fixtures then run once."""
    def rank(item) -> int:
        if item.path.name == BROWSER_DEMOS:
            return 0
        folder = item.path.parent.name
        return 1 + (HEAVY_FIRST.index(folder) if folder in HEAVY_FIRST else len(HEAVY_FIRST))

    items.sort(key=rank)  # stable: a module's tests keep their order
    for item in items:
        demo = item.path.name == BROWSER_DEMOS and hasattr(item, "callspec")
        item.add_marker(pytest.mark.xdist_group(f"demo-{item.callspec.id}" if demo else item.nodeid.split("::")[0]))


@pytest.fixture(autouse=True, scope="session")
def torch_threads_pinned():
    """Torch computes with TORCH_THREADS threads for the whole session, in every thread. torch is imported here,
    before any page test starts the app's warm-up, so the warm-up finds it imported and leaves the count alone.
    Otherwise its set_num_threads, called when its imports end, decides the count of every thread started after
    that moment (a run's, Trainer's) and not of those started before: which count a test trains with depended
    on how long the imports took (tests/serving/test_warmup.py shows it with the real torch)."""
    import torch

    torch.set_num_threads(TORCH_THREADS)
    yield TORCH_THREADS


@pytest.fixture(autouse=True, scope="session")
def gradacc_home(tmp_path_factory):
    """Every test session gets its own GRADACC_HOME: no test reads a developer's cache or runs."""
    home = tmp_path_factory.mktemp("gradacc-home")
    os.environ["GRADACC_HOME"] = str(home)
    os.environ.setdefault("GRADACC_DEVICE", "cpu")
    os.environ["HF_HUB_OFFLINE"] = "1"
    yield home


@pytest.fixture
def one_torch_thread():
    """Tiny models on a shared 2-core machine run many times faster on one intra-op thread."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    """A folder the data loaders may read (GRADACC_DATA_DIRS) for the files a test writes."""
    monkeypatch.setenv("GRADACC_DATA_DIRS", str(tmp_path))
    return tmp_path


@pytest.fixture
def store(tmp_path, monkeypatch):
    """A RunStore at its default path under this test's own GRADACC_HOME (``tmp_path / "home"``)."""
    from gradacc.serving.store import RunStore

    monkeypatch.setenv("GRADACC_HOME", str(tmp_path / "home"))
    for name in LIMIT_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    store = RunStore()
    yield store
    store.close()


@pytest.fixture
def make_manager(store):
    """``make_manager(**options)``: a RunManager on ``store`` (training with the real engine unless given a
    ``train_fn``); every one is shut down at the end of the test, its run threads joined."""
    from gradacc.serving.manager import RunManager

    managers = []

    def make(**options):
        manager = RunManager(store, **options)
        managers.append(manager)
        return manager

    yield make
    for manager in managers:
        assert manager.shutdown(timeout=30), "a run thread did not end"


@pytest.fixture
def app_home(tmp_path, monkeypatch):
    """A fresh Streamlit server for AppTest: its own GRADACC_HOME, no deployment limits, no hub, a new
    RunManager. AppTest runs the scripts in this process, so what the server caches is cleared afterwards."""
    import streamlit as st

    monkeypatch.setenv("GRADACC_HOME", str(tmp_path))
    monkeypatch.setenv("GRADACC_DEVICE", "cpu")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for name in LIMIT_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    st.cache_resource.clear()
    st.cache_data.clear()
    yield tmp_path
    _release_server_resources()


def _release_server_resources() -> None:
    import streamlit as st

    from gradacc.app import server
    from gradacc.errors import GradaccError
    from gradacc.serving import warmup

    # The app's warm-up imports torch and transformers in a thread: the next test must not import them beside it
    # (a module fixture that imports transformers then can find it half initialised).
    assert warmup.wait_until_warm(timeout=180), "the warm-up did not finish"
    try:
        server._create_manager().shutdown(timeout=30)  # stops runs a test left going, joins their threads
    except GradaccError:
        pass  # a test with a broken setting never had a manager
    server.check_runner().shutdown()
    server.audit_runner().shutdown()
    server.grpo_runner().shutdown()
    st.cache_resource.clear()
    st.cache_data.clear()
