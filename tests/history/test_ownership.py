"""Whose runs the history holds (lab.core.runmarker): a stranger's bundle is never the user's run,
and `lab runs --gc` removes only folders the lab made, ordered by when the lab made them."""

from __future__ import annotations

import json
import shutil
import sqlite3
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml

from lab.bundle.archive import write_bundle
from lab.bundle.replay import REPLAYED, discard_replay, execute_replay, prepare_replay
from lab.core.arch import Arch
from lab.core.runmarker import KEY_NAME, MARKER, mark_run, marked_since, runs_key
from lab.history.index import INDEX_NAME, RunIndex
from lab.image.hostpip import HostPip
from lab.image.resolve import resolve
from lab.report.run_folder import new_run_dir
from lab.scenario.lookup import load_scenario
from tests.bundle.test_replay import make_run as stranger_run
from tests.bundle.test_replay import tamper
from tests.bundle.test_replay_results import FakeRun
from tests.conftest import fake_result, last_json, run_lab

DAY_NS = 86400 * 10**9
FUTURE = "2999-01-01T00:00:00+00:00"


@pytest.fixture(autouse=True)
def no_cross_install(monkeypatch):
    monkeypatch.setenv("LAB_CROSS_INSTALL", "0")  # plan_build without uv or an index


def user_run(root: Path, case, *, days_ago: float | None = None, started: str | None = None) -> Path:
    """A run folder as `lab run` makes it: new_run_dir (which marks it), then its result.json."""
    folder = new_run_dir(root, case, now=datetime.now(timezone.utc) - timedelta(days=days_ago or 0))
    if days_ago is not None:  # as if the lab had made it then
        (folder / MARKER).unlink()
        assert mark_run(root, folder, created_ns=time.time_ns() - int(days_ago * DAY_NS)) is None
    fields = {"started": started} if started else {}
    fake_result(case, "reproduced", folder, **fields).write(folder / "result.json")
    return folder


def forged_bundle(tmp_path: Path) -> Path:
    """A stranger's bundle of the same case, its result.json dated in the future, carrying a
    marker of its own (with a made-up MAC), its manifest consistent with all of that."""
    honest = write_bundle(stranger_run(tmp_path / "stranger"), tmp_path / "honest.tar.gz", env={}).path

    def forge(files: dict[str, bytes]) -> None:
        result = json.loads(files["result.json"])
        files["result.json"] = json.dumps({**result, "started": FUTURE}).encode()
        files[MARKER] = json.dumps({"lab": "torch-repro-lab run folder", "created_ns": 4 * 10**18,
                                    "mac": "0" * 64}).encode()
    return tamper(honest, tmp_path / "forged.tar.gz", forge)


def the_case(tmp_path: Path):
    source = tmp_path / "stranger" / "scenario-src" / "tiny-replay.yaml"
    return resolve(load_scenario(source))


def test_a_forged_bundle_replayed_is_not_a_user_run_and_gc_keeps_the_users_newest(tmp_path):
    bundle = forged_bundle(tmp_path)
    case = the_case(tmp_path)
    root = tmp_path / "runs"
    older = user_run(root, case, days_ago=40)
    newest = user_run(root, case, days_ago=35)   # the user's newest real run of the case, 35 days old

    # the real replay path: check and unpack, then move into a new run folder; the run is faked
    plan = prepare_replay(bundle, root, Arch.AMD64, allow_source_builds=True)  # no uv here: LAB_CROSS_INSTALL=0
    try:
        assert plan.original.started == FUTURE and plan.original.case == case.name
        outcome = execute_replay(plan, None, HostPip(), run_case=FakeRun(plan.original))
    finally:
        discard_replay(plan)
    replayed = outcome.run_dir / REPLAYED
    assert (replayed / "result.json").is_file() and (replayed / MARKER).is_file()
    assert marked_since(root, replayed, runs_key(root, create=False)) is None  # its marker does not check out

    entries = RunIndex(root).query()
    assert {e.path for e in entries} == {older, newest, outcome.run_dir}
    assert all(e.started != FUTURE for e in entries)
    assert {e.path: e.kind for e in entries}[outcome.run_dir] == "replay"   # the replay's own run, named so

    # through the CLI: the newest of each case stays (the user's, and the replay's apart from it)
    proc = run_lab("runs", "--gc", "--keep", "1", "--older-than", "30d", "--out", str(root), "--json")
    assert proc.returncode == 0, proc.stderr
    assert last_json(proc.stdout)["removed"] == [str(older)]
    assert not older.exists() and newest.exists() and (replayed / "result.json").is_file()
    with sqlite3.connect(root / INDEX_NAME) as conn:
        paths = [p for (p,) in conn.execute("SELECT path FROM runs")]
    assert not any(REPLAYED in p.split("/") for p in paths) and len(paths) == 2


