"""lab.drivers.localize: reading compiler_bisector's answer, and what is said where it cannot run.
(The real run in an image: tests/test_e2e_compare.py.)"""

from __future__ import annotations

from lab.drivers.localize import (
    bisector_command,
    bisector_words,
    is_compile_failure,
    parse_bisector_output,
    run_bisector,
)
from lab.image.resolve import resolve
from lab.scenario.lookup import load_scenario
from tests.conftest import DATA

E2E = DATA / "e2e"


def test_parse_the_final_line():
    text = ("Starting bisection process with system: eager\nMoving to the next system: aot_eager\n"
            "Disabling lowerings fixed the issue.\n"
            "Bisection complete: BisectionResult(backend='inductor', subsystem='lowerings', bisect_number=3, "
            "debug_info='aten.relu.default')\n")
    fields = parse_bisector_output(text)
    assert fields == {"backend": "inductor", "subsystem": "lowerings", "bisect_number": 3,
                      "debug_info": "aten.relu.default"}
    assert bisector_words(fields, 0) == ("compiler_bisector: the issue is in `inductor`, subsystem `lowerings` "
                                         "(its application number 3): aten.relu.default")


def test_no_issue_and_no_answer():
    assert parse_bisector_output("All systems have been checked.\n\nBisection complete: no issue found\n") == {}
    assert "no backend that fails" in bisector_words({}, 0)
    assert parse_bisector_output("Traceback (most recent call last):\n") is None
    assert bisector_words(None, 1) == "compiler_bisector gave no result (exit code 1); see its log"
    assert bisector_words({"backend": "aot_eager", "subsystem": None}, 0) == (
        "compiler_bisector: the issue is in the `aot_eager` backend (no single subsystem identified)")


def test_a_release_without_the_module_or_its_run_command_is_said():
    case = resolve(load_scenario(E2E / "relu-inject.yaml"))
    absent = run_bisector(case, engine=None, tag="unused", folder=DATA, source=None)
    assert (absent.available, absent.ran) == (False, False)
    assert "does not ship torch._inductor.compiler_bisector" in absent.words
    old = run_bisector(case, engine=None, tag="unused", folder=DATA, source="class CompilerBisector: ...\n")
    assert not old.available and "without its `run` command" in old.words


def test_the_command_hands_the_backend_on_as_lab_backend():
    case = resolve(load_scenario(E2E / "relu-inject.yaml"))
    command = bisector_command(case)
    assert command[:5] == ["python", "-m", "torch._inductor.compiler_bisector", "run", "sh"]
    assert 'LAB_BACKEND="${TORCH_COMPILE_BACKEND:-inductor}"' in command[6]
    assert command[-2:] == ["python", "relu_inject.py"]


def test_compile_failures_are_told_from_others(tmp_path):
    (tmp_path / "stderr.txt").write_text(
        'Traceback (most recent call last):\n  File "/lab/repro/x.py", line 3, in <module>\n'
        '    f()\n  File "/opt/venv/lib/python3.11/site-packages/torch/_dynamo/eval_frame.py", line 9, in _fn\n'
        '    return fn()\ntorch._dynamo.exc.Unsupported: torch.func.vmap capture is disabled\n')
    assert is_compile_failure(tmp_path)
    (tmp_path / "stderr.txt").write_text(
        'Traceback (most recent call last):\n  File "/lab/repro/x.py", line 3, in <module>\n'
        "AttributeError: module 'torch.compiler' has no attribute 'is_compiling'\n")
    assert not is_compile_failure(tmp_path)


def test_the_real_output_of_a_real_bisector_run():
    # compiler_bisector's stdout from `lab localize tests/data/e2e/relu-inject.yaml` (torch 2.13.0+cpu)
    real = DATA / "compare" / "localize-relu-inject"
    fields = parse_bisector_output((real / "compiler_bisector" / "stdout.txt").read_text())
    assert fields == {"backend": "inductor", "subsystem": "lowerings", "bisect_number": 0, "debug_info": "relu"}
    assert bisector_words(fields, 0) == "compiler_bisector: the issue is in `inductor`, subsystem `lowerings`: relu"


