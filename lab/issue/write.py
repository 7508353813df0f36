"""An inference written out: `<name>.yaml` (with its CPU variant for a GPU page whose script runs
without CUDA) and `scripts/<name>.py`, every inferred value and fix-up recorded in the YAML's
comments and description; and `lab new NAME`'s commented skeleton with a pt2 bug-report template."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from lab.core.errors import ScenarioError
from lab.issue.infer import GPU_BASE, Inference
from lab.scenario.lookup import load_scenario
from lab.scenario.model import Scenario

__all__ = ["Written", "scenario_name", "write_inference", "write_skeleton"]

SYSTEM_PACKAGES = ("g++", "python3-dev")  # Inductor on CPU compiles C++ against Python.h


@dataclass(frozen=True)
class Written:
    yaml: Path
    script: Path
    cpu_variant: Path | None
    scenario: Scenario
    report: Path


def scenario_name(inf: Inference) -> str:
    if inf.page.number:
        return f"issue-{inf.page.number}"
    slug = re.sub(r"[^a-z0-9]+", "-", (inf.page.title or "issue").lower()).strip("-")[:48].strip("-")
    return slug or "issue"


def write_inference(inf: Inference, out_dir: Path, name: str | None = None, force: bool = False) -> Written:
    name = name or scenario_name(inf)
    out_dir.mkdir(parents=True, exist_ok=True)
    script_rel = Path("scripts") / f"{name.replace('-', '_')}.py"
    yaml_path = out_dir / f"{name}.yaml"
    targets = [yaml_path, out_dir / script_rel]
    cpu_name = f"{name}-cpu" if inf.gpu and inf.cpu_variant else None
    if cpu_name:
        targets.append(out_dir / f"{cpu_name}.yaml")
    existing = [p for p in targets if p.exists()]
    if existing and not force:
        raise ScenarioError(f"{existing[0]} already exists.", hint="Choose another folder with -o, a name with "
                            "--name, or pass --force to overwrite.")
    (out_dir / script_rel).parent.mkdir(parents=True, exist_ok=True)
    (out_dir / script_rel).write_text(_script_text(inf), encoding="utf-8")
    yaml_path.write_text(_yaml_text(inf, name, script_rel, gpu=inf.gpu, cpu_variant=cpu_name), encoding="utf-8")
    cpu_path = None
    if cpu_name:
        cpu_path = out_dir / f"{cpu_name}.yaml"
        cpu_path.write_text(_yaml_text(inf, cpu_name, script_rel, gpu=False, cpu_variant=None), encoding="utf-8")
    scenario = load_scenario(cpu_path or yaml_path)  # what the lab will run here; raises if invalid
    if cpu_path:
        load_scenario(yaml_path)
    report = out_dir / f"{name}.from-issue.json"
    report.write_text(json.dumps(report_json(inf, name), indent=2) + "\n", encoding="utf-8")
    return Written(yaml=yaml_path, script=out_dir / script_rel, cpu_variant=cpu_path, scenario=scenario,
                   report=report)


def report_json(inf: Inference, name: str) -> dict:
    return {"scenario": name, "source": inf.page.source, "url": inf.page.url, "title": inf.page.title,
            "created": inf.page.created.isoformat() if inf.page.created else None,
            "torch": inf.torch, "earlier": inf.earlier, "arch": inf.arch.value, "base": inf.base, "gpu": inf.gpu,
            "cpu_variant": inf.cpu_variant,
            "pip": inf.pip, "env": inf.env, "expect": inf.expect,
            "script_lines": list(inf.script_lines),
            "facts": [{"name": f.name, "value": f.value, "line": f.line, "how": f.how, "default": f.default}
                      for f in inf.facts],
            "fixups": list(inf.fixups)}


def _script_text(inf: Inference) -> str:
    where = inf.page.url or inf.page.source
    head = [f"# The reproducing code of {where}", f"# (page lines {inf.script_lines[0]}-{inf.script_lines[1]}), "
            "written by `lab new --from-issue`. It runs only inside the lab's container."]
    if inf.fixups:
        head.append("# Fix-ups the lab made:")
        head += [f"#   - {f}" for f in inf.fixups]
    return "\n".join(head) + "\n\n" + inf.script


def _yaml_text(inf: Inference, name: str, script: Path, *, gpu: bool, cpu_variant: str | None) -> str:
    title = (inf.page.title or name).replace("\n", " ").strip()[:200]
    desc = [f"Written by `lab new --from-issue` from {inf.page.url or inf.page.source}.", "Inferred:"]
    desc += [f"  - {f.words()}" for f in inf.facts]
    desc += ["Fix-ups:"] + ([f"  - {f}" for f in inf.fixups] or ["  - none"])
    if gpu and not cpu_variant:
        desc.append("Needs an engine with the NVIDIA container runtime.")
    data: dict = {"name": name, "title": title}
    if inf.page.url and re.match(r"https?://", inf.page.url):
        data["upstream"] = inf.page.url
    data.update({"torch": inf.torch, "arch": "amd64" if gpu else inf.arch.value,
                 "base": GPU_BASE if gpu else inf.base})
    if gpu:
        data["gpu"] = True
        if cpu_variant:
            data["cpu_variant"] = cpu_variant
    data["system_packages"] = list(SYSTEM_PACKAGES)
    data["pip"] = list(inf.pip)
    data["deps"] = "era"  # the page's pins above; everything else as of the torch release (lab.image.era)
    if inf.env:
        data["env"] = dict(inf.env)
    data["script"] = script.as_posix()
    data["timeout"] = 1800 if inf.arch.value == "arm64" and not gpu else 1200
    data["expect"] = dict(inf.expect)
    comments = ["# Written by `lab new --from-issue`; every value below came from the page or is a",
                "# named default (see description). Check it, then: lab run " + name]
    body = "\n".join(f'torch: "{v}"' if k == "torch" else
                     yaml.safe_dump({k: v}, sort_keys=False, allow_unicode=True, width=110).rstrip()
                     for k, v in data.items() if k != "title")
    title_line = yaml.safe_dump({"title": title}, allow_unicode=True, width=10_000).rstrip()
    desc_block = "description: |\n" + "\n".join("  " + ln if ln else "" for ln in
                                                 "\n".join(desc).replace("\r", "").splitlines())
    first, rest = body.split("\n", 1)
    return "\n".join(comments) + "\n" + first + "\n" + title_line + "\n" + desc_block + "\n" + rest + "\n"


# ----------------------------------------------------------------------------- lab new NAME

SKELETON = '''\
# A scenario, written by `lab new {name}`. Every key is explained beside it; `lab show {name}` prints
# what the lab understood, `lab render {name}` the Dockerfile, `lab run {name}` runs it.
name: {name}
title: One line saying what goes wrong            # shown by `lab list` and in reports
# upstream: https://github.com/pytorch/pytorch/issues/NNNNNN   # the issue, if there is one
description: |
  What happens, what should happen, and what you already know (versions it fails on,
  versions it works on). The pt2 bug-report template asks for the same three things:
  the bug, the error logs, the versions (`python -m torch.utils.collect_env`).
torch: "{torch}"            # one version, or a list for a matrix: ["2.5.1", "2.9.0"] (always quoted)
arch: amd64                 # amd64 | arm64 (arm64 runs under QEMU on an x86 machine)
base: debian:bookworm       # or a CUDA image such as {gpu_base} (then gpu: true)
gpu: false
system_packages: [g++, python3-dev]   # Inductor on CPU compiles C++ against Python.h
pip: [numpy]                # PEP 508 requirements; torch itself comes from `torch:`
# deps: era                 # latest (default) | era (as of the torch release, plus a week) | "2024-04-01"
# env: {{OMP_NUM_THREADS: "4"}}
script: scripts/{script}    # relative to this file; it runs only inside the container
timeout: 1200               # seconds
ablation:
  via: env                  # the script reads LAB_BACKEND and LAB_MODE (lab run --backend, --ablate)
expect:                     # reproduced when every key given holds
  traceback_contains: "AssertionError"   # text of the final exception line
  # stdout_contains: "..."               # text the script prints
  # stdout_contains_normalized: "..."    # the same, with runs of whitespace as one space
  # exit_code: 1                        # or a list, any one counts: [134, 139]
  # graph_breaks: 2                      # torch._dynamo.explain's count
'''

SCRIPT = '''\
"""{name}: what goes wrong, in one sentence.

