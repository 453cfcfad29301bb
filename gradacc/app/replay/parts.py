"""The replay page's text, as HTML in the app's look (replay.css): the runs' panels, the headline box and the line
under it, the warnings, the table, the gradient checks. Every text is escaped before the little Markdown the app
uses (**bold**, `code`) becomes tags, so nothing recorded becomes HTML."""

from __future__ import annotations

import html
import re

from gradacc.app.equivalence_view import coupled_columns, coupled_summary


def _icon(color: str, shape: str) -> str:
    """A 1.1em icon drawn inline: a page opened on a machine with no emoji font shows it as drawn, not as a box."""
    return (f'<svg viewBox="0 0 20 20" width="1.1em" height="1.1em" aria-hidden="true">'
            f'<circle cx="10" cy="10" r="9.5" fill="{color}"/>{shape}</svg>')


_STROKE = 'fill="none" stroke="white" stroke-width="2.4" stroke-linecap="round"'
# The app's alert kinds (st.success, st.info, ...) and their icons, in Streamlit's alert colours.
ICONS = {"success": _icon("#21c354", f'<path d="M5.5 10.5l3 3 6-6.5" {_STROKE}/>'),
         "info": _icon("#1c83e1", f'<path d="M10 9v5.5" {_STROKE}/><circle cx="10" cy="5.8" r="1.4" fill="white"/>'),
         "warning": _icon("#e8a317", f'<path d="M10 5v6" {_STROKE}/><circle cx="10" cy="14.6" r="1.4" fill="white"/>'),
         "error": _icon("#ff2b2b", f'<path d="M6.5 6.5l7 7M13.5 6.5l-7 7" {_STROKE}/>')}


def markdown(text: str) -> str:
    """Paragraphs, **bold** and `code`: the Markdown the demos' texts and the headline's line use."""
    out = []
    for paragraph in (p.strip() for p in re.split(r"\n\s*\n", text or "") if p.strip()):
        out.append(f"<p>{inline(paragraph)}</p>")
    return "\n".join(out)


def inline(text: str) -> str:
    escaped = html.escape(text)
    escaped = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", escaped)
    escaped = re.sub(r"\*(.+?)\*", r"<em>\1</em>", escaped)
    return re.sub(r"`(.+?)`", r"<code>\1</code>", escaped)


def alert(kind: str, body: str, icon: str | None = None) -> str:
    return (f'<div class="alert {kind}"><span class="icon">{icon or ICONS.get(kind, "")}</span>'
            f'<div class="body">{body}</div></div>')


def panels(rows: list[tuple[str, str, str, tuple[float, str] | None]], waiting: bool) -> str:
    """One column per run: its name, its status sentence in its alert kind, its progress bar (as runview says)."""
    columns = []
    for label, kind, sentence, bar in rows:
        progress = "" if bar is None else (
            f'<div class="progress"><div class="text">{html.escape(bar[1])}</div>'
            f'<div class="track"><div class="fill" style="width:{100 * bar[0]:.1f}%"></div></div></div>')
        columns.append(f'<div class="panel"><p><strong>{html.escape(label)}</strong></p>'
                       f'{alert(kind, html.escape(sentence))}{progress}</div>')
    note = '<p class="caption">The result is written here when both runs are done.</p>' if waiting else ""
    return f'<div class="panels" style="--columns:{max(1, len(rows))}">{"".join(columns)}</div>{note}'


def headline(figures: dict | None, kind: str | None, against: str) -> str:
    """The result box: the headline as a heading, the line naming which run is described against which."""
    if figures is None:
        return ""
    return alert(kind or "success", f"<h3>{html.escape(figures['headline'])}</h3><p>{inline(against)}</p>")


def warnings(lines: list[str]) -> str:
    return "".join(f'<p class="caption">{html.escape(line)}</p>' for line in lines)


def table(rows: list[dict], columns: list[str]) -> str:
    head = "".join(f"<th>{html.escape(column)}</th>" for column in columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_cell(row.get(column)))}</td>" for column in columns) + "</tr>"
                   for row in rows)
    return f'<div class="table"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:,.4g}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return "" if value is None else str(value)


def checks(reports: list[dict]) -> str:
    """The gradient checks' sentences and table, as the demo shows them under its runs."""
    sentences, rows = coupled_summary(reports)
    shown = coupled_columns(rows)
    for row in rows:
        row["relative error"] = f"{row['relative error']:.2e}"
    items = "".join(f"<li>{inline(sentence)}</li>" for sentence in sentences)
    return f"<h3>Gradients against the big batch</h3><ul>{items}</ul>{table(rows, shown)}"