def test_on_the_local_engine_the_bisector_is_not_run_and_the_reason_is_said(tmp_path):
    """The local engine has no image to start compiler_bisector in: localize says so (and names the
    command for a Docker engine) instead of asking the local engine for an image."""
    from types import SimpleNamespace

    from lab.core.results import LocalizeResult, read_document
    from lab.drivers.localize import localize

    class LocalOnly(SimpleNamespace):
        kind = "local"
        keeps_images = False  # (lab.engine.protocol: what the local engine says of itself)

        def __getattr__(self, name):  # any Docker-only call is a failure of the test
            raise AssertionError(f"the local engine was asked for {name}")

    case = resolve(load_scenario("compile-py311"), torch="2.0.1", arch="amd64")
    result = localize(case, LocalOnly(), host=None, runs_root=tmp_path, folder=tmp_path / "localize")
    assert result.bisector.available is False and result.bisector.ran is False
    assert "local engine" in result.bisector.words and "lab localize compile-py311 --torch 2.0.1" in \
        result.bisector.words
    assert read_document(tmp_path / "localize" / "localize.json", LocalizeResult) == result


def test_a_schedulers_engine_runs_the_whole_localization_as_one_job(tmp_path):
    """A Slurm partition's engine (localize_elsewhere) gets the whole localization, to run as one job
    on its partition; nothing of it (ablation, image, bisector) runs here."""
    from lab.drivers.localize import localize

    handed = []

    class Scheduler:
        def localize_elsewhere(self, case, host, runs_root, folder, events):
            handed.append((case.torch, runs_root, folder))
            return "the node's LocalizeResult"

        def __getattr__(self, name):  # anything else is a step run here: a failure of the test
            raise AssertionError(f"the scheduler's engine was asked for {name}")

    case = resolve(load_scenario("compile-py311"), torch="2.0.1", arch="amd64")
    assert localize(case, Scheduler(), None, tmp_path, tmp_path / "localize") == "the node's LocalizeResult"
    assert handed == [("2.0.1", tmp_path, tmp_path / "localize")] and not (tmp_path / "localize").exists()


def test_a_bisection_run_again_takes_its_localization_only_from_the_same_case(tmp_path):
    """A resumed bisection (its probes all from earlier runs) takes the boundary's localization from its
    localize.json when that was made from the same case (torch and content key); after an edit of the
    script, for another release, or from a damaged file, the localization runs again."""
    from lab.core.results import BisectorResult, LocalizeResult
    from lab.drivers.bisect_run import earlier_localization
    from lab.image.casekey import content_key
    from tests.conftest import tiny_scenario

    scenario = tiny_scenario(tmp_path, "name: tiny\ntorch: ['2.3.1', '2.4.0']\narch: arm64\nbase: debian:bookworm\n"
                                       "expect:\n  exit_code: 0\n")
    case = resolve(scenario, torch="2.3.1", arch="arm64")
    where = tmp_path / "localize"
    assert earlier_localization(where, case) is None  # none yet
    where.mkdir()
    made = LocalizeResult(scenario="tiny", torch="2.3.1", arch="arm64", layer="dynamo", ablation="fails with eager",
                          ablation_dir=None, bisector=BisectorResult(available=False, ran=False, words="not run"),
                          conclusion="layer: dynamo", key=content_key(case).digest)
    made.write(where / "localize.json")
    assert earlier_localization(where, case) == made
    assert earlier_localization(where, resolve(scenario, torch="2.4.0", arch="arm64")) is None
    (tmp_path / "s.py").write_text("print('edited')\n")
    assert earlier_localization(where, resolve(scenario, torch="2.3.1", arch="arm64")) is None
    made.model_copy(update={"key": None}).write(where / "localize.json")  # an older lab's: no key
    assert earlier_localization(where, case) is None
    (where / "localize.json").write_text("{not json")
    assert earlier_localization(where, case) is None
