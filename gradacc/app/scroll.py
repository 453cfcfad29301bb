"""Bring a keyed container into view: after "Run this demo" the live runs, and their result when it arrives, must
be on the projector without the speaker scrolling (the click itself changes only the button, at the top).

A zero-height ``components.v1.html`` frame (same origin as the page) runs a short script that finds the
container by its ``st-key-`` class in the parent document and scrolls it to the top of the view, below
Streamlit's header. A frame renders again only when its HTML changes, so ``nonce`` (e.g. the runs' ids) makes
each wanted scroll happen once.
"""

from __future__ import annotations

import json

import streamlit.components.v1 as components_v1

# Streamlit's header covers the top of the view: stop this far below it.
HEADER_MARGIN = "4.5rem"

_SCRIPT = """<script>
// {nonce}
(function () {{
  let tries = 0;
  function go() {{
    const target = window.parent.document.querySelector({selector});
    if (!target) {{ if (++tries < 50) setTimeout(go, 100); return; }}
    target.style.scrollMarginTop = {margin};
    target.scrollIntoView({{block: "start", behavior: "instant"}});
  }}
  go();
}})();
</script>"""


def into_view(key: str, nonce: str) -> None:
    """Scroll the container ``st.container(key=key)`` to the top of the view, once per ``nonce``."""
    components_v1.html(_SCRIPT.format(nonce=nonce.replace("\n", " "), selector=json.dumps(f".st-key-{key}"),
                                      margin=json.dumps(HEADER_MARGIN)), height=0)
