"""The triage chain with fakes for the runs, the bisection and the newest release: the steps, the
answer in words, resuming from triage.json, and the compare seam."""

from __future__ import annotations

from pathlib import Path

from lab.issue.triage import BisectStep, RunStep, TriageState, compare_seam, run_triage, summary_lines

CORPUS = Path(__file__).resolve().parents[1] / "data" / "issues"


def _make(tmp_path: Path, page: str = "147282", earlier: bool = False):
    """The scenario of a tuning page, as `lab triage` writes it; with `earlier`, the release before the
    page's nightly or source build too (as the CLI gives it)."""
    from lab.issue.fetch import fetch_issue
    from lab.issue.infer import infer
    from lab.issue.write import write_inference

    def make():
        inf = infer(fetch_issue(str(CORPUS / f"{page}.md")))
        w = write_inference(inf, tmp_path / "sc", force=True)
        made = (str(w.yaml), w.scenario.name, inf.page.url, inf.torch, inf.arch.value)
        return (*made, inf.earlier) if earlier else made
    return make


def _fakes(reproduced_on: str, last_old: str, first_new: str):
    """A run that reproduces on one release only, a bisection that finds (last_old, first_new), and the
    calls they got."""
    calls = []

    def run(yaml, torch, arch):
        calls.append(("run", torch))
        return RunStep(torch, arch, "reproduced" if torch == reproduced_on else "not_reproduced",
                       run_dir=f"/r/{torch}")

    def bisect(yaml, old, new, arch):
        calls.append(("bisect", old, new))
        return BisectStep("found", last_old=last_old, first_new=first_new, summary="")
    return calls, run, bisect


def test_reproduced_then_fixed_then_bisected(tmp_path):
    calls, run, bisect = _fakes("2.5.1", "2.6.0", "2.7.0")
    state = run_triage(TriageState(source="p"), tmp_path / "t", make_scenario=_make(tmp_path), run=run,
                       bisect=bisect, newest=lambda arch: "2.15.0", compare=compare_seam())
    assert calls == [("run", "2.5.1"), ("run", "2.15.0"), ("bisect", "2.5.1", "2.15.0")]
    words = " ".join(summary_lines(state))
    assert "Reproduced on torch 2.5.1 on amd64" in words and "fixed" in words and "Fixed in torch 2.7.0" in words
    # the fake runs have no folders on disk: the comparison says why it could not be made
    assert state.compare["available"] is False and "/r/2.5.1" in state.compare["why"]
    assert (tmp_path / "t" / "comment.md").read_text().startswith("### Triage by torch-repro-lab")
    # a second triage resumes: nothing runs again
    again = run_triage(TriageState.load(tmp_path / "t" / "triage.json", "p"), tmp_path / "t",
                       make_scenario=_make(tmp_path), run=lambda *a: 1 / 0, bisect=lambda *a: 1 / 0,
                       newest=lambda arch: "2.15.0", compare=compare_seam())
    assert again.bisect.first_new == "2.7.0"


def test_not_reproduced_stops_after_the_first_run(tmp_path):
    state = run_triage(TriageState(source="p"), tmp_path / "t", make_scenario=_make(tmp_path),
                       run=lambda y, t, a: RunStep(t, a, "not_reproduced", reason="stdout: not found"),
                       bisect=lambda *a: 1 / 0, newest=lambda arch: 1 / 0, compare=compare_seam())
    assert summary_lines(state)[0].startswith("NOT reproduced on torch 2.5.1")


def test_still_present_on_the_newest(tmp_path):
    state = run_triage(TriageState(source="p"), tmp_path / "t", make_scenario=_make(tmp_path),
                       run=lambda y, t, a: RunStep(t, a, "reproduced", run_dir="/r"),
                       bisect=lambda *a: 1 / 0, newest=lambda arch: "2.15.0", compare=compare_seam())
    assert "NOT fixed" in " ".join(summary_lines(state)) and state.bisect is None


