"""`lab triage`'s CLI glue (resolving cases, the run and bisect calls, the newest release) with the
engine, the runs and the index replaced by fakes, in process."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from typer.testing import CliRunner

CORPUS = Path(__file__).resolve().parents[1] / "data" / "issues"


def test_triage_glue_with_fakes(tmp_path, monkeypatch):
    import lab.cli.issue
    import lab.cli.routing
    from lab.cli import app

    runs = []

    def fake_run_case(case, engine, host, runs_root, progress, **kw):
        runs.append((case.torch, case.arch.value))
        verdict = "reproduced" if case.torch == "2.5.1" else "not_reproduced"
        result = SimpleNamespace(verdict=SimpleNamespace(value=verdict), reason="because", run_dir=f"/r/{case.torch}",
                                 content_key=None, content_parts=None)
        return SimpleNamespace(result=result)

    def fake_bisect(request, host, runs_root, progress, **kw):
        assert (request.old, request.new, request.arch) == ("2.5.1", "2.15.0", "amd64")
        return SimpleNamespace(result=SimpleNamespace(status="found", last_old="2.6.0", first_new="2.7.0",
                                                      summary="2.6.0 -> 2.7.0"), folder=tmp_path / "b")

    monkeypatch.setattr(lab.cli.issue, "run_case", fake_run_case)
    monkeypatch.setattr(lab.cli.issue, "check_release", lambda case, host: None)
    monkeypatch.setattr(lab.cli.issue, "discover", lambda: None)
    monkeypatch.setattr(lab.cli.issue, "candidates", lambda *a, **k: ["2.5.1", "2.15.0"])
    monkeypatch.setattr(lab.cli.issue, "run_bisect", fake_bisect)
    monkeypatch.setattr(lab.cli.routing, "fleet", lambda engines, jobs: None)
    monkeypatch.setattr(lab.cli.routing, "engine_for", lambda fleet, case: None)
    result = CliRunner().invoke(app, ["triage", str(CORPUS / "147282.md"), "--out", str(tmp_path / "runs"),
                                      "-o", str(tmp_path / "sc"), "--json"])
    assert result.exit_code == 0, result.output
    assert runs == [("2.5.1", "amd64"), ("2.15.0", "amd64")]
    data = json.loads(result.stdout.strip().splitlines()[-1])
    assert data["summary"][-1] == "Fixed in torch 2.7.0 (last release with the bug: 2.6.0)."
    assert (Path(data["folder"]) / "comment.md").is_file()
