"""gradacc as an installable package: what the wheel holds, one version, the console script, ``gradacc app``, the
Python API's example (docs/python-api.md), and (marked ``install``, run with ``-m install``) a fresh ``pip install .``
with Debian's own python3 that trains, checks, benchmarks and serves the app from the installed package alone.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
import urllib.request
import zipfile
from pathlib import Path

import pytest

import gradacc
from gradacc.cli import main
from support import ARTIFACTS, ROOT, StreamlitServer

# Not copied into a build: version control, virtual environments, build and test output.
NOT_SOURCE = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", "test-artifacts",
                                    ".pytest_cache", "bench-out", "results", ".gradacc", "shared")
DEBIAN_PYTHON = Path("/usr/bin/python3")
TINY_RUN = ["-m", "8", "-k", "2", "--epochs", "1", "--train-samples", "32", "--eval-samples", "16",
            "--max-seq-length", "32"]
PAGES = sorted(path.stem for path in (ROOT / "pages").glob("*.py"))


def requirements() -> list[str]:
    lines = (ROOT / "requirements.txt").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


def source_copy(destination: Path) -> Path:
    """The checkout as a user would have it, so a build leaves nothing in the working tree."""
    return Path(shutil.copytree(ROOT, destination, ignore=NOT_SOURCE))


def run(command, **options) -> subprocess.CompletedProcess:
    result = subprocess.run([str(part) for part in command], capture_output=True, text=True, **options)
    assert result.returncode == 0, f"{command} exited {result.returncode}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    # --no-build-isolation: the build uses this environment's setuptools instead of fetching one (seconds).
    folder = tmp_path_factory.mktemp("wheel")
    source = source_copy(folder / "source")
    run([sys.executable, "-m", "pip", "wheel", source, "--no-deps", "--no-build-isolation", "-q", "-w", folder / "out"],
        cwd=folder)
    (built,) = (folder / "out").glob("gradacc-*.whl")
    with zipfile.ZipFile(built) as archive:
        yield archive


def test_the_wheel_holds_the_package_the_app_pages_and_the_app_settings(wheel):
    names = set(wheel.namelist())
    package = sorted(path.relative_to(ROOT).as_posix() for path in (ROOT / "gradacc").rglob("*.py"))
    assert package and [name for name in package if name not in names] == []
    for page in PAGES:  # the checkout's pages/, installed beside the app's entry, byte for byte
        assert wheel.read(f"gradacc/app/pages/{page}.py") == (ROOT / "pages" / f"{page}.py").read_bytes()
    assert wheel.read("gradacc/app/streamlit_config/config.toml") == (ROOT / ".streamlit" / "config.toml").read_bytes()
    for shipped in (ROOT / "gradacc/training/sources/tiny_bert_tokenizer").iterdir():  # tiny-bert's tokenizer
        assert wheel.read(shipped.relative_to(ROOT).as_posix()) == shipped.read_bytes()
    # builtin-pairs, the contrastive task's data (generated once by scripts/make_contrastive_pairs.py).
    pairs = "gradacc/training/sources/builtin_pairs.json"
    assert wheel.read(pairs) == (ROOT / pairs).read_bytes()
    # The live charts' script and their look: without them every chart on the Train, Compare and Demos pages stays
    # empty; the replay page's template, style and script: without them export-html and export-site fail.
    for shipped in ("live_chart/live_chart.js", "live_chart/page_look.js", "replay/page.html", "replay/replay.css",
                    "replay/replay.js"):
        assert wheel.read(f"gradacc/app/{shipped}") == (ROOT / "gradacc/app" / shipped).read_bytes()
    # The Equivalence page's measured table, "Trainer's default, by model family".
    assert wheel.read("gradacc/app/trainer_default_by_family.json") == \
        (ROOT / "gradacc/app/trainer_default_by_family.json").read_bytes()
    assert "gradacc/app/streamlit_app.py" in names
    assert not [name for name in names if name.startswith(("tests/", "app.py", "pages/", "setup.py"))]


def test_the_wheel_has_one_version_the_requirements_and_the_console_script(wheel):
    info = next(name.split("/")[0] for name in wheel.namelist() if name.endswith(".dist-info/METADATA"))
    metadata = wheel.read(f"{info}/METADATA").decode()
    assert re.search(r"^Version: (.+)$", metadata, re.M).group(1) == gradacc.__version__
    requires = re.findall(r"^Requires-Dist: (.+)$", metadata, re.M)
    assert [r for r in requires if "extra ==" not in r] == requirements()
    # pip install gradacc[trl]: gradacc.audit's TRL and PEFT; gradacc[lightning]: its Lightning callback; at the
    # versions its tests use.
    assert [r for r in requires if "extra ==" in r] == ['trl==1.16.0; extra == "trl"', 'peft==0.21.0; extra == "trl"',
                                                        'lightning==2.6.6; extra == "lightning"']
    assert "torch==2.13.0" in requirements()  # the exact pin: a range would pull a CUDA build
    entry_points = wheel.read(f"{info}/entry_points.txt").decode()
    assert "[console_scripts]\ngradacc = gradacc.cli:main" in entry_points


def test_gradacc_version_says_the_package_version(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"gradacc {gradacc.__version__}"


def test_gradacc_app_serves_the_checkouts_app_with_its_settings(tmp_path):
    from gradacc.app import command

    assert command.app_script() == ROOT / "app.py"
    assert "--server.enableXsrfProtection=false" in command.config_flags()  # from .streamlit/config.toml
    # Started from another folder: the settings come from the flags, not from the working directory.
    server = StreamlitServer(tmp_path / "home", tmp_path / "app.log", command=[sys.executable, "-m", "gradacc", "app"],
                             extra_env={"PYTHONPATH": str(ROOT)}, cwd=tmp_path)
    try:
        with urllib.request.urlopen(f"{server.url}/_stcore/health", timeout=10) as response:
            assert response.read() == b"ok"
    finally:
        server.stop()


def readme_commands() -> tuple[str, str]:
    """The README's two opening commands: install and start the app; install the test needs and run the tests."""
    intro = (ROOT / "README.md").read_text(encoding="utf-8").split("\n## ", 1)[0]
    start_app, run_tests = re.findall(r"```bash\n(.*?)\n```", intro, re.S)[:2]
    return start_app, run_tests