def test_a_different_failure_on_the_newest_is_not_a_fix_and_is_never_bisected(tmp_path):
    # issue 28: the newest release fails for another reason (an API it removed): no boundary to bisect toward
    def run(yaml, torch, arch):
        if torch == "2.5.1":
            return RunStep(torch, arch, "reproduced", run_dir="/r/old")
        return RunStep(torch, arch, "failed_differently", reason="failed differently: expected stdout containing "
                       "'should not run'; observed AttributeError", run_dir="/r/new")

    state = run_triage(TriageState(source="p"), tmp_path / "t", make_scenario=_make(tmp_path), run=run,
                       bisect=lambda *a: 1 / 0, newest=lambda arch: "2.15.0", compare=compare_seam())
    assert state.bisect is None and state.newest_run.verdict == "failed_differently"
    words = " ".join(summary_lines(state))
    assert "Failed differently on torch 2.15.0" in words and "nothing is bisected" in words
    assert "Fixed in" not in words and "fixed." not in words


def test_compare_is_called_when_available(tmp_path):
    seen = []

    def fake_compare(old_dir, new_dir):
        seen.append((old_dir, new_dir))
        return {"text": "signature differs", "comment": "compare comment"}
    state = run_triage(TriageState(source="p"), tmp_path / "t", make_scenario=_make(tmp_path),
                       run=lambda y, t, a: RunStep(t, a, "reproduced" if t == "2.5.1" else "not_reproduced",
                                                   run_dir=f"/r/{t}"),
                       bisect=lambda *a: BisectStep("found", "2.6.0", "2.7.0"), newest=lambda arch: "2.15.0",
                       compare=compare_seam(fake_compare))
    assert seen == [("/r/2.5.1", "/r/2.15.0")] and "compare comment" in state.comment


def test_the_default_compare_is_lab_compare_of_the_bisections_boundary(tmp_path):
    """A real bisection's folder (tests/data/compare): the comparison is its boundary pair's, and the
    comment is `lab comment`'s for that folder, pasted into comment.md."""
    folder = Path(__file__).resolve().parents[1] / "data" / "compare" / "bisect-vmap-newapi"
    state = run_triage(TriageState(source="p"), tmp_path / "t", make_scenario=_make(tmp_path),
                       run=lambda y, t, a: RunStep(t, a, "reproduced" if t == "2.5.1" else "not_reproduced",
                                                   run_dir=str(folder / "torch2.3.0")),
                       bisect=lambda *a: BisectStep("found", "2.3.1", "2.4.0", folder=str(folder)),
                       newest=lambda arch: "2.15.0", compare=compare_seam())
    cmp = state.compare
    assert cmp["available"] is True, cmp
    assert (cmp["a"], cmp["b"]) == (str(folder / "torch2.3.1"), str(folder / "torch2.4.0"))
    assert cmp["text"].startswith("A: ") and "verdict:" in cmp["text"]
    comment = (tmp_path / "t" / "comment.md").read_text()
    assert comment.startswith("### Triage by torch-repro-lab") and cmp["comment"] in comment


def test_an_edited_scenario_runs_its_steps_again_and_says_why(tmp_path):
    """The page's run, the newest release's and the bisection are reused only while the scenario's
    content key is the one they ran with: after an edit of `expect`, every step runs again."""
    import yaml
    calls, notes = [], []

    def run(yaml_path, torch, arch):
        calls.append(("run", torch))
        return RunStep(torch, arch, "reproduced" if torch == "2.5.1" else "not_reproduced", run_dir=f"/r/{torch}")

    def bisect(yaml_path, old, new, arch):
        calls.append(("bisect", old, new))
        return BisectStep("found", last_old="2.6.0", first_new="2.7.0", summary="")

    def go():
        return run_triage(TriageState.load(tmp_path / "t" / "triage.json", "p"), tmp_path / "t",
                          make_scenario=_make(tmp_path), run=run, bisect=bisect, newest=lambda arch: "2.15.0",
                          compare=compare_seam(), note=lambda step, msg: notes.append(msg))
    state = go()
    assert state.page_run.key and state.newest_run.key and state.page_run.key != state.newest_run.key
    first = list(calls)
    go()  # unchanged: nothing runs again
    assert calls == first and not any("runs again" in n for n in notes)
    path = Path(state.scenario)
    data = yaml.safe_load(path.read_text())
    data["expect"] = {"exit_code": 3}
    path.write_text(yaml.safe_dump(data))
    go()
    assert calls[len(first):] == first  # the run, the newest release's run and the bisection
    assert "torch 2.5.1 runs again: the scenario changed since (expect)" in notes


