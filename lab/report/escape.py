"""The one set of Markdown escaping helpers, registered as Jinja filters by lab.report.writer and used
by every Markdown output (report.md, bisect.md, ablation.md, localize.md, `lab comment`, the triage
comment). Each takes the value as it is and returns Markdown; the templates apply them, the Python
side hands over plain values.

- `md`: free text on a line: `<` and `>` become entities, so a `<module>` in an exception is shown
  and not taken for an HTML tag by GitHub.
- `cell`: a table cell: as `md`, plus `|` escaped and line breaks made spaces (a cell is one line);
  an empty value becomes `empty` (bisect.md shows `—`).
- `code`: inline code: backticks around the text, more of them than any run inside it.
- `details`: a collapsed block: `<details>` with an HTML-escaped `<summary>`, and the body in a fence
  longer than any backtick run in it (`lang` names the fence's language; None puts the body in as
  Markdown, unfenced).
"""

from __future__ import annotations

import re
from urllib.parse import quote

__all__ = ["FILTERS", "cell", "code", "details", "md", "url"]

_TICKS = re.compile(r"`+")


def md(text: object) -> str:
    return str(text).replace("<", "&lt;").replace(">", "&gt;")


def cell(text: object, empty: str = "") -> str:
    out = md(text).replace("|", "\\|").replace("\r\n", " ").replace("\n", " ")
    return out or empty


def _longest_ticks(text: str) -> int:
    return max((len(m) for m in _TICKS.findall(text)), default=0)


def code(text: object) -> str:
    text = str(text)
    ticks = "`" * (_longest_ticks(text) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def html(text: object) -> str:
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def details(body: object, summary: str, lang: str | None = "text") -> str:
    """The block, ending with `</details>` and no newline after it."""
    body = str(body).rstrip()
    head = f"<details>\n<summary>{html(summary)}</summary>\n\n"
    if lang is None:
        return f"{head}{body}\n\n</details>"
    fence = "`" * max(3, _longest_ticks(body) + 1)
    return f"{head}{fence}{lang}\n{body}\n{fence}\n\n</details>"


def url(text: object) -> str:
    """A path for a Markdown link target (`[name](<url>)`), percent-quoted."""
    return quote(str(text))


FILTERS = {"md": md, "cell": cell, "code": code, "details": details, "url": url, "html": html}
