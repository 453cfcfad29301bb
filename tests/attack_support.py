"""Shared pieces of the attack battery (tests/attack/).

- ``cli``: ``python -m gradacc`` in-process (a subprocess per case would spend seconds importing torch), with
  the checks every bad-input case must pass: exit code, exactly one ``error:`` line, no traceback.
- ``sabotage``: make the built-in model's training forward misbehave, for one run only (picked by seed).
- ``add_noise`` / ``hide_dropout``: a tiny-bert random at dropout 0, or one whose dropout gradacc cannot reach.
- ``Visitor``: a browserless visitor of a real ``streamlit run app.py`` (``support.StreamlitServer``) that speaks
  Streamlit's websocket protocol (protobuf BackMsg/ForwardMsg), so server-level checks need no browser.
- ``read_store`` / ``integrity_check``: the server's SQLite file, read from outside.
"""

from __future__ import annotations

import json

import sqlite3
import time
from pathlib import Path

from support import StreamlitServer
# Small enough to finish in about a second on 2 CPU cores once torch is warm.
TINY = dict(train_samples=48, eval_samples=16, epochs=1, micro_batch_size=8, grad_accum_steps=2, max_seq_length=32)
TINY_ARGS = ["--train-samples", "48", "--eval-samples", "16", "--epochs", "1", "--max-seq-length", "32"]


# ---- the command line, in-process ------------------------------------------------------------------

def cli(capsys, *argv: str) -> tuple[int, str, str]:
    """Run ``python -m gradacc ARGV`` in this process; (exit code, stdout, stderr)."""
    from gradacc.cli import main

    capsys.readouterr()  # drop whatever earlier code printed
    try:
        code = main(list(argv))
    except SystemExit as exit_:
        code = exit_.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_error_line(code: int, out: str, err: str, expected_code: int, *fragments: str) -> str:
    """Exit ``expected_code``; stderr is exactly one ``error:`` line holding every fragment; no traceback."""
    assert "Traceback" not in out + err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    assert code == expected_code, (code, lines[0])
    return lines[0]


# ---- faults inside the built-in model --------------------------------------------------------------

def sabotage(monkeypatch, fault, after_forwards: int = 0, seed: int | None = None, counter: dict | None = None):
    """From its ``after_forwards``+1-th training forward on, the tiny BERT returns ``fault(output)``.

    ``seed``: only runs with that seed are sabotaged (other visitors' runs train normally).
    ``counter``: gets ``n``, the training forwards so far of the sabotaged run.
    """
    import torch

    from gradacc.training.sources import models

    original = models.tiny_bert
    calls = counter if counter is not None else {}
    calls["n"] = 0

    def faulty_tiny_bert(num_labels, id2label, run_seed, *args, **kwargs):
        model = original(num_labels, id2label, run_seed, *args, **kwargs)
        if seed is not None and run_seed != seed:
            return model

        def hook(module, inputs, output):
            # Training forwards only: not the no-grad passes that test whether the run's dropout took.
            if module.training and torch.is_grad_enabled():
                calls["n"] += 1
                if calls["n"] > after_forwards:
                    return fault(output)
            return output

        model.register_forward_hook(hook)
        return model

    monkeypatch.setattr(models, "tiny_bert", faulty_tiny_bert)
    return calls


def add_noise(monkeypatch):
    """tiny-bert with a custom module drawing randomness in training mode without torch's Dropout: gradacc
    cannot switch it off."""
    import torch

    from gradacc.training.sources import models

    class AddNoise(torch.nn.Module):
        def forward(self, hidden):
            return hidden + 0.1 * torch.randn_like(hidden) if self.training else hidden

    def noisy(build):
        model = build()
        embeddings = model.bert.embeddings
        embeddings.LayerNorm = torch.nn.Sequential(embeddings.LayerNorm, AddNoise())
        return model

    original = models.tiny_bert
    monkeypatch.setattr(models, "tiny_bert", lambda *args, **kwargs: noisy(lambda: original(*args, **kwargs)))


def hide_dropout(monkeypatch):
    """tiny-bert inside a wrapper that keeps it in eval mode: its dropout never draws, out of gradacc's reach."""
    import torch

    from gradacc.training.sources import models

    class AlwaysEval(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, **batch):
            return self.inner.eval()(**batch)

    original = models.tiny_bert
    monkeypatch.setattr(models, "tiny_bert", lambda *args, **kwargs: AlwaysEval(original(*args, **kwargs)))


