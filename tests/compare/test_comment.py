"""`lab comment` on real run folders: the one-line result, the environment, both commands, the
script in <details>, the bundles' scrubbing, and no path of the user's."""

from __future__ import annotations

import shutil

import pytest
import yaml

from lab.compare.comment import render_comment
from tests.conftest import DATA, run_lab

RELU = DATA / "compare" / "relu-inject-2.13.0"


def test_a_run_folder():
    text = render_comment(RELU)
    assert text.startswith("**Reproduced on torch 2.13.0+cpu, amd64 (native).**\n")
    assert "(commit `cf30153c4c131c8164ee7798e5022d810682e2cb`)" in text
    assert "```sh\nlab run " in text and "--torch 2.13.0+cpu --arch amd64" in text
    assert "docker build --platform linux/amd64 --build-arg BASE=" in text
    assert "docker run --rm --platform linux/amd64 repro" in text
    assert "<details>\n<summary>The script (relu_inject.py)</summary>" in text
    assert 'inject_relu_bug_TESTING_ONLY = "compile_error"' in text
    assert "Python version: 3.11" in text  # collect_env's facts


def test_the_cli_prints_it():
    proc = run_lab("comment", str(RELU))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == render_comment(RELU)


def test_secrets_are_scrubbed_as_in_bundles(tmp_path, monkeypatch):
    # the real folder, with a token in the scenario's environment and a credential in a URL
    folder = tmp_path / "run"
    shutil.copytree(RELU, folder)
    scenario = yaml.safe_load((folder / "scenario.yaml").read_text())
    scenario["env"] = {"HF_TOKEN": "hf_s3cr3tvalue42", "OMP_NUM_THREADS": "2"}
    scenario["title"] = "see https://user:pa55word@example.com/issue"
    (folder / "scenario.yaml").write_text(yaml.safe_dump(scenario, sort_keys=False))
    monkeypatch.setenv("MY_API_KEY", "relu_inject")  # a host secret that also appears in the script's name
    text = render_comment(folder)
    assert "hf_s3cr3tvalue42" not in text and "HF_TOKEN=*** · OMP_NUM_THREADS=2" in text
    assert "-e 'HF_TOKEN=***' -e OMP_NUM_THREADS=2 repro" in text
    assert "pa55word" not in text and "https://example.com/issue" in text
    assert "relu_inject" not in text


def test_a_localize_folder():
    text = render_comment(DATA / "compare" / "localize-relu-inject")
    assert text.startswith("**Localized on torch 2.13.0+cpu, amd64: layer: inductor; compiler_bisector: the issue "
                           "is in `inductor`, subsystem `lowerings`: relu.**")
    assert "<summary>compiler_bisector's log</summary>" in text and "Disabling lowerings fixed the issue." in text


# --- nothing private leaves in a comment (issue 33) -----------------------------------------------

BISECT = DATA / "compare" / "bisect-vmap-newapi"
LOCALIZE = DATA / "compare" / "localize-relu-inject"
CAPTURED_RUNS = "/tmp/cmp-runs"  # the runs folder the captured folders were made in


def _moved(text: str, runs, home) -> str:
    """A captured file as it would be had the runs folder been `runs` and the scenarios under `home`."""
    text = text.replace(CAPTURED_RUNS, str(runs))
    for old in ("/work/wt-compare/tests/data/e2e", "/work/main/scenarios"):
        text = text.replace(old, str(home / "project"))
    return text


def _copy_moved(source, target, runs, home) -> None:
    shutil.copytree(source, target)
    for path in target.rglob("*"):
        if path.is_file() and path.suffix in (".json", ".yaml", ".md"):
            path.write_text(_moved(path.read_text(), runs, home))


@pytest.mark.parametrize("inside_home", [True, False], ids=["runs-in-home", "runs-elsewhere"])
def test_a_real_comment_names_no_path_of_the_users(tmp_path, inside_home):
    """The real `lab comment` on captured run and bisect folders, moved into a runs folder (in a fake
    HOME, or beside it) and with their scenarios in the user's project folder: the comment names
    scenarios by name, run folders relative to the runs folder, and no absolute path of the home or
    the runs folder, even where the captured files hold them (bisect.json's resume and folders,
    scenario.yaml's source_file, localize.md's link to the ablation)."""
    home = tmp_path / "home" / "ana"
    runs = home / "runs" if inside_home else tmp_path / "srv" / "runs"
    (home / "project").mkdir(parents=True)
    bisect = runs / "vmap-newapi" / "bisect-arm64-2.2.2-2.4.0"
    _copy_moved(BISECT, bisect, runs, home)
    run = runs / "relu-inject" / "20261125T110531Z-torch2.13.0+cpu-amd64"
    _copy_moved(RELU, run, runs, home)
    for name in ("localize.json", "localize.md"):  # a localization of this run, as lab localize leaves it
        (run / name).write_text(_moved((LOCALIZE / name).read_text(), runs, home))
    assert str(runs) in (bisect / "bisect.json").read_text() and str(home) in (run / "scenario.yaml").read_text()
    assert f"]({runs}/relu-inject/" in (run / "localize.md").read_text()
    env = {"HOME": str(home)}
    for folder in (bisect, run):
        proc = run_lab("comment", str(folder), env=env, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        text = proc.stdout
        for private in (str(home), str(runs), str(tmp_path), "~/"):
            assert private not in text, (private, text)
    bisect_text = run_lab("comment", str(bisect), env=env, cwd=tmp_path).stdout
    assert "lab run vmap-newapi.yaml --torch 2.3.1 --arch arm64" in bisect_text
    assert "`lab bisect vmap-newapi.yaml --from 2.2.2 --to 2.4.0 --arch arm64`" in bisect_text
    run_text = run_lab("comment", str(run), env=env, cwd=tmp_path).stdout
    assert "lab run relu-inject.yaml --torch 2.13.0+cpu --arch amd64" in run_text
    assert "([ablation.md](relu-inject/20261125T110531Z-torch2.13.0+cpu-amd64-ablation/ablation.md))" in run_text


def test_relative_paths_names_what_lies_under_the_runs_folder_relative_to_it(tmp_path):
    from lab.compare.comment import relative_paths
    runs = tmp_path / "runs"
    run = runs / "s" / "20260101T000000Z-torch2.5.1-amd64"
    run.mkdir(parents=True)
    (runs / "index.sqlite3").write_bytes(b"")
    text = (f"see {run}/report.md, the runs folder {runs}, [log]({tmp_path}/elsewhere/x.log) "
            f"and {runs}-old/x")
    assert relative_paths(text, run) == ("see s/20260101T000000Z-torch2.5.1-amd64/report.md, the runs folder "
                                         "the runs folder, [log](x.log) and " f"{runs}-old/x")
