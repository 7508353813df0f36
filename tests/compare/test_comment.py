"""`lab comment` on real run folders: the one-line result, the environment, both commands, the
script in <details>, and the bundles' scrubbing."""

from __future__ import annotations

import shutil

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
