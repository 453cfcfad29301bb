"""The Hugging Face Hub: used only when a person names a hub id, and only when it can be reached.

Offline, ``from_pretrained`` can spend a long time in retries; a demo must not hang, so a hub id is
first checked with one short connection attempt and refused in seconds with a clear sentence.
"""

from __future__ import annotations

import os
import socket
import threading
from typing import Mapping
from urllib.parse import urlparse

from gradacc.labels import field_label
from gradacc.errors import GradaccError

CONNECT_TIMEOUT_S = 3.0


def hub_allowed(environ: Mapping[str, str] | None = None) -> bool:
    """GRADACC_ALLOW_HUB: 0, false or no refuse hub ids (default: allowed)."""
    env = os.environ if environ is None else environ
    return env.get("GRADACC_ALLOW_HUB", "1").strip().lower() not in ("0", "false", "no")


def hub_reachable(timeout: float = CONNECT_TIMEOUT_S) -> bool:
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes"):
        return False
    endpoint = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    answer: list[bool] = []

    def probe() -> None:
        try:
            with socket.create_connection((endpoint.hostname, port), timeout=timeout):
                answer.append(True)
        except (OSError, UnicodeError):
            answer.append(False)

    # The socket timeout does not cover the name lookup, which can hang for many seconds on a broken
    # network (a conference Wi-Fi): wait for the probe at most ``timeout``, and leave a slow one behind.
    thread = threading.Thread(target=probe, name="gradacc-hub-probe", daemon=True)
    thread.start()
    thread.join(timeout)
    return bool(answer and answer[0])


def require_online(name: str, field: str) -> None:
    """Refuse a hub id fast when hub ids are disabled or the hub cannot be reached."""
    what = "model" if field == "model" else "dataset"
    label = field_label(field)
    if not hub_allowed():
        raise GradaccError(f"{label} must be a built-in {what} or a local path: hub ids are disabled on this "
                           f"deployment; got {name!r}.", field)
    if not hub_reachable():
        raise GradaccError(f"{label} {name!r} is a hub id, and the Hugging Face Hub cannot be reached (offline?); "
                           f"pick a built-in {what} or a local folder.", field)