The pt2 bug-report template (https://github.com/pytorch/pytorch/issues/new?template=pt2-bug-report.yml)
asks for:
  * a minimal, self-contained repro: this file; keep it runnable on its own;
  * the error logs: the lab keeps stdout, stderr and the traceback of every run;
  * the versions: the lab records collect_env from inside the image.
The lab sets LAB_BACKEND (eager, aot_eager, inductor) and LAB_MODE for `lab run --backend` and `--ablate`.
"""
import os

import torch

BACKEND = os.environ.get("LAB_BACKEND", "inductor")
MODE = os.environ.get("LAB_MODE") or None


def fn(x):
    # Replace with the smallest code that shows the bug.
    return torch.sin(x) + torch.cos(x)


x = torch.randn(8)
expected = fn(x)                                      # eager
compiled = torch.compile(fn, backend=BACKEND, mode=MODE)
actual = compiled(x)
torch.testing.assert_close(actual, expected)          # an AssertionError is what expect looks for
print("compiled matches eager: not reproduced")
'''


def write_skeleton(name: str, out_dir: Path, torch: str, force: bool = False) -> tuple[Path, Path]:
    if not re.fullmatch(r"[a-z0-9][a-z0-9._-]{0,63}", name):
        raise ScenarioError(f"{name!r} is not a scenario name.", field="NAME",
                            hint="Use lowercase letters, digits, '.', '_' or '-', such as my-bug.")
    script_name = name.replace("-", "_").replace(".", "_") + ".py"
    yaml_path, script_path = out_dir / f"{name}.yaml", out_dir / "scripts" / script_name
    for p in (yaml_path, script_path):
        if p.exists() and not force:
            raise ScenarioError(f"{p} already exists.", hint="Choose another name or folder, or pass --force.")
    script_path.parent.mkdir(parents=True, exist_ok=True)
    script_path.write_text(SCRIPT.format(name=name), encoding="utf-8")
    yaml_path.write_text(SKELETON.format(name=name, torch=torch, script=script_name, gpu_base=GPU_BASE),
                         encoding="utf-8")
    load_scenario(yaml_path)
    return yaml_path, script_path
