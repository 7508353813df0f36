"""lab.report.escape, the one set of Markdown escapes, and lab.report.writer, the one environment that
applies them as filters (Markdown) and autoescapes the HTML templates."""

from __future__ import annotations

from lab.report import writer
from lab.report.escape import cell, code, details, md


def test_a_cell_is_one_line_with_its_pipes_and_tags_escaped():
    assert cell("a | b\nc <module>") == "a \\| b c &lt;module&gt;"
    assert cell("") == "" and cell("", "—") == "—"


def test_inline_code_outlasts_the_backticks_inside():
    assert code("torch.compile") == "`torch.compile`"
    assert code("a `b` c") == "``a `b` c``"
    assert code("`x`") == "`` `x` ``"


def test_details_fences_past_the_body_s_backticks_and_escapes_its_summary():
    assert details("x\n", "a <b> & c") == ("<details>\n<summary>a &lt;b&gt; &amp; c</summary>\n\n```text\nx\n```\n\n"
                                           "</details>")
    assert "\n````python\n```\n" in details("```\nfenced\n```", "s", "python")
    assert details("**markdown**", "s", None) == "<details>\n<summary>s</summary>\n\n**markdown**\n\n</details>"
    assert md("x <y> z") == "x &lt;y&gt; z"


def test_one_environment_autoescapes_html_and_not_markdown():
    env = writer.environment()
    assert env.from_string("{{ x }}").render(x="<b>") == "<b>"
    assert {"md", "cell", "code", "details"} <= set(env.filters)
    assert env.autoescape("report.html.j2") and not env.autoescape("report.md.j2")
