"""`lab new NAME` and `lab new --from-issue` through the CLI (no engine needed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

CORPUS = Path(__file__).resolve().parents[1] / "data" / "issues"


def lab(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "lab", *args], capture_output=True, text=True, cwd=cwd)


def test_new_name_writes_a_valid_skeleton(tmp_path):
    proc = lab("new", "my-bug", "-o", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "my-bug.yaml").read_text()
    assert "# " in text and "expect:" in text
    assert "pt2-bug-report" in (tmp_path / "scripts" / "my_bug.py").read_text()
    shown = lab("show", str(tmp_path / "my-bug.yaml"))
    assert shown.returncode == 0, shown.stderr
    again = lab("new", "my-bug", "-o", str(tmp_path))
    assert again.returncode == 2 and "already exists" in again.stderr


def test_from_issue_prints_lines_and_writes_a_loadable_scenario(tmp_path):
    proc = lab("new", "--from-issue", str(CORPUS / "102258.md"), "-o", str(tmp_path), "--json")
    assert proc.returncode == 0, proc.stderr
    assert "line 30" in proc.stderr and "2.1.0a0+gita8ea417" in proc.stderr
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    assert data["torch"] == "2.1.0" and data["arch"] == "arm64"
    yaml_text = Path(data["yaml"]).read_text()
    assert "Inferred:" in yaml_text and "upstream: https://github.com/pytorch/pytorch/issues/102258" in yaml_text
    assert lab("render", data["yaml"]).returncode == 0


def test_gpu_page_with_optional_cuda_gets_a_cpu_variant(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("# t\n\n```python\nimport torch\ndevice = 'cuda' if torch.cuda.is_available() else 'cpu'\n"
                    "x = torch.ones(2, device=device)\nassert x.sum() == 3, 'bad sum'\n```\n\nPyTorch version: 2.4.1\n")
    proc = lab("new", "--from-issue", str(page), "-o", str(tmp_path / "o"), "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    assert data["gpu"] and data["cpu_variant"] and Path(data["cpu_variant"]).is_file()
    assert "gpu: true" in Path(data["yaml"]).read_text()


def test_page_without_code_exits_2_with_one_paragraph(tmp_path):
    proc = lab("new", "--from-issue", str(CORPUS / "108747.md"), "-o", str(tmp_path))
    assert proc.returncode == 2
    assert proc.stderr.startswith("error:") and "no code block" in proc.stderr


def test_triage_of_a_page_without_code_exits_2(tmp_path):
    proc = lab("triage", str(CORPUS / "108747.md"), "--out", str(tmp_path / "runs"), "-o", str(tmp_path / "sc"))
    assert proc.returncode == 2 and "no code block" in proc.stderr
