"""Bring a keyed container into view: after "Run this demo" the live runs, and their result when it arrives, must
be on the projector without the speaker scrolling (the click itself changes only the button, at the top).

A one-pixel ``st.iframe`` (its HTML inline: same origin as the page) runs a short script that finds the container
by its ``st-key-`` class in the parent document and scrolls it to the top of the view, below Streamlit's header. A
frame renders again only when its HTML changes, so ``nonce`` (e.g. the runs' ids) makes each wanted scroll happen
once. A frame, not ``st.html`` with its JavaScript allowed: the script's timers (``SETTLE_MS``) end with the frame,
so a scroll the page no longer draws stops putting its container back. ``st.iframe`` refuses a height of 0, and
sizing to its content gave the empty frame 150 pixels.
"""

from __future__ import annotations

import json

import streamlit as st

# Streamlit's header covers the top of the view: stop this far below it.
HEADER_MARGIN = "4.5rem"

# The page may still settle after the scroll (a run's panel above changes height as it ends): the container is put
# back at the top a few times over SETTLE_MS, unless the viewer scrolls (wheel, touch, a key) meanwhile.
SETTLE_MS = (150, 400, 800, 1500, 2500)

_SCRIPT = """<script>
// {nonce}
(function () {{
  const page = window.parent;
  let tries = 0, viewerMoved = false;
  const stop = () => {{ viewerMoved = true; }};
  for (const kind of ["wheel", "touchstart", "keydown"]) page.addEventListener(kind, stop, {{once: true}});
  function place() {{
    const target = page.document.querySelector({selector});
    if (!target) return false;
    target.style.scrollMarginTop = {margin};
    target.scrollIntoView({{block: "start", behavior: "instant"}});
    return true;
  }}
  function go() {{
    if (!place()) {{ if (++tries < 50) setTimeout(go, 100); return; }}
    for (const ms of {settle}) setTimeout(() => {{ if (!viewerMoved) place(); }}, ms);
  }}
  go();
}})();
</script>"""


def into_view(key: str, nonce: str) -> None:
    """Scroll the container ``st.container(key=key)`` to the top of the view, once per ``nonce``."""
    st.iframe(_SCRIPT.format(nonce=nonce.replace("\n", " "), selector=json.dumps(f".st-key-{key}"),
                             margin=json.dumps(HEADER_MARGIN), settle=json.dumps(list(SETTLE_MS))),
              height=1)
