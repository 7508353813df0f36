"""Matrix logic: cells, -k selection, repeats and rates (the runs themselves are faked here;
tests/test_e2e.py runs a real matrix)."""

from __future__ import annotations

import pytest

from lab.core.errors import RunLost, ScenarioError
from lab.core.results import MatrixResult
from lab.drivers.matrix import Cell, expand, matrix_result, run_matrix, select, split_list
from tests.conftest import fake_result, tiny_scenario

BODY = "name: m\ntorch: ['2.5.1', '2.9.1']\narch: [amd64, arm64]\nbase: debian:bookworm\nexpect:\n  exit_code: 0\n"


@pytest.fixture
def scenario(tmp_path):
    return tiny_scenario(tmp_path, BODY)


def test_split_list():
    assert split_list(None, "--torch") is None
    assert split_list("2.5.1, 2.9.1,2.10.0", "--torch") == ["2.5.1", "2.9.1", "2.10.0"]
    with pytest.raises(ScenarioError, match="empty item"):
        split_list("2.5.1,,2.9.1", "--torch")
    with pytest.raises(ScenarioError, match="twice"):
        split_list("2.5.1,2.5.1", "--torch")


def test_expand_defaults_to_every_pinned_value_in_version_major_order(scenario):
    names = [c.name for c in expand(scenario)]
    assert names == ["m[torch=2.5.1,arch=amd64]", "m[torch=2.5.1,arch=arm64]",
                     "m[torch=2.9.1,arch=amd64]", "m[torch=2.9.1,arch=arm64]"]


def test_expand_with_lists_from_the_command_line(scenario):
    cases = expand(scenario, ["2.10.0"], ["arm64"])
    assert [c.name for c in cases] == ["m[torch=2.10.0,arch=arm64]"]


@pytest.mark.parametrize("expr,expected", [
    ("arch=arm64", ["m[torch=2.5.1,arch=arm64]", "m[torch=2.9.1,arch=arm64]"]),
    ("2.5.1 and arm64", ["m[torch=2.5.1,arch=arm64]"]),
    ("not amd64", ["m[torch=2.5.1,arch=arm64]", "m[torch=2.9.1,arch=arm64]"]),
    ("(2.5.1 or 2.9.1) and not arm64", ["m[torch=2.5.1,arch=amd64]", "m[torch=2.9.1,arch=amd64]"]),
    ("m[torch=2.9.1,arch=amd64]", ["m[torch=2.9.1,arch=amd64]"]),
    ("nothing-like-this", []),
])
def test_select_like_pytest_k(scenario, expr, expected):
    assert [c.name for c in select(expand(scenario), expr)] == expected


@pytest.mark.parametrize("expr", ["and", "arm64 and", "(arm64", "arm64)", "not", "or arm64"])
def test_select_refuses_broken_expressions(scenario, expr):
    with pytest.raises(ScenarioError, match="-k"):
        select(expand(scenario), expr)


def test_run_matrix_repeats_and_rates(scenario):
    answers = {"m[torch=2.5.1,arch=amd64]": ["reproduced", "not_reproduced", "reproduced", "error"],
               "m[torch=2.9.1,arch=amd64]": ["not_reproduced"] * 4}
    calls = []

    def run_one(case, i):
        calls.append((case.name, i))
        return fake_result(case, answers[case.name][i], f"runs/{i}")

    cells = run_matrix(select(expand(scenario), "amd64"), run_one, repeat=4)
    assert calls == [(n, i) for n in answers for i in range(4)]
    flaky, steady = cells
    assert flaky.verdict == "mixed" and flaky.reproduced == 2 and flaky.runnable == 3
    assert flaky.rate_words() == "2/3 reproduced (67%)"
    assert steady.verdict == "not_reproduced" and steady.rate == 0.0
    record = matrix_result(scenario, cells)
    assert MatrixResult.model_validate_json(record.model_dump_json()) == record
    data = record.to_json()
    assert data["schema_version"] == 1 and data["kind"] == "matrix"
    assert data["scenario"] == "m"
    assert [c["cell"] for c in data["cells"]] == list(answers)
    assert data["cells"][0]["rate"] == pytest.approx(2 / 3, abs=1e-4)
    assert [r["verdict"] for r in data["cells"][0]["runs"]] == answers["m[torch=2.5.1,arch=amd64]"]


@pytest.mark.parametrize("workers", [1, 3])
def test_a_run_lost_to_its_infrastructure_is_that_cells_error_and_the_others_go_on(scenario, workers):
    """A Slurm task ended by NODE_FAIL, preemption or someone's scancel raises RunLost: the cell
    records an `error` run with the reason and the task's log, never a verdict, and the matrix goes on."""
    cases = select(expand(scenario), "amd64")
    lost, kept = cases[0].name, cases[1].name

    def run_one(case, i):
        if case.name == lost and i == 1:
            raise RunLost("Slurm job 7_1 ended NODE_FAIL before its run finished: not a verdict",
                          where="/r/slurm-7_1.out")
        return fake_result(case, "reproduced", f"runs/{case.name}/{i}")

    cells = run_matrix(cases, run_one, repeat=2, workers=workers)
    assert [c.verdicts for c in cells] == [["reproduced", "error"], ["reproduced", "reproduced"]]
    assert cells[0].verdict == "mixed" and cells[0].runnable == 1 and cells[1].name == kept
    data = matrix_result(scenario, cells).to_json()
    run = data["cells"][0]["runs"][1]
    assert run == {"verdict": "error", "run_dir": "/r/slurm-7_1.out",
                   "reason": "Slurm job 7_1 ended NODE_FAIL before its run finished: not a verdict"}


def test_any_other_error_of_a_run_still_stops_the_matrix(scenario):
    def run_one(case, i):
        raise ScenarioError("bad input")

    with pytest.raises(ScenarioError):
        run_matrix(expand(scenario), run_one)


def test_cell_words(scenario):
    case = expand(scenario)[0]
    assert Cell(case).verdict == "not_run"
    cell = Cell(case, [fake_result(case, "reproduced", "r1"), fake_result(case, "not_reproduced", "r2")])
    assert cell.verdict == "flaky"
    cell = Cell(case, [fake_result(case, "error", "r1")])
    assert cell.verdict == "error" and cell.rate is None
    assert cell.rate_words() == "0/1 runs reached a verdict"


def test_repeat_must_be_positive(scenario):
    with pytest.raises(ScenarioError, match="--repeat"):
        run_matrix(expand(scenario), lambda c, i: {}, repeat=0)