def test_the_comment_names_no_path_of_the_users(tmp_path):
    """Issue 33: the comment for the upstream issue names a saved page by its file's name and the run
    folders relative to the runs folder, even where a step's error quotes them."""
    runs = tmp_path / "home" / "runs"
    page = tmp_path / "home" / "Downloads" / "issue-147282.html"
    run_dirs = {t: runs / "s" / f"20260101T00000{i}Z-torch{t}-amd64" for i, t in enumerate(("2.5.1", "2.15.0"))}
    state = run_triage(TriageState(source=str(page)), tmp_path / "t", make_scenario=_make(tmp_path),
                       run=lambda y, t, a: RunStep(t, a, "reproduced" if t == "2.5.1" else "not_reproduced",
                                                   run_dir=str(run_dirs[t])),
                       bisect=lambda *a: BisectStep("found", "2.6.0", "2.7.0"), newest=lambda arch: "2.15.0",
                       compare=compare_seam())
    assert str(run_dirs["2.5.1"]) in state.compare["why"]  # the folders are absent: the error quotes them
    comment = (tmp_path / "t" / "comment.md").read_text()
    assert str(tmp_path) not in comment and "lab triage issue-147282.html" in comment
    assert "s/20260101T000000Z-torch2.5.1-amd64" in comment


def test_the_blame_of_the_bisection_is_in_the_answer_and_survives_a_resume(tmp_path):
    def run(yaml, torch, arch):
        return RunStep(torch, arch, "reproduced" if torch == "2.5.1" else "not_reproduced", run_dir=f"/r/{torch}")

    blame = [{"package": "numpy", "old": "1.26.4", "new": "2.4.6"}]
    state = run_triage(TriageState(source="p"), tmp_path / "t", make_scenario=_make(tmp_path), run=run,
                       bisect=lambda *a: BisectStep("found", "2.6.0", "2.7.0", blame=blame,
                                                    blame_fix="pin numpy<2 on torch <= 2.6.x"),
                       newest=lambda arch: "2.15.0", compare=compare_seam())
    line = summary_lines(state)[-1]
    assert line == "What flips it: numpy 1.26.4 → 2.4.6, not torch (pin numpy<2 on torch <= 2.6.x)."
    assert f"- {line}" in (tmp_path / "t" / "comment.md").read_text()
    again = TriageState.load(tmp_path / "t" / "triage.json", "p")
    assert again.bisect.blame == blame and summary_lines(again)[-1] == line


def test_the_written_scenario_resolves_in_the_release_s_era_without_a_numpy_pin(tmp_path):
    from lab.scenario.lookup import load_scenario
    yaml_path = _make(tmp_path)()[0]
    scenario = load_scenario(yaml_path)
    assert scenario.deps == "era"
    assert "numpy<2" not in scenario.pip


def _make_nightly(tmp_path: Path):
    # 118087 (tuning set) ran 2.3.0.dev20240110+cu118, a nightly: its code first shipped in 2.3.0, and the
    # release before it is 2.2.2
    return _make(tmp_path, "118087", earlier=True)


