"""Every page opens from the sidebar, as a person would reach it, and shows no traceback."""

from playwright.sync_api import expect

import st_ui

PAGES = ["Start here", "Demos", "Train", "Compare runs", "Equivalence", "Memory planner", "Code"]  # as the sidebar lists them


def test_every_page_opens_from_the_sidebar(page, artifacts):
    st_ui.open_app(page)
    links = st_ui.sidebar_links(page)
    names = [text.split("\n")[-1].strip() for text in links.all_inner_texts()]
    assert names == PAGES, f"sidebar shows {names}"

    for name in [*PAGES[3:], *PAGES[:3]]:  # every page, ending on Train
        st_ui.go_to(page, name)
        expect(st_ui.main(page).locator("h1").first).to_be_visible()
        st_ui.expect_no_exception(page)
        slug = name.lower().replace(" ", "-")
        st_ui.screenshot(page, artifacts / f"page-{slug}.png")
