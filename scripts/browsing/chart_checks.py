"""What a room must be able to read on a chart, checked on the boxes the browser drew (the Demos page's live charts,
and a replay page's): titles on two lines at most, no tick label over another, no legend over an axis title or its
ticks, no plot toolbar shown over a chart."""

from __future__ import annotations

# Problems of every displayed chart matching a selector, as sentences (empty: none).
CHART_PROBLEMS = """(selector) => {
  const problems = [];
  const box = (element) => element.getBoundingClientRect();
  const overlap = (a, b) => a.left < b.right - 1 && b.left < a.right - 1 && a.top < b.bottom - 1 && b.top < a.bottom - 1;
  for (const chart of document.querySelectorAll(selector)) {
    if (chart.offsetParent === null || !chart.querySelector('.main-svg')) continue;  // folded away, or not drawn yet
    const title = chart.querySelector('.gtitle');
    const name = title ? title.textContent : '(untitled chart)';
    const lines = title ? Math.max(1, title.querySelectorAll('tspan.line').length) : 0;
    if (lines > 2) problems.push(`${name}: title on ${lines} lines`);
    for (const axis of ['xtick', 'x2tick']) {
      const ticks = [...chart.querySelectorAll(`g.${axis} text`)].map(box).filter((b) => b.width > 0);
      for (let i = 0; i < ticks.length; i++) {
        for (let j = i + 1; j < ticks.length; j++) {
          if (overlap(ticks[i], ticks[j])) problems.push(`${name}: two x tick labels overlap`);
        }
      }
    }
    const legend = chart.querySelector('g.legend');
    if (legend && box(legend).width > 0) {
      for (const other of chart.querySelectorAll('.g-xtitle, .g-x2title, .g-ytitle, .g-y2title, g.xtick text, g.x2tick text')) {
        if (box(other).width > 0 && overlap(box(legend), box(other))) {
          problems.push(`${name}: the legend covers "${other.textContent}"`);
        }
      }
    }
    const toolbar = chart.querySelector('.modebar');
    if (toolbar && box(toolbar).width > 0 && getComputedStyle(toolbar).opacity !== '0') {
      problems.push(`${name}: its toolbar is shown over it`);
    }
  }
  return problems;
}"""


def chart_problems(page, selector: str) -> list[str]:
    return page.evaluate(CHART_PROBLEMS, selector)