def test_ci_runs_exactly_the_readme_test_command():
    start_app, run_tests = readme_commands()
    assert ".venv/bin/python -m streamlit run app.py" in start_app and "pip install" not in start_app
    ci_lines = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    assert ci_lines[-1] == run_tests


def python_api_example() -> str:
    """docs/python-api.md's example: the block marked to run as written."""
    page = (ROOT / "docs" / "python-api.md").read_text(encoding="utf-8")
    return re.search(r"<!-- runs as written[^>]*-->\n```python\n(.*?)```", page, re.S).group(1)


def test_the_python_api_example_runs(capsys):
    exec(compile(python_api_example(), "docs/python-api.md", "exec"), {"__name__": "docs_example"})
    printed = capsys.readouterr().out
    assert re.fullmatch(r"completed 2 optimizer steps, last loss \d+\.\d+\n", printed), printed


# --- a fresh install, as a user on Debian 12 does it ---------------------------------------------------------


@pytest.mark.install
@pytest.mark.timeout(3600)
def test_pip_install_with_debians_python_gives_a_working_gradacc(tmp_path):
    """``python3 -m venv`` with Debian's externally managed python3, ``pip install .``, then only the installed
    package (run from another folder, no PYTHONPATH): --version, train with TensorBoard, check, bench, app."""
    if not DEBIAN_PYTHON.exists():
        pytest.skip("no /usr/bin/python3 (this test is about Debian's own interpreter)")
    stdlib = run([DEBIAN_PYTHON, "-c", "import sysconfig; print(sysconfig.get_path('stdlib'))"]).stdout.strip()
    assert (Path(stdlib) / "EXTERNALLY-MANAGED").exists(), "expected an externally managed (PEP 668) python3"

    source = source_copy(tmp_path / "source")
    venv = tmp_path / "venv"
    started = time.perf_counter()
    run([DEBIAN_PYTHON, "-m", "venv", venv])
    run([venv / "bin" / "python", "-m", "pip", "install", "-q", "."], cwd=source)
    install_s = time.perf_counter() - started
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "fresh-install.json").write_text(json.dumps({"venv_and_pip_install_s": round(install_s, 1)}))
    print(f"fresh venv + pip install .: {install_s:.0f} s")

    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": "", "GRADACC_HOME": str(tmp_path / "home"), "GRADACC_DEVICE": "cpu",
           "HF_HUB_OFFLINE": "1"}
    gradacc_command = venv / "bin" / "gradacc"

    def installed(*args, **options):
        return run([gradacc_command, *args], cwd=work, env=env, timeout=900, **options)

    assert installed("--version").stdout.strip() == f"gradacc {gradacc.__version__}"
    where = run([venv / "bin" / "python", "-c", "import gradacc; print(gradacc.__file__)"], cwd=work, env=env)
    assert str(venv) in where.stdout  # the installed package, not the checkout

    trained = installed("train", *TINY_RUN, "--json", "--report-to", "tensorboard", "--log-dir", "logs")
    run_events = [json.loads(line) for line in trained.stdout.splitlines()]
    assert run_events[-1]["status"] == "completed" and len(run_events) == 5  # started, 2 steps, eval, ended
    assert list((work / "logs").glob("*/events.out.tfevents.*"))
    assert "exact" in installed("check", "-m", "4", "-k", "2").stdout
    installed("bench", "memory", "--quick", "--out", "bench")
    assert (work / "bench" / "memory.json").exists()

    server = StreamlitServer(tmp_path / "app-home", tmp_path / "app.log", command=[gradacc_command, "app"], cwd=work,
                             extra_env={"PYTHONPATH": ""})
    try:
        with urllib.request.urlopen(f"{server.url}/_stcore/health", timeout=10) as response:
            assert response.read() == b"ok"
    finally:
        server.stop()
    # Every page, from the installed package's own copy, renders without an exception.
    pages = textwrap.dedent(f"""
        from gradacc.app.command import app_script
        from streamlit.testing.v1 import AppTest
        script = app_script()
        assert "site-packages" in str(script), script
        at = AppTest.from_file(str(script), default_timeout=120).run()
        for page in {PAGES!r}:
            at.switch_page(f"pages/{{page}}.py").run()
            assert not at.exception, (page, [e.value for e in at.exception])
        print("pages ok", len({PAGES!r}))
    """)
    assert "pages ok" in run([venv / "bin" / "python", "-c", pages], cwd=work, env=env, timeout=600).stdout


