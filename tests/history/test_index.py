"""The run history (lab.history.index): an SQLite cache of the run folders, rebuilt from them."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from lab.core.runmarker import mark_run
from lab.history.index import BUNDLES_LOG, INDEX_NAME, HistoryError, RunIndex, note_bundle, parse_age, parse_since
from tests.conftest import DATA, ROOT, last_json, run_lab

REAL = json.loads((DATA / "run-folders" / "20261122T120958Z-torch2.5.1-arm64" / "result.json").read_text())
NOW = datetime(2026, 11, 23, 12, tzinfo=timezone.utc)


def make_run(root: Path, rel: str, *, torch="2.5.1", arch="arm64", verdict="reproduced", days_ago=0.0,
             scenario="libgomp-aarch64", started: str | None = None, marked: bool = True) -> Path:
    """A run folder with a real result.json (of the committed run), its case and verdict changed,
    marked by the lab as made `days_ago` (as lab.report.run_folder.new_run_dir marks it now).
    `started` (default: the same time) is what the result.json claims."""
    folder = root / rel
    folder.mkdir(parents=True)
    made = NOW - timedelta(days=days_ago)
    if marked:
        assert mark_run(root, folder, created_ns=int(made.timestamp() * 1e9)) is None
    data = {**REAL, "scenario": scenario, "case": f"{scenario}[torch={torch},arch={arch}]", "torch": torch,
            "arch": arch, "verdict": verdict, "started": started or made.isoformat(timespec="seconds"),
            "run_dir": str(folder)}
    (folder / "result.json").write_text(json.dumps(data))
    return folder


@pytest.fixture
def root(tmp_path):
    r = tmp_path / "runs"
    make_run(r, "libgomp-aarch64/20261120T100000Z-torch2.5.1-arm64", days_ago=3)
    make_run(r, "libgomp-aarch64/20261122T100000Z-torch2.5.1-arm64", verdict="not_reproduced", days_ago=1)
    make_run(r, "libgomp-aarch64/20261123T100000Z-torch2.9.1-arm64", torch="2.9.1", verdict="not_reproduced")
    make_run(r, "libgomp-amd64/20261123T110000Z-torch2.13.0+cpu-amd64", scenario="libgomp-amd64",
             torch="2.13.0+cpu", arch="amd64", verdict="not_reproduced")
    return r


def names(entries) -> list[str]:
    return [e.path.name for e in entries]


def test_a_missing_index_is_built_and_lists_newest_first_with_filters(root):
    index = RunIndex(root)
    entries = index.query()
    assert (root / INDEX_NAME).is_file() and index.notes == []
    assert names(entries) == ["20261123T110000Z-torch2.13.0+cpu-amd64", "20261123T100000Z-torch2.9.1-arm64",
                              "20261122T100000Z-torch2.5.1-arm64", "20261120T100000Z-torch2.5.1-arm64"]
    assert entries[0].path == root / "libgomp-amd64" / "20261123T110000Z-torch2.13.0+cpu-amd64"
    assert names(index.query("libgomp-aarch64", torch="2.5.1")) == ["20261122T100000Z-torch2.5.1-arm64",
                                                                  "20261120T100000Z-torch2.5.1-arm64"]
    assert names(index.query(arch="amd64")) == ["20261123T110000Z-torch2.13.0+cpu-amd64"]
    assert names(index.query(verdict="reproduced")) == ["20261120T100000Z-torch2.5.1-arm64"]
    assert len(index.query(since=parse_since("2026-11-22"))) == 3


def test_the_index_follows_the_folders(root):
    index = RunIndex(root)
    assert len(index.query()) == 4
    gone = root / "libgomp-aarch64" / "20261120T100000Z-torch2.5.1-arm64"
    for f in gone.iterdir():
        f.unlink()
    gone.rmdir()
    changed = root / "libgomp-aarch64" / "20261123T100000Z-torch2.9.1-arm64" / "result.json"
    changed.write_text(json.dumps({**json.loads(changed.read_text()), "verdict": "error", "reason": "oops"}))
    make_run(root, "libgomp-aarch64/20261123T120000Z-torch2.9.1-arm64-replay", torch="2.9.1")
    make_run(root, "libgomp-aarch64/bisect-arm64-2.5.1-2.9.1/torch2.5.1")
    entries = {e.path.name: e for e in RunIndex(root).query()}
    assert len(entries) == 5 and "20261120T100000Z-torch2.5.1-arm64" not in entries
    assert entries["20261123T100000Z-torch2.9.1-arm64"].verdict == "error"
    assert entries["20261123T120000Z-torch2.9.1-arm64-replay"].kind == "replay"
    assert entries["torch2.5.1"].kind == "probe"


def test_record_adds_one_folder_without_a_walk(root):
    index = RunIndex(root)
    index.query()
    new = make_run(root, "libgomp-aarch64/20261123T130000Z-torch2.5.1-arm64")
    index.record(new)
    with sqlite3.connect(root / INDEX_NAME) as conn:
        assert conn.execute("SELECT count(*) FROM runs").fetchone()[0] == 5


@pytest.mark.parametrize("damage", ["garbage", "foreign", "newer"])
def test_a_corrupt_or_foreign_index_is_rebuilt_with_a_note(root, damage):
    path = root / INDEX_NAME
    if damage == "garbage":
        path.write_bytes(b"this is not sqlite" * 200)
    else:
        with sqlite3.connect(path) as conn:
            conn.execute("CREATE TABLE notes (x TEXT)")
            if damage == "newer":
                conn.execute("PRAGMA application_id = 1279345201")
                conn.execute("PRAGMA user_version = 99")
    index = RunIndex(root)
    assert len(index.query()) == 4
    assert len(index.notes) == 1 and "moved to index.sqlite3.broken-" in index.notes[0]
    assert "rebuilt from the run folders" in index.notes[0]
    assert len(list(root.glob(f"{INDEX_NAME}.broken-*"))) == 1
    again = RunIndex(root)
    assert len(again.query()) == 4 and again.notes == []


def test_flaky_cases_with_rates(root):
    make_run(root, "libgomp-aarch64/20261123T140000Z-torch2.5.1-arm64", verdict="reproduced")
    make_run(root, "libgomp-aarch64/20261123T150000Z-torch2.5.1-arm64", verdict="error")
    [case] = RunIndex(root).flaky()
    assert (case.case, case.runs, case.reproduced, case.runnable) == ("libgomp-aarch64[torch=2.5.1,arch=arm64]",
                                                                      4, 2, 3)
    assert case.to_json()["rate"] == pytest.approx(2 / 3, abs=1e-4)
    assert RunIndex(root).flaky("libgomp-amd64") == []


def test_matrix_cells_are_named_so(root):
    folder = root / "libgomp-aarch64" / "matrix-20261123T100000Z"
    folder.mkdir()
    run = str(root / "libgomp-aarch64" / "20261123T100000Z-torch2.9.1-arm64")
    (folder / "matrix.json").write_text(json.dumps({"cells": [{"runs": [{"run_dir": run}]}]}))
    kinds = {e.path.name: e.kind for e in RunIndex(root).query()}
    assert kinds["20261123T100000Z-torch2.9.1-arm64"] == "cell"
    assert kinds["20261122T100000Z-torch2.5.1-arm64"] == "run"


def test_gc_keeps_what_a_bisection_or_a_bundle_refers_to(root):
    old_bundled = make_run(root, "libgomp-aarch64/20261001T100000Z-torch2.5.1-arm64", days_ago=53)
    old_plain = make_run(root, "libgomp-aarch64/20261002T100000Z-torch2.5.1-arm64", days_ago=52)
    bisect = root / "libgomp-aarch64" / "bisect-arm64-2.5.1-2.9.1"
    probe = make_run(root, "libgomp-aarch64/bisect-arm64-2.5.1-2.9.1/torch2.5.1", days_ago=50)
    referenced = make_run(root, "libgomp-aarch64/20261003T100000Z-torch2.9.1-arm64", torch="2.9.1", days_ago=51)
    (bisect / "bisect.json").write_text(json.dumps({"steps": [{"run_dir": str(probe)}, {"run_dir": str(referenced)}]}))
    RunIndex(root).query()
    assert note_bundle(old_bundled, root.parent / "x.tar.gz") is None
    assert (root / BUNDLES_LOG).read_text().startswith(f"{old_bundled}\t")
    dry = RunIndex(root).gc(parse_age("30d"), None, now=NOW, dry_run=True)
    assert dry.removed == (old_plain,) and old_plain.exists()
    assert set(dry.kept_referenced) == {old_bundled, probe, referenced}
    done = RunIndex(root).gc(parse_age("30d"), None, now=NOW)
    assert done.removed == (old_plain,) and not old_plain.exists()
    assert old_bundled.exists() and probe.exists() and referenced.exists()
    assert len(RunIndex(root).query()) == 7


def test_gc_keep_n_per_case(root):
    removed = RunIndex(root).gc(None, 1, now=NOW).removed
    assert [p.name for p in removed] == ["20261120T100000Z-torch2.5.1-arm64"]
    assert RunIndex(root).gc(timedelta(days=30), 0, now=NOW).removed == ()    # none is that old
    # --keep 0, or an age alone, still keeps the newest run of each case
    assert RunIndex(root).gc(None, 0, now=NOW + timedelta(days=400)).removed == ()
    assert RunIndex(root).gc(timedelta(days=1), None, now=NOW + timedelta(days=400)).removed == ()
    assert len(RunIndex(root).query()) == 3
    with pytest.raises(HistoryError, match="--older-than AGE or --keep N"):
        RunIndex(root).gc(None, None)


def test_bad_dates_and_ages_are_one_paragraph():
    with pytest.raises(HistoryError, match="--since 'last week' is not a date"):
        parse_since("last week")
    with pytest.raises(HistoryError, match="--older-than '3 months' is not an age"):
        parse_age("3 months")
    assert parse_age("12h") == timedelta(hours=12) and parse_age("2w") == timedelta(days=14)


WRITER = """
import json, sys
from pathlib import Path
from lab.history.index import RunIndex
root, who, n, real = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
for i in range(n):
    folder = root / "s" / f"20261123T{i:06d}Z-{who}"
    folder.mkdir(parents=True)
    (folder / "result.json").write_text(json.dumps({**real, "scenario": "s", "case": f"s[{who}]"}))
    index = RunIndex(root)
    index.record(folder)
    if i % 10 == 0:
        index.query()
    if index.notes:
        sys.exit("; ".join(index.notes))
