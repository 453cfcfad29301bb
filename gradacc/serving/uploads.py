"""Data files visitors upload: kept under the uploads folder, size-capped, named safely, pruned.

The same content is stored once (its hash is in the name), and only the newest ``KEEP_UPLOADS`` files stay,
so a public server's disk does not fill up.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from pathlib import Path

from gradacc import paths
from gradacc.errors import GradaccError
from gradacc.serving.limits import Limits
from gradacc.training.sources.data import FILE_SUFFIXES  # light: no torch, no pandas at import

KEEP_UPLOADS = 100


def save_upload(filename: str, content: bytes, limits: Limits) -> Path:
    """Keep an uploaded data file under the uploads folder; the same content reuses the same file."""
    suffix = Path(filename).suffix.lower()
    if suffix not in FILE_SUFFIXES:
        raise GradaccError(f"{filename!r} is not a CSV or JSONL file.", "dataset")
    if len(content) > limits.max_upload_bytes:
        raise GradaccError(f"{filename!r} is {len(content) / 1e6:.1f} MB; this deployment accepts uploads up to "
                           f"{limits.max_upload_mb:g} MB.", "dataset")
    if not content:
        raise GradaccError(f"{filename!r} is empty.", "dataset")
    # Never trust the visitor's file name as a path: keep safe characters, add the content hash.
    stem = re.sub(r"[^A-Za-z0-9_-]+", "_", Path(filename).stem)[:40].strip("_") or "data"
    folder = paths.uploads_home()
    target = folder / f"{stem}-{hashlib.sha256(content).hexdigest()[:16]}{suffix}"
    if not target.exists():
        handle, staging = tempfile.mkstemp(dir=folder, prefix=".upload-")
        with os.fdopen(handle, "wb") as file:
            file.write(content)
        os.replace(staging, target)  # a reader never sees half a file
        _prune(folder, KEEP_UPLOADS)
    return target


def _prune(folder: Path, keep: int) -> None:
    files = sorted((p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")),
                   key=lambda p: p.stat().st_mtime, reverse=True)
    for old in files[keep:]:
        old.unlink(missing_ok=True)
