"""The one report writer: every Markdown and HTML output of the lab is a Jinja template in
lab/report/templates/, rendered here with one environment.

Markdown: report.md, bisect.md, ablation.md, localize.md, the paste-ready comment (`lab comment`,
comment.md.j2) and the triage comment (triage.md.j2). HTML: report.html of run, bisect and matrix
folders (`*.html.j2`), which the environment autoescapes by the template's name. The Python side
prepares plain values (a small frozen view per output); the templates lay them out and escape with
the filters of lab.report.escape (`md`, `cell`, `code`, `details`, `url`), the only Markdown escaping
in the lab. Undefined names are errors (StrictUndefined), and trim_blocks/lstrip_blocks let a
`{% ... %}` line vanish, so the templates read like the outputs they write. The templates are package
data (`lab.report`'s `templates/*.j2`), read through importlib.resources like the Dockerfile templates.
"""

from __future__ import annotations

import functools
import importlib.resources

import jinja2

from lab.core.resources import traversable_loader
from lab.report.escape import FILTERS

__all__ = ["render"]


def _is_html(name: str | None) -> bool:
    return bool(name) and name.endswith((".html.j2", ".html"))


@functools.cache
def environment() -> jinja2.Environment:
    root = importlib.resources.files("lab.report").joinpath("templates")
    env = jinja2.Environment(loader=traversable_loader(root), autoescape=_is_html, undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True)
    env.filters.update(FILTERS)
    return env


def render(template: str, view: object) -> str:
    """`template` (e.g. "report.md.j2") rendered with `view` as `r`; `*.html.j2` autoescape."""
    return environment().get_template(template).render(r=view)
