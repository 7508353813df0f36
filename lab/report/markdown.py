"""The Markdown reports (report.md, bisect.md), rendered from Jinja templates in lab/report/templates/.

The Python side prepares plain values (a small frozen view per report, every Markdown escape done);
the template only lays them out. Autoescape is off (the output is Markdown, not HTML), undefined
names are errors (StrictUndefined), and trim_blocks/lstrip_blocks let a `{% ... %}` line vanish, so
the templates read like the reports they write. The templates are package data (`lab.report`'s
`templates/*.j2`), read through importlib.resources like the Dockerfile templates.
"""

from __future__ import annotations

import functools
import importlib.resources

import jinja2

from lab.core.resources import traversable_loader


@functools.cache
def _environment(autoescape: bool) -> jinja2.Environment:
    root = importlib.resources.files("lab.report").joinpath("templates")
    return jinja2.Environment(loader=traversable_loader(root), autoescape=autoescape,
                              undefined=jinja2.StrictUndefined, keep_trailing_newline=True, trim_blocks=True,
                              lstrip_blocks=True)


def render(template: str, view: object, *, autoescape: bool = False) -> str:
    """`template` (e.g. "report.md.j2") rendered with `view` as `r`; HTML templates autoescape."""
    return _environment(autoescape).get_template(template).render(r=view)
