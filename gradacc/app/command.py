"""``gradacc app``: start the Streamlit app, from an installed package or from a checkout.

An installed gradacc carries the app's pages and Streamlit settings inside the package (the wheel maps the
checkout's ``pages/`` to ``gradacc/app/pages/`` and ``.streamlit/`` to ``gradacc/app/streamlit_config/``); a
checkout has them at its root, beside ``app.py``. Streamlit reads ``.streamlit/config.toml`` only from the
working directory, so the settings are passed as flags: the same server wherever it is started from.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
CHECKOUT = HERE.parent.parent


def app_script() -> Path:
    """The main script: the package's own where its pages were installed beside it, else the checkout's app.py."""
    if (HERE / "pages").is_dir():
        return HERE / "streamlit_app.py"
    return CHECKOUT / "app.py"


def config_file() -> Path:
    installed = HERE / "streamlit_config" / "config.toml"
    return installed if installed.is_file() else CHECKOUT / ".streamlit" / "config.toml"


def config_flags(path: Path | None = None) -> list[str]:
    """``[server] headless = true`` -> ``--server.headless=true``, for every setting in the config file."""
    with open(path or config_file(), "rb") as file:
        settings = tomllib.load(file)
    flags = []
    for section, values in settings.items():
        for name, value in values.items():
            text = str(value).lower() if isinstance(value, bool) else str(value)
            flags.append(f"--{section}.{name}={text}")
    return flags


def streamlit_command(extra: list[str]) -> list[str]:
    """``python -m streamlit run <main script> <settings> <extra>``: flags given by the user come last and win."""
    return [sys.executable, "-m", "streamlit", "run", str(app_script()), *config_flags(), *extra]
