"""Where gradacc keeps things, and which folders a model or dataset path may come from."""

from __future__ import annotations

import os
from pathlib import Path

from gradacc.errors import GradaccError


def home() -> Path:
    """GRADACC_HOME, default a user cache folder; created on first use."""
    folder = Path(os.environ.get("GRADACC_HOME") or Path.home() / ".cache" / "gradacc").expanduser()
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def models_home() -> Path:
    folder = home() / "models"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def uploads_home() -> Path:
    folder = home() / "uploads"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _dirs_from_env(variable: str, defaults: list[Path]) -> list[Path]:
    raw = os.environ.get(variable)
    folders = [Path(p).expanduser() for p in raw.split(os.pathsep) if p.strip()] if raw else defaults
    return [f.resolve() for f in folders]


def allowed_model_dirs() -> list[Path]:
    """GRADACC_MODEL_DIRS (os.pathsep-separated); default: gradacc's own models folder."""
    return _dirs_from_env("GRADACC_MODEL_DIRS", [models_home()])


def allowed_data_dirs() -> list[Path]:
    """GRADACC_DATA_DIRS (os.pathsep-separated); default: the uploads folder and the working directory."""
    return _dirs_from_env("GRADACC_DATA_DIRS", [uploads_home(), Path.cwd()])


def confined(path: str | Path, allowed: list[Path], field: str, what: str) -> Path:
    """Resolve ``path`` (symlinks too) and refuse it unless it lies inside one of ``allowed``."""
    resolved = Path(path).expanduser().resolve()
    if not any(resolved == folder or folder in resolved.parents for folder in allowed):
        places = ", ".join(str(f) for f in allowed)
        raise GradaccError(f"{what} {str(path)!r} is outside the allowed folders ({places}).", field)
    return resolved