def test_an_unfinished_replay_does_not_index_the_bundled_result(tmp_path):
    """A replay interrupted before its own result: its folder holds only the stranger's."""
    bundle = forged_bundle(tmp_path)
    root = tmp_path / "runs"

    def interrupted(case, engine, host, runs_root, events, **_):
        assert RunIndex(runs_root).query() == []  # while it runs, too
        raise KeyboardInterrupt

    plan = prepare_replay(bundle, root, Arch.AMD64, allow_source_builds=True)  # no uv here: LAB_CROSS_INSTALL=0
    with pytest.raises(KeyboardInterrupt):
        execute_replay(plan, None, HostPip(), run_case=interrupted)
    discard_replay(plan)
    [folder] = [p for p in (root / "tiny-replay").iterdir()]
    assert (folder / REPLAYED / "result.json").is_file()
    assert RunIndex(root).query() == [] and RunIndex(root).gc(None, 0).removed == ()
    assert (folder / REPLAYED / "result.json").is_file()


@pytest.mark.parametrize("forged", ["1970-01-01T00:00:00+00:00", FUTURE])
def test_a_forged_started_moves_nothing(tmp_path, forged):
    case = the_case_from(tmp_path)
    root = tmp_path / "runs"
    old = user_run(root, case, days_ago=60, started=FUTURE if forged != FUTURE else None)
    recent = user_run(root, case, days_ago=1, started=forged)
    lone = user_run(root, resolve(case.scenario, backend="eager"), days_ago=90, started=forged)
    removed = RunIndex(root).gc(timedelta(days=30), None).removed
    assert removed == (old,)        # the old one by when the lab made it, whatever it claims
    assert recent.exists() and lone.exists()   # recent by the lab's clock; lone: the newest of its case
    assert RunIndex(root).gc(None, 1).removed == ()


def the_case_from(tmp_path: Path):
    stranger_run(tmp_path / "stranger")
    return the_case(tmp_path)


def test_only_marked_folders_are_removed(tmp_path):
    case = the_case_from(tmp_path)
    root = tmp_path / "runs"
    newest = user_run(root, case, days_ago=1)
    mine = user_run(root, case, days_ago=50)
    legacy = root / "tiny-replay" / "20200101T000000Z-torch2.13.0+cpu-amd64"   # made before markers
    legacy.mkdir()
    fake_result(case, "reproduced", legacy).write(legacy / "result.json")
    copied = root / "tiny-replay" / "20200102T000000Z-torch2.13.0+cpu-amd64"    # someone else's marker
    shutil.copytree(mine, copied)
    unpacked = root / "tiny-replay" / "20200103T000000Z-torch2.13.0+cpu-amd64"  # a bundle unpacked by hand
    unpacked.mkdir()
    fake_result(case, "reproduced", unpacked, started=FUTURE).write(unpacked / "result.json")
    (unpacked / MARKER).write_text(json.dumps({"created_ns": 1, "mac": "0" * 64}))

    kinds = {e.path for e in RunIndex(root).query()}
    assert kinds == {newest, mine, legacy, copied, unpacked}   # listed: they are in the runs folder
    done = RunIndex(root).gc(None, 0)
    assert done.removed == (mine,) and newest.exists() and set(done.not_marked) == {legacy, copied, unpacked}
    assert legacy.exists() and copied.exists() and unpacked.exists()
    (root / KEY_NAME).unlink()            # without the key nothing checks out: nothing is removed
    assert RunIndex(root).gc(None, 0).removed == ()


def test_an_index_of_the_previous_schema_is_rebuilt_quietly(tmp_path):
    case = the_case_from(tmp_path)
    root = tmp_path / "runs"
    user_run(root, case)
    with sqlite3.connect(root / INDEX_NAME) as conn:
        conn.execute("CREATE TABLE runs (path TEXT PRIMARY KEY, stamp TEXT)")
        conn.execute("PRAGMA application_id = 1279345201")
        conn.execute("PRAGMA user_version = 1")
    index = RunIndex(root)
    assert len(index.query()) == 1 and index.notes == []


def test_the_marker_is_not_bundled(tmp_path):
    run = stranger_run(tmp_path / "made")
    mark_run(run.parents[1], run)
    assert (run / MARKER).is_file()
    info = write_bundle(run, tmp_path / "b.tar.gz", env={})
    assert MARKER not in {f.path for f in info.manifest.files}
    assert yaml.safe_load((run / "scenario.yaml").read_text())["name"] == "tiny-replay"