"""


def test_processes_writing_at_once_do_not_corrupt_the_index(tmp_path):
    """Real processes, each recording its run folders (and syncing now and then) at the same time."""
    root, n, writers = tmp_path / "runs", 25, 4
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(root), f"w{w}", str(n), json.dumps(REAL)],
                              cwd=ROOT, stderr=subprocess.PIPE, text=True) for w in range(writers)]
    for p in procs:
        assert p.wait(timeout=300) == 0, p.stderr.read()
    with sqlite3.connect(root / INDEX_NAME) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert conn.execute("SELECT count(*) FROM runs").fetchone()[0] == n * writers
    assert not list(root.glob(f"{INDEX_NAME}.broken-*"))
    index = RunIndex(root)
    assert len(index.query()) == n * writers and index.notes == []


def test_lab_runs_command(root):
    proc = run_lab("runs", "libgomp-aarch64", "--out", str(root), "--json")
    assert proc.returncode == 0, proc.stderr
    runs = last_json(proc.stdout)["runs"]
    assert [r["torch"] for r in runs] == ["2.9.1", "2.5.1", "2.5.1"] and runs[0]["kind"] == "run"
    assert runs[0]["run_dir"] == str(root / "libgomp-aarch64" / "20261123T100000Z-torch2.9.1-arm64")
    flaky = last_json(run_lab("runs", "--flaky", "--out", str(root), "--json").stdout)["flaky"]
    assert [(f["case"], f["rate"]) for f in flaky] == [("libgomp-aarch64[torch=2.5.1,arch=arm64]", 0.5)]
    bad = run_lab("runs", "--since", "yesterday", "--out", str(root))
    assert bad.returncode == 2 and "is not a date" in bad.stderr and "Traceback" not in bad.stderr
    gc = run_lab("runs", "--gc", "--out", str(root))
    assert gc.returncode == 2 and "--older-than" in gc.stderr
    (root / INDEX_NAME).write_bytes(b"\0" * 4096)
    again = run_lab("runs", "--out", str(root), "--json")
    assert again.returncode == 0 and len(last_json(again.stdout)["runs"]) == 4
    assert "rebuilt from the run folders" in " ".join(again.stderr.split())


def test_no_runs_folder_is_an_empty_history_and_stays_absent(tmp_path):
    index = RunIndex(tmp_path / "runs")
    assert index.query() == [] and index.flaky() == [] and index.gc(None, 1).removed == ()
    assert not (tmp_path / "runs").exists()


def test_a_passing_disk_io_error_at_open_is_tried_again_and_any_other_is_said(tmp_path, monkeypatch):
    """SQLite said "disk I/O error" once when four processes opened the index at once: the open is
    tried again; a lasting one, or any other error (locked, read-only), is said as before."""
    from lab.core.errors import LabError
    from lab.history import index as history
    (tmp_path / "runs").mkdir()
    real = history.RunIndex._open_checked
    errors = ["disk I/O error", "disk I/O error"]

    def flaky(self):
        if errors:
            raise sqlite3.OperationalError(errors.pop(0))
        return real(self)

    monkeypatch.setattr(history.RunIndex, "_open_checked", flaky)
    monkeypatch.setattr(history.time, "sleep", lambda s: None)
    assert RunIndex(tmp_path / "runs").query() == [] and errors == []
    errors[:] = ["disk I/O error"] * history._OPEN_TRIES
    with pytest.raises(LabError, match="disk I/O error"):
        RunIndex(tmp_path / "runs").query()
    errors[:] = ["attempt to write a readonly database"]
    with pytest.raises(LabError, match="readonly"):
        RunIndex(tmp_path / "runs").query()
    assert errors == []
