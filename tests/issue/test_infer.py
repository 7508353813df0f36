"""What `lab new --from-issue` infers from each real page of the corpus (tests/data/issues/), against
what was recorded by hand from reading the page."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lab.issue.fetch import IssueError, fetch_issue
from lab.issue.infer import infer
from lab.issue.parse import Kind, blocks
from lab.issue.releases import before, normalize, on_date

CORPUS = Path(__file__).resolve().parents[1] / "data" / "issues"
PAGES = json.loads((CORPUS / "corpus.json").read_text())["pages"]
# Only the tuning set's hand records are asserted: the measured set is never tuned on (issue 28).
TUNING = [p for p in PAGES if p["set"] == "tuning" and "expected" in p]


def test_the_corpus_has_thirty_real_pages_with_their_urls():
    assert len(PAGES) >= 30
    for p in PAGES:
        text = (CORPUS / p["file"]).read_text()
        assert p["url"] in text and p["url"].startswith("https://github.com/pytorch/pytorch/")
    kinds = " ".join(p["kind"] for p in PAGES)
    for kind in ("dynamo", "inductor", "eager", "aarch64", "warning"):
        assert kind in kinds


def test_the_corpus_is_split_and_records_both_releases_with_their_sources():
    measured = [p for p in PAGES if p["set"] == "measured"]
    assert len(PAGES) >= 60 and len(measured) >= 40
    assert all(p["set"] in ("tuning", "measured") for p in PAGES)
    assert not any("expected" in p for p in measured)  # nothing recorded from the inference's side
    for p in PAGES:
        assert "bug_release" in p and "fix_release" in p
        assert p["bug_release_source"].strip() and p["fix_release_source"].strip()


@pytest.mark.parametrize("page", TUNING, ids=[p["id"] for p in TUNING])
def test_inference_matches_the_hand_record(page):
    got = fetch_issue(str(CORPUS / page["file"]))
    if "error" in page["expected"]:
        with pytest.raises(IssueError):
            infer(got)
        return
    inf = infer(got)
    assert inf.torch == page["expected"]["torch"]
    assert inf.arch.value == page["arch"] or inf.gpu
    assert list(inf.expect) == [page["expected"]["expect"]]
    assert inf.script.strip()
    compile(inf.script, page["file"], "exec")  # the script parses; it never runs here
    for fact in inf.facts:
        assert fact.line is None or 1 <= fact.line <= len(got.lines)


def _inf(page_id: str):
    return infer(fetch_issue(str(CORPUS / f"{page_id}.md")))


def test_source_build_takes_the_release_that_first_shipped_its_code():
    # 2.1.0a0+gita8ea417 is main's code before 2.1's branch cut: it first shipped in 2.1.0 (issue 28)
    inf = _inf("102258")
    assert inf.torch == "2.1.0" and inf.arch.value == "arm64"
    fact = inf.fact("torch")
    assert fact.line == 30 and "2.1.0a0+gita8ea417" in fact.how and "first shipped" in fact.how
    # the comment states the right values ("it should be 36"): they are the oracle, not the observed 28 (issue 28)
    assert inf.expect == {"stdout_contains": "LAB-ORACLE: wrong result"}


def test_no_versions_section_takes_the_release_of_the_issue_date():
    inf = _inf("146538")
    assert inf.torch == "2.6.0" and inf.fact("torch").line is None and "2025-02-05" in inf.fact("torch").how
    assert inf.expect == {"traceback_contains": "Unsupported"}  # see the test of Dynamo's wording below


def test_missing_imports_are_added_and_recorded():
    inf = _inf("141283")
    assert inf.script.splitlines()[0] == "import torch"
    assert any("import torch" in f for f in inf.fixups)


def test_a_class_block_and_its_usage_block_are_joined():
    inf = _inf("96459")
    assert "class Model" in inf.script and "torch.compile(Model())" in inf.script
    assert inf.script.index("class Model") < inf.script.index("torch.compile(Model())")


def test_the_script_not_the_minified_repro_is_chosen():
    inf = _inf("93380")
    assert "load_config" not in inf.script and "def fn(v0, v2)" in inf.script
    assert inf.torch == "2.0.0" and any("torch.compile" in f for f in inf.fixups)


def test_printed_output_is_compared_with_whitespace_normalized():
    assert _inf("105264").expect == {"stdout_contains_normalized": "tensor(256, dtype=torch.int16)"}
    assert _inf("93374").expect == {"stdout_contains_normalized": "tensor([0.6080, 0.6080, 0.6080])"}


def test_traceback_tail_gives_the_final_exception():
    inf = _inf("118087")
    assert inf.expect == {"traceback_contains": "ValueError: diff value"} and inf.torch == "2.3.0"


def test_a_warning_raised_as_error_sets_pythonwarnings():
    inf = _inf("44371")
    assert inf.env == {"PYTHONWARNINGS": "error"}
    assert inf.expect["traceback_contains"].startswith("SystemError: <built-in method range")
    assert "torch.range(1, 3)" in inf.script and ">>>" not in inf.script


def test_crashes_become_exit_codes():
    assert _inf("94695").expect == {"exit_code": 139}
    assert _inf("184406").expect == {"exit_code": 136}


def test_cuda_only_script_gives_a_gpu_scenario_without_cpu_variant():
    inf = _inf("18948")
    assert inf.gpu and not inf.cpu_variant
    assert _inf("65416").gpu


def test_a_page_without_code_is_refused_in_one_paragraph():
    with pytest.raises(IssueError) as e:
        infer(fetch_issue(str(CORPUS / "108747.md")))
    assert "no code block" in str(e.value) and "\n" not in str(e.value)


def test_blocks_keep_page_lines_and_kinds():
    page = fetch_issue(str(CORPUS / "105264.md"))
    found = blocks(page.lines)
    assert [b.kind for b in found][:3] == [Kind.SCRIPT, Kind.OUTPUT, Kind.OUTPUT]
    assert page.lines[found[0].line - 1].strip() == "import torch"


def test_release_rules():
    from datetime import date
    assert before("2.2.0a0+git1234") == "2.1.2"
    assert normalize("2.4.0+cpu") == ("2.4.0", "2.4.0+cpu without its local label")
    assert normalize("2.1")[0] == "2.1.2"
    assert on_date(date(2024, 10, 20)) == "2.5.0"
    assert normalize("9.0.0")[0] == normalize("9.0.0")[0]


def test_a_nightly_takes_its_own_release():
    # 126848's nightly 2.4.0.dev20240521 (page line 56) is main's code before 2.4's branch cut: 2.4.0,
    # which the page's "v2.3 is not affected" (line 46) agrees with
    inf = _inf("126848")
    assert inf.torch == "2.4.0"
    fact = inf.fact("torch")
    assert fact.line == 56 and "a nightly of 2.4.0: 2.4.0, the release that first shipped its code" in fact.how
    assert _inf("96459").torch == "2.1.0"  # 2.1.0.dev20230307
    from lab.issue.releases import first_of
    assert first_of("2.4.0.dev20240521") == "2.4.0" and first_of("2.2.0a0+git1234") == "2.2.0"
    assert first_of("9.0.0.dev1") is None


def test_memory_corruption_in_words_is_a_segfault():
    # The title and text say "corrupted memory" and show no signal: a crash, not the default exit code 1.
    inf = _inf("159154")
    assert inf.expect == {"exit_code": 139}
    fact = inf.fact("expect")
    assert fact.line is None and "memory corruption" in fact.how and "'corrupted memory'" in fact.how


def test_dynamo_unsupported_is_cut_to_its_type_where_the_lab_runs_another_torch(tmp_path):
    # 146538 ran on main (no Versions section); the lab runs 2.6.0, whose Dynamo says the same graph
    # break as "Unsupported: builtin: or_ [<class '...ConstDictVariable'>, ...] False" (measured with
    # torch 2.6.0), not the page's "call_function BuiltinVariable(or_) [ConstDictVariable(), ...] {}".
    inf = _inf("146538")
    assert inf.expect == {"traceback_contains": "Unsupported"}
    fact = inf.fact("expect")
    assert fact.line == 25 and "call_function BuiltinVariable(or_)" in fact.how and "cut to its type" in fact.how
    assert _inf("93152").expect == {"traceback_contains": "Unsupported"}  # main in 2023, run on 2.0.0
    # The same page with the release it names: the lab runs the page's torch, so the message is kept.
    text = (CORPUS / "146538.md").read_text() + "\n### Versions\n\nPyTorch version: 2.6.0\n"
    (tmp_path / "146538.md").write_text(text)
    same = infer(fetch_issue(str(tmp_path / "146538.md")))
    assert same.torch == "2.6.0"
    assert same.expect["traceback_contains"].startswith("Unsupported: call_function BuiltinVariable(or_)")
    # Other exceptions keep their message whatever the version.
    assert _inf("118087").expect == {"traceback_contains": "ValueError: diff value"}


def test_a_nightly_or_source_build_names_the_release_before_its_code():
    # issue 28: a page that ran main's code (a nightly, a source build) may hold a bug that was fixed before
    # the release that first shipped that code; lab triage then runs the release before it
    assert _inf("118087").torch == "2.3.0" and _inf("118087").earlier == "2.2.2"     # 2.3.0.dev20240110+cu118
    assert _inf("102258").torch == "2.1.0" and _inf("102258").earlier == "2.0.1"     # 2.1.0a0+gita8ea417
    # 2.1.0.dev20230307 compiling: 2.0.1's torch.compile refuses the scenario's Python 3.11, so no run there
    assert _inf("96459").torch == "2.1.0" and _inf("96459").earlier is None
    assert _inf("146538").earlier is None                # no version: the release of the issue's date
    assert _inf("147282").earlier is None                # a release the page names
    # a 2.0 nightly whose script uses torch.compile: 1.13.1 has none, so there is no release before to run
    assert _inf("93374").torch == "2.0.0" and _inf("93374").earlier is None
