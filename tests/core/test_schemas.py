"""`lab schema`: the published JSON Schemas, and what the lab really writes validated against them
with an independent validator (jsonschema): a real run folder, the lab's writer on a real run's
captured logs, and the outputs of the drivers driven by fake runners."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import jsonschema
import pytest

from lab.bundle.archive import inspect_bundle, write_bundle
from lab.core.results import read_result
from lab.drivers import bisect_run
from lab.drivers.matrix import expand, matrix_result, run_matrix
from lab.image.hostpip import HostPip
from lab.image.resolve import resolve
from lab.report import run_folder as report
from lab.scenario.lookup import load_scenario
from lab.schemas import json_schema, names
from tests.conftest import SCENARIOS, fake_result, run_lab, tiny_scenario
from tests.core.test_results import REAL_RUN, rerun_analysis
from tests.drivers.test_ablate import ablate_with_fakes
from tests.drivers.test_bisect_run import VERSIONS, FakeEngine, FakeRuns, releases


def validate(name: str, document: object) -> None:
    schema = json_schema(name)
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.Draft202012Validator(schema).validate(document)


def invalid(name: str, document: object) -> bool:
    return not jsonschema.Draft202012Validator(json_schema(name)).is_valid(document)


def load(path) -> object:
    return json.loads(path.read_text())


def test_every_schema_is_a_valid_json_schema():
    assert names()[:8] == ["run", "evidence", "bisect", "matrix", "ablation", "compare", "localize", "bundle-manifest"]
    # issue 32: the batch triage's summary.json and every `lab mcp` tool's structured result
    assert names()[8:] == ["triage-batch", "mcp-list-scenarios", "mcp-show-scenario", "mcp-scenario-from-issue",
                           "mcp-run", "mcp-bisect", "mcp-compare", "mcp-comment", "mcp-triage", "mcp-read-report"]
    for name in names():
        schema = json_schema(name)
        jsonschema.Draft202012Validator.check_schema(schema)
        assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"


def test_a_real_run_validates(tmp_path):
    rerun_analysis(tmp_path / "run")
    validate("run", load(tmp_path / "run" / "result.json"))
    validate("evidence", load(tmp_path / "run" / "evidence.json"))
    # the committed run of lab 0.1.0 predates schema versions: as a file it is not schema 1, and read
    # through the lab (migrated) it is
    assert invalid("run", load(REAL_RUN / "result.json"))
    validate("run", read_result(REAL_RUN).to_json())


def test_an_unfinished_run_validates(tmp_path):
    case = resolve(load_scenario("libgomp-amd64", SCENARIOS))
    report.mark_unfinished(tmp_path, case, "failed", "the Docker engine does not answer")
    validate("run", load(tmp_path / "result.json"))
    assert invalid("run", {**load(tmp_path / "result.json"), "status": "done"})


def test_bundle_manifests_validate(tmp_path):
    info = write_bundle(REAL_RUN, tmp_path / "b.tar.gz", env={},
                        created=datetime(2026, 11, 22, 12, 30, tzinfo=timezone.utc))
    validate("bundle-manifest", inspect_bundle(info.path).model_dump(mode="json"))


def test_bisect_outputs_validate(tmp_path):
    scenario = tiny_scenario(tmp_path, "name: b\ntorch: '2.3.0'\narch: arm64\nbase: debian:bookworm\n"
                                       "expect:\n  exit_code: 1\n")
    verdicts = {"2.3.0": "not_reproduced", "2.3.1": "not_reproduced", "2.4.0": "error", "2.4.1": "reproduced",
                "2.5.0": "reproduced"}
    run = bisect_run.run_bisect(bisect_run.BisectRequest(scenario, "b", VERSIONS[0], VERSIONS[-1]),
                                engine=FakeEngine(), host=HostPip(),
                                runs_root=tmp_path / "runs", run_case=FakeRuns(verdicts), candidates=releases)
    validate("bisect", load(run.folder / "bisect.json"))
    validate("bisect", run.result.to_json())  # what `lab bisect --json` prints
    for probe in run.result.steps:
        validate("run", load(run.folder / f"torch{probe.version}" / "result.json"))
    assert invalid("bisect", {**run.result.to_json(), "status": "maybe"})


def test_matrix_output_validates(tmp_path):
    scenario = tiny_scenario(tmp_path, "name: m\ntorch: ['2.5.1', '2.9.1']\narch: [amd64, arm64]\n"
                                       "base: debian:bookworm\nexpect:\n  exit_code: 0\n")
    answers = iter(["reproduced", "not_reproduced", "error", "reproduced"] * 2)
    cells = run_matrix(expand(scenario), lambda case, i: fake_result(case, next(answers), f"runs/{case.name}/{i}"),
                       repeat=2)
    document = matrix_result(scenario, cells).to_json()
    validate("matrix", document)
    assert {c["verdict"] for c in document["cells"]} == {"flaky", "mixed"}


def test_ablation_output_validates(tmp_path):
    ablation, _ = ablate_with_fakes(tmp_path)
    validate("ablation", load(ablation.folder / "ablation.json"))
    validate("ablation", ablation.result.to_json())  # what `lab run --ablate --json` prints


def test_lab_schema_prints_and_writes(tmp_path):
    proc = run_lab("schema", "run")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == json_schema("run")
    everything = run_lab("schema")
    assert set(json.loads(everything.stdout)) == set(names())
    written = run_lab("schema", "--out", str(tmp_path / "schemas"))
    assert written.returncode == 0, written.stderr
    files = sorted(p.name for p in (tmp_path / "schemas").iterdir())
    assert files == sorted(f"{n}.schema.json" for n in names())
    assert written.stdout.split() == [str(tmp_path / "schemas" / f"{n}.schema.json") for n in names()]
    for name in names():
        assert load(tmp_path / "schemas" / f"{name}.schema.json") == json_schema(name)
    bad = run_lab("schema", "wheel")
    assert bad.returncode == 2 and "no schema named 'wheel'" in bad.stderr and "bundle-manifest" in bad.stderr


@pytest.mark.parametrize("name", ["run", "bisect", "matrix", "ablation", "compare", "localize"])
def test_every_document_names_its_schema_version_and_kind(name):
    schema = json_schema(name)
    props = schema.get("properties") or schema["$defs"]["RunResult"]["properties"]
    assert props["schema_version"]["const"] == 1
    assert props["kind"]["const"] == name