def nan_loss(output):
    output.logits = output.logits * float("nan")
    if output.loss is not None:
        output.loss = output.loss * float("nan")
    return output


# ---- a visitor without a browser -----------------------------------------------------------------

class Visitor:
    """A browser tab without a browser: one websocket session on the app, driven with Streamlit's own protobufs.

    ``rerun`` does what the browser does when a widget changes: it sends every widget value it wants set
    (by widget key) and reads the page the script draws, until ``script_finished``.
    """

    def __init__(self, server: StreamlitServer, query_string: str = "", page: str = "train"):
        from websockets.sync.client import connect

        self.query_string = query_string
        self.page = page  # the page's URL path: the Train page, unless told otherwise
        self.socket = connect(f"ws://127.0.0.1:{server.port}/_stcore/stream", subprotocols=["streamlit"],
                              origin=server.url, open_timeout=10, max_size=None)
        self.socket.__enter__()  # the context-manager form (a bare connect() is deprecated)
        self.elements: list = []  # the protobuf Elements of the last script run, in arrival order
        self._page_hash = ""

    def close(self) -> None:
        self.socket.close()

    def rerun(self, values: dict | None = None, click: str | None = None, timeout: float = 60.0) -> "Visitor":
        from streamlit.proto.BackMsg_pb2 import BackMsg
        from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

        message = BackMsg()
        state = message.rerun_script
        state.query_string = self.query_string
        state.page_script_hash = "" if self.page else self._page_hash  # a named page is found by its name
        state.page_name = self.page
        for key, value in (values or {}).items():
            widget = state.widget_states.widgets.add()
            widget.id = self.widget_id(key)
            if isinstance(value, bool):
                widget.bool_value = value
            elif isinstance(value, int):
                widget.int_value = value
            elif isinstance(value, float):
                widget.double_value = value
            else:
                widget.string_value = value
        if click:
            widget = state.widget_states.widgets.add()
            widget.id = self.widget_id(click)
            widget.trigger_value = True
        self.socket.send(message.SerializeToString())
        elements = []
        deadline = time.monotonic() + timeout
        while True:
            raw = self.socket.recv(timeout=max(0.1, deadline - time.monotonic()))
            forward = ForwardMsg()
            forward.ParseFromString(raw)
            kind = forward.WhichOneof("type")
            if kind == "new_session":
                self._page_hash = self._page_hash or forward.new_session.page_script_hash
            elif kind == "delta" and forward.delta.WhichOneof("type") == "new_element":
                elements.append(forward.delta.new_element)
            elif kind == "script_finished":
                if forward.script_finished == ForwardMsg.FINISHED_EARLY_FOR_RERUN:
                    elements = []  # st.rerun(): the page is redrawn from the top
                    continue
                if forward.script_finished == ForwardMsg.FINISHED_FRAGMENT_RUN_SUCCESSFULLY:
                    continue  # a fragment's own rerun, not the one asked for
                self.elements = elements
                return self

    def widget_id(self, key: str) -> str:
        for element in self.elements:
            proto = getattr(element, element.WhichOneof("type"))
            element_id = getattr(proto, "id", "")
            if element_id.endswith(f"-{key}"):
                return element_id
        raise AssertionError(f"no widget with key {key!r} on the page")

    def of(self, kind: str) -> list:
        return [getattr(e, kind) for e in self.elements if e.WhichOneof("type") == kind]

    def alerts(self) -> list[str]:
        return [alert.body for alert in self.of("alert")]

    def figures(self) -> list[dict]:
        """Every plotly figure the page sent: st.plotly_chart's spec, or a live chart's (gradacc.app.live_chart)."""
        return ([json.loads(chart.spec) for chart in self.of("plotly_chart")]
                + [json.loads(json.loads(live.json)["figure"]) for live in self.of("bidi_component")
                   if live.component_name == "gradacc.live_chart"])

    def has_widget(self, key: str) -> bool:
        try:
            self.widget_id(key)
        except AssertionError:
            return False
        return True


# ---- the run store, read from outside the server ---------------------------------------------------

def read_store(path: Path, sql: str, params: tuple = ()) -> list[tuple]:
    """A read-only look at the server's SQLite file (WAL lets it read while the server writes)."""
    connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    try:
        return connection.execute(sql, params).fetchall()
    finally:
        connection.close()


def integrity_check(path: Path) -> str:
    connection = sqlite3.connect(path, timeout=10)
    try:
        return connection.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        connection.close()
