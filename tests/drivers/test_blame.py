"""lab.drivers.blame: which rebuilds the blame step makes and what it concludes, with fake runs."""

from __future__ import annotations

from lab.core.results import BisectResult, BlameStep, Probe
from lab.drivers.blame import blame_boundary

TODAY = {"filelock": "3.20.0", "jinja2": "3.1.6", "markupsafe": "3.0.3", "numpy": "2.3.5", "sympy": "1.14.0"}
ERA_222 = {"filelock": "3.13.3", "jinja2": "3.1.3", "markupsafe": "2.1.5", "numpy": "1.26.4", "sympy": "1.12"}
ERA_230 = {"filelock": "3.14.0", "jinja2": "3.1.4", "markupsafe": "2.1.5", "numpy": "1.26.4", "sympy": "1.12"}


def found(old="2.2.2", new="2.3.0", v_old="reproduced", v_new="not_reproduced") -> BisectResult:
    steps = (Probe.judged(old, v_old), Probe.judged(new, v_new))
    return BisectResult.model_validate({"status": "found", "from": old, "to": new, "last_old": old,
                                        "first_new": new, "from_verdict": v_old, "to_verdict": v_new,
                                        "steps": steps})


def fake_runs(verdict_of):
    calls = []

    def run_with(torch, pins, label, changed):
        calls.append((torch, dict(pins), label))
        return BlameStep(torch=torch, label=label, changed=tuple(changed), verdict=verdict_of(torch, pins))
    return run_with, calls


def numpy_2_breaks_222(torch, pins):
    return "reproduced" if torch == "2.2.2" and pins["numpy"].startswith("2.") else "not_reproduced"


def test_numpy_is_blamed_when_its_era_s_numpy_flips_the_old_side():
    run_with, calls = fake_runs(numpy_2_breaks_222)
    out = blame_boundary(found(), (TODAY, TODAY), run_with, {"2.2.2": ERA_222, "2.3.0": ERA_230}.get)
    assert [(b.package, b.old, b.new) for b in out["blame"]] == [("numpy", "1.26.4", "2.3.5")]
    assert out["blame_fix"] == "pin numpy<2 on torch <= 2.2.x"
    assert "with its era's numpy, torch 2.2.2 does not reproduce" in out["blame_summary"]
    assert calls[0] == ("2.2.2", ERA_222, "check1")   # the same sets on both sides: the era check first
    assert all(torch == "2.2.2" for torch, _, _ in calls)
    assert len(calls) <= 1 + 6                        # one check, then ddmin over five packages
    assert out["blame_steps"][0].flips is True


def test_the_other_side_s_set_is_tried_first_when_the_sets_differ():
    run_with, calls = fake_runs(numpy_2_breaks_222)
    older = dict(TODAY, numpy="1.26.4")  # 2.2.2 ran with NumPy 1, 2.3.0 with NumPy 2: 2.2.2 passed
    result = found(v_old="not_reproduced", v_new="not_reproduced")
    out = blame_boundary(result.model_copy(update={"to_verdict": "reproduced"}), (older, TODAY), run_with,
                         lambda v: None)
    assert calls[0][:1] == ("2.2.2",) and calls[0][1]["numpy"] == "2.3.5"
    assert [b.package for b in out["blame"]] == ["numpy"]
    assert (out["blame"][0].old, out["blame"][0].new) == ("1.26.4", "2.3.5")


def test_torch_alone_without_a_run_when_every_set_is_the_same():
    run_with, calls = fake_runs(numpy_2_breaks_222)
    out = blame_boundary(found(), (ERA_222, ERA_222), run_with, lambda v: dict(ERA_222))
    assert calls == []
    assert [(b.package, b.old, b.new) for b in out["blame"]] == [("torch", "2.2.2", "2.3.0")]
    assert out["blame_fix"] == "torch alone"


def test_torch_alone_when_no_rebuild_flips_the_verdict():
    run_with, calls = fake_runs(lambda torch, pins: "reproduced" if torch == "2.2.2" else "not_reproduced")
    out = blame_boundary(found(), (TODAY, TODAY), run_with, {"2.2.2": ERA_222, "2.3.0": ERA_230}.get)
    assert [c[2] for c in calls] == ["check1", "check2"]  # each side with its own era's set
    assert out["blame"][0].package == "torch" and out["blame_fix"] == "torch alone"
    assert "torch alone" in out["blame_summary"] and not any(s.flips for s in out["blame_steps"])


def test_a_rebuild_without_a_verdict_flips_nothing():
    run_with, _ = fake_runs(lambda torch, pins: "error")
    out = blame_boundary(found(), (TODAY, TODAY), run_with, {"2.2.2": ERA_222, "2.3.0": ERA_230}.get)
    assert out["blame_fix"] == "torch alone"
    assert [s.flips for s in out["blame_steps"]] == [None, None]


def test_no_verdict_with_the_other_side_s_set_blames_nothing():
    # the sides ran with different sets and neither could be rebuilt with the other's (uv found no
    # solution: 2.6.0 with 2.7.0's nvidia pins): "torch alone" would say more than the runs showed
    older = dict(TODAY, numpy="1.26.4")
    run_with, calls = fake_runs(lambda torch, pins: "error")
    out = blame_boundary(found(), (older, TODAY), run_with, {"2.2.2": ERA_222, "2.3.0": ERA_230}.get)
    assert [c[2] for c in calls][:2] == ["check1", "check2"]
    assert "blame" not in out and out.get("blame_fix") is None
    assert out["blame_summary"].startswith("not known: the two sides ran with different dependencies")
    assert "2.3.0's dependencies: error" in out["blame_summary"]
    # one cross rebuild that keeps its side's verdict is enough for torch alone
    run_with, _ = fake_runs(lambda torch, pins: "reproduced" if torch == "2.2.2" else "error")
    out = blame_boundary(found(), (older, TODAY), run_with, lambda v: None)
    assert out["blame_fix"] == "torch alone" and out["blame"][0].package == "torch"


def test_no_freeze_means_no_blame():
    run_with, calls = fake_runs(numpy_2_breaks_222)
    out = blame_boundary(found(), (None, TODAY), run_with, lambda v: None)
    assert calls == [] and "blame" not in out and "pip freeze" in out["blame_summary"]
