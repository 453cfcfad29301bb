"""Every page opens from the sidebar, as a person would reach it, and shows no traceback and logs no console
error; each page opened by its own link logs none either (but Streamlit's own probes: st_ui.UPSTREAM_PROBE)."""

import pytest
from playwright.sync_api import expect

import st_ui
from chromium import PROJECTOR, WIDE_PROJECTOR
from gradacc.analysis import demos

PAGES = ["Start here", "Demos", "Train", "Compare runs", "Equivalence", "Audit", "Memory planner", "Code"]  # the sidebar's
LINKS = ["/", "/demos?demo=same-curve", "/train", "/compare", "/equivalence", "/audit", "/planner", "/code"]


def test_every_page_opens_from_the_sidebar_without_a_console_error(page, artifacts):
    problems = st_ui.console_problems(page)
    st_ui.open_app(page, "/")
    links = st_ui.sidebar_links(page)
    names = [text.split("\n")[-1].strip() for text in links.all_inner_texts()]
    assert names == PAGES, f"sidebar shows {names}"

    for name in [*PAGES[3:], *PAGES[:3]]:  # every page, ending on Train
        st_ui.go_to(page, name)
        expect(st_ui.main(page).locator("h1").first).to_be_visible()
        st_ui.expect_no_exception(page)
        slug = name.lower().replace(" ", "-")
        st_ui.screenshot(page, artifacts / f"page-{slug}.png")
    for link in LINKS:
        st_ui.open_app(page, link)
        expect(st_ui.main(page).locator("h1").first).to_be_visible()
    assert problems == []


def test_a_demo_link_is_the_first_request_of_a_fresh_server(browser, tmp_path):
    # Until the app's entry has run once, Streamlit answers a page's link with the pages/ file alone (a sidebar of
    # file names, no wide layout); the page then runs the app (navigation.under_navigation), which draws it.
    from support import StreamlitServer

    server = StreamlitServer(tmp_path / "home", tmp_path / "streamlit.log", {})
    try:
        context = browser.new_context(base_url=server.url)
        page = context.new_page()
        st_ui.open_app(page, "/demos?demo=memory-wall")
        expect(page.get_by_role("heading", name="The memory wall: out of memory, then fit with accumulation")
               ).to_be_visible()
        names = [text.split("\n")[-1].strip() for text in st_ui.sidebar_links(page).all_inner_texts()]
        assert names == PAGES, names
        context.close()
    finally:
        server.stop()


# Each page link on a page: its text, and the boxes (from the text up to the link) that cut it, if any.
LINK_CUTS = """link => {
  const text = link.querySelector('p') || link;
  const drawn = text.getBoundingClientRect();
  const cut = [];
  for (let box = text; box && box !== link.parentElement; box = box.parentElement) {
    const edge = box.getBoundingClientRect();
    if (box.scrollWidth > box.clientWidth || drawn.right > edge.right + 0.5 || drawn.right > innerWidth) {
      cut.push(`${box.tagName} ${box.scrollWidth} > ${box.clientWidth}`);
    }
  }
  return [text.innerText, cut];
}"""


@pytest.mark.parametrize("screen", [PROJECTOR, WIDE_PROJECTOR], ids=["1280x720", "1440x900"])
def test_the_landing_page_shows_every_demo_title_whole(page, artifacts, screen):
    page.set_viewport_size(screen)
    st_ui.open_app(page, "/")
    links = st_ui.main(page).locator("[data-testid=stPageLink-NavLink]")
    expect(links.first).to_be_visible()
    found = [link.evaluate(LINK_CUTS) for link in links.all()]
    titles = [text for text, _ in found]
    assert all(scenario.title in titles for scenario in demos.SCENARIOS.values()), titles
    assert [(text, cut) for text, cut in found if cut] == []
    page.screenshot(path=str(artifacts / f"page-start-here-{screen['width']}x{screen['height']}.png"))


def test_no_label_or_column_header_is_cut_off_on_any_page_at_1280x720(page, artifacts):
    """On a projector a cut label reads as another setting ("Shard the model (…"), and a table wider than the page
    hides its last column. Every page, its expanders open."""
    page.set_viewport_size(PROJECTOR)
    cut = {}
    for link in LINKS:
        st_ui.open_app(page, link)
        expect(st_ui.main(page).locator("h1").first).to_be_visible()
        for summary in st_ui.main(page).locator("[data-testid=stExpander] summary").all():
            summary.click()
        if link == "/equivalence":
            expect(st_ui.main(page).locator("[data-testid=stDataFrame] .dvn-scroller").first).to_be_visible()  # the families
        st_ui.wait_for_app(page)
        cut[link] = st_ui.cut_text(page)
        st_ui.screenshot(page, artifacts / f"page-{link.strip('/').split('?')[0] or 'home'}-1280x720.png")
    assert {link: found for link, found in cut.items() if found} == {}
