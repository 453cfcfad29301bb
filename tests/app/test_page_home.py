"""The landing page: one sentence of what gradacc shows, one click to each demo and to Train; an old run link
(/?run=ID) still opens the run on Train."""

from app_support import APP, SCRIPT_TIMEOUT_S, open_app
from streamlit.testing.v1 import AppTest

from gradacc.analysis import demos
from gradacc.app import server


def test_the_landing_page_says_what_gradacc_shows_and_offers_the_demos_and_train(app_home):
    at = open_app(None)
    assert at.title[0].value == "gradacc: gradient accumulation, live"
    assert at.markdown[0].value == f"#### {server.PITCH}" and server.PITCH.count(". ") == 0  # one sentence
    links = {link.proto.label: (link.proto.page, link.proto.query_string) for link in at.get("page_link")}
    for scenario in demos.SCENARIOS.values():
        page, query = links[scenario.title]
        assert page.endswith("demos") and query == f"demo={scenario.name}"
    assert links["Train"][0].endswith("train")
    assert links["Audit: is Trainer's default right for your model?"][0].endswith("audit")
    assert not at.exception and not at.button  # nothing to press here but links
    # Its times are the measured ones (docs/demos.md, tests/analysis/test_demos.py), not a promise.
    quickest, slowest = demos.MEASURED_RESULT_S
    assert any(f"the result, {quickest}–{slowest} s after the click" in caption.value for caption in at.caption)
    assert not any("half a minute" in caption.value for caption in at.caption)


def test_an_old_run_link_opens_the_run_on_train(app_home):
    at = AppTest.from_file(APP, default_timeout=SCRIPT_TIMEOUT_S)
    at.query_params["run"] = "20250101-120000-abcdef"
    at.run()
    assert at.title[0].value == "Gradient accumulation, live" and not at.exception
    assert at.query_params["run"] in ("20250101-120000-abcdef", ["20250101-120000-abcdef"])

