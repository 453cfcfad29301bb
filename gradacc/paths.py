"""Where gradacc keeps things, what a model or dataset name means (a path or a hub id), and which folders
a path may come from."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from gradacc.errors import GradaccError
from gradacc.labels import field_label


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


DATA_FILE_SUFFIXES = (".csv", ".jsonl", ".json")


def model_is_local(name: str) -> bool:
    """A model name that means a folder, not a hub id: it exists, is absolute, or starts with '.' or '~'."""
    path = Path(name).expanduser()
    return path.exists() or path.is_absolute() or name.startswith((".", "~"))


def dataset_is_local(name: str) -> bool:
    """A dataset name that means a file or folder, not a hub id (a data file suffix also says so)."""
    return Path(name).suffix.lower() in DATA_FILE_SUFFIXES or model_is_local(name)


def hub_id_problem(name: str) -> str | None:
    """Why ``name`` cannot be a hub id ("org/name", "name"), in huggingface_hub's own rules; None if it can."""
    # here: huggingface_hub.errors imports httpx, 65-100 ms (python -X importtime, 3 tries, 2 busy cores), which every
    # page and `gradacc --help` (~100-110 ms in all) would pay: this module is the ground floor
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError as error:
        return str(error).split(": '")[0].split(". ")[0]  # its first rule, without the name repeated
    return None


@dataclass(frozen=True)
class Confinement:
    """Where local model and data paths may come from: a policy chosen by the caller, not a global.

    The app confines its visitors to the deployment's folders (``Confinement.for_visitors()``: GRADACC_DATA_DIRS
    and GRADACC_MODEL_DIRS); the command line trusts its user (``TRUST_USER``: any path the user can read).
    ``None`` folders mean anywhere.
    """
    data_dirs: tuple[Path, ...] | None = None
    model_dirs: tuple[Path, ...] | None = None

    @classmethod
    def for_visitors(cls) -> "Confinement":
        return cls(tuple(allowed_data_dirs()), tuple(allowed_model_dirs()))

    def data_path(self, path: str | Path) -> Path:
        return _resolved(path, self.data_dirs, "dataset")

    def model_path(self, path: str | Path) -> Path:
        return _resolved(path, self.model_dirs, "model")


TRUST_USER = Confinement()


def visitors_unless(confinement: Confinement | None) -> Confinement:
    """The caller's policy; when it gives none, the strict one (a forgotten argument never opens the disk)."""
    return confinement if confinement is not None else Confinement.for_visitors()


def _resolved(path: str | Path, allowed: tuple[Path, ...] | None, field: str) -> Path:
    """Resolve ``path`` (symlinks too); refuse it unless ``allowed`` is None or it lies inside one of them."""
    resolved = Path(path).expanduser().resolve()
    if allowed is not None and not any(resolved == folder or folder in resolved.parents for folder in allowed):
        places = ", ".join(str(f) for f in allowed)
        raise GradaccError(f"{field_label(field)} {str(path)!r} is outside the allowed folders ({places}).", field)
    return resolved
