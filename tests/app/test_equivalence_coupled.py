"""The Equivalence page's "When accumulation is not a big batch": both coupled losses, and a button for their checks
(the checks themselves run in the batchnorm demo's AppTest, tests/app/test_page_demos.py, and in the browser tests of
both demos, tests/browser/test_browser_demos.py)."""

from app_support import open_app


def test_the_section_names_both_coupled_losses_and_offers_their_checks(app_home):
    at = open_app("equivalence")
    assert "When accumulation is *not* a big batch" in [header.value for header in at.header]
    text = " ".join(m.value for m in at.markdown)
    assert "MultipleNegativesRankingLoss" in text and "CachedMultipleNegativesRankingLoss" in text
    assert "BatchNorm" in text and "LayerNorm" in text
    button = at.button(key="run_coupled_checks")
    assert not button.disabled
    assert any("The gradient checks run with the button above" in info.value for info in at.info)
    assert not at.exception