@pytest.mark.install
@pytest.mark.timeout(3600)
def test_the_readme_commands_work_with_debians_python3(tmp_path):
    """A copy of the checkout without .venv, and python3 = Debian's (externally managed): the README's first
    command installs and serves the app; its second reuses that .venv, adds the test needs and runs pytest."""
    if not DEBIAN_PYTHON.exists():
        pytest.skip("no /usr/bin/python3 (this test is about Debian's own interpreter)")
    checkout = source_copy(tmp_path / "checkout")
    start_app, run_tests = readme_commands()
    # Debian's python3 first on PATH, as on a fresh machine; the test's own interpreter nowhere.
    env = {**os.environ, "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "PYTHONPATH": "",
           "GRADACC_HOME": str(tmp_path / "home"), "GRADACC_DEVICE": "cpu", "HF_HUB_OFFLINE": "1"}
    env.pop("VIRTUAL_ENV", None)
    assert run(["bash", "-c", "command -v python3"], env=env).stdout.strip() == "/usr/bin/python3"

    # The first command as written (the server's port comes through Streamlit's environment variables).
    started = time.perf_counter()
    server = StreamlitServer(tmp_path / "home", tmp_path / "readme-app.log", command=["bash", "-c", start_app],
                             cwd=checkout, extra_env=env, start_timeout=3000)
    try:
        first_s = time.perf_counter() - started
        with urllib.request.urlopen(f"{server.url}/_stcore/health", timeout=10) as response:
            assert response.read() == b"ok"
    finally:
        server.stop()
    venv_python = checkout / ".venv" / "bin" / "python"
    assert run([venv_python, "-c", "import sys; print(sys.base_prefix)"]).stdout.strip() == "/usr"

    install_tests, test_command = run_tests.split(" && ")
    started = time.perf_counter()
    run(["bash", "-c", install_tests], cwd=checkout, env=env, timeout=3000)  # reuses .venv, adds pytest & co.
    second_s = time.perf_counter() - started
    assert test_command == ".venv/bin/python -m pytest"
    collected = run(["bash", "-c", f"{test_command} -q -p no:cacheprovider tests/core/test_config.py"], cwd=checkout,
                    env=env, timeout=600)
    assert " passed" in collected.stdout
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "readme-commands.json").write_text(json.dumps(
        {"first_command_to_healthy_s": round(first_s, 1), "test_install_reusing_venv_s": round(second_s, 1)}))
    print(f"README command 1 to a healthy app: {first_s:.0f} s; test install reusing .venv: {second_s:.0f} s")