def test_a_nightlys_bug_fixed_before_its_release_is_found_in_the_release_before(tmp_path):
    # the page's nightly had the bug, the release that first shipped its code does not: the fix landed
    # after the nightly and before that release, so the release before may be the one that shipped the bug
    calls, run, bisect = _fakes("2.2.2", "2.2.2", "2.3.0")
    state = run_triage(TriageState(source="p"), tmp_path / "t", make_scenario=_make_nightly(tmp_path), run=run,
                       bisect=bisect, newest=lambda arch: 1 / 0, compare=compare_seam())
    assert state.earlier == "2.2.2"
    assert calls == [("run", "2.3.0"), ("run", "2.2.2"), ("bisect", "2.2.2", "2.3.0")]
    words = summary_lines(state)
    assert words[0].startswith("NOT reproduced on torch 2.3.0")
    assert words[1].startswith("Reproduced on torch 2.2.2, the release before it")
    assert words[1].endswith("so the bug shipped in torch 2.2.2 and was fixed before torch 2.3.0.")
    assert words[2] == "Fixed in torch 2.3.0 (last release with the bug: 2.2.2)." and len(words) == 3
    comment = (tmp_path / "t" / "comment.md").read_text()
    assert "2.2.2" in comment and "Fixed in torch 2.3.0" in comment
    # resumed: nothing runs again, the answer is the same
    again = run_triage(TriageState.load(tmp_path / "t" / "triage.json", "p"), tmp_path / "t",
                       make_scenario=_make_nightly(tmp_path), run=lambda *a: 1 / 0, bisect=lambda *a: 1 / 0,
                       newest=lambda arch: 1 / 0, compare=compare_seam())
    assert again.earlier_run.verdict == "reproduced" and summary_lines(again) == words
    # the comparison is of the two runs that differ: the release before, then the page's release
    pairs = []
    run_triage(TriageState(source="q"), tmp_path / "c", make_scenario=_make_nightly(tmp_path / "c"), run=run,
               bisect=lambda *a: BisectStep("found", last_old="2.2.2", first_new="2.3.0"),
               newest=lambda arch: 1 / 0, compare=compare_seam(runner=lambda a, b: pairs.append((a, b)) or {}))
    assert pairs == [("/r/2.2.2", "/r/2.3.0")]


def test_a_blame_that_is_not_known_is_said_in_the_answer(tmp_path):
    # the two sides ran with other dependencies and no rebuild gave a verdict: "Fixed in torch X" alone
    # would read as torch's fix
    not_known = ("not known: the two sides ran with different dependencies and no rebuild with the other "
                 "side's set gave a verdict (torch 2.2.2 with 2.3.0's dependencies: error)")
    calls, run, _ = _fakes("2.2.2", "2.2.2", "2.3.0")
    state = run_triage(TriageState(source="p"), tmp_path / "t", make_scenario=_make_nightly(tmp_path), run=run,
                       bisect=lambda *a: BisectStep("found", last_old="2.2.2", first_new="2.3.0",
                                                    blame_summary=not_known),
                       newest=lambda arch: 1 / 0, compare=compare_seam())
    assert summary_lines(state)[2:] == ["Fixed in torch 2.3.0 (last release with the bug: 2.2.2).",
                                        f"What flips it, torch or its dependencies: {not_known}."]
    again = TriageState.load(tmp_path / "t" / "triage.json", "p")
    assert again.bisect.blame_summary == not_known


def test_the_release_before_a_nightly_that_does_not_reproduce_either_bisects_nothing(tmp_path):
    for other in ("not_reproduced", "failed_differently", "error"):
        folder = tmp_path / other
        state = run_triage(TriageState(source="p"), folder, make_scenario=_make_nightly(folder),
                           run=lambda y, t, a, other=other: RunStep(t, a, "not_reproduced" if t == "2.3.0" else other,
                                                                   reason="why"),
                           bisect=lambda *a: 1 / 0, newest=lambda arch: 1 / 0, compare=compare_seam())
        assert state.earlier_run.torch == "2.2.2" and state.bisect is None
        words = summary_lines(state)
        assert f"on torch 2.2.2{' either' if other == 'not_reproduced' else ''}, the release before it" in words[1]
        assert words[-1].startswith("Nothing to bisect")


def test_a_released_version_that_does_not_reproduce_runs_nothing_before_it(tmp_path):
    # 147282 names a release (2.5.1): the release before it is not a candidate, the triage stops
    torches = []
    state = run_triage(TriageState(source="p"), tmp_path / "t", make_scenario=_make(tmp_path),
                       run=lambda y, t, a: torches.append(t) or RunStep(t, a, "not_reproduced"),
                       bisect=lambda *a: 1 / 0, newest=lambda arch: 1 / 0, compare=compare_seam())
    assert torches == ["2.5.1"] and state.earlier is None and state.earlier_run is None
