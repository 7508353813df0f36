"""What a page says about its case, each fact with the page line it came from: the torch version,
the architecture, Python, CUDA, pip requirements, the script and the expectation. What the page does
not say gets a default, named as such; every change the lab makes to the page's code is a fix-up."""

from __future__ import annotations

import ast
import builtins
import re
import sys
from dataclasses import dataclass, field
from datetime import date

from packaging.version import InvalidVersion, Version

from lab.core.arch import Arch
from lab.issue import oracle, releases
from lab.issue.fetch import IssueError, IssuePage
from lab.issue.parse import Block, Kind, blocks, named_versions
from lab.scenario.bases import DEFAULT_BASE, OLD_BASE, base_python

__all__ = ["Fact", "Inference", "infer"]

GPU_BASE = "nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04"
CPU_BASE = DEFAULT_BASE
CPU_PYTHON = str(base_python(DEFAULT_BASE))  # 3.11
OLD_PYTHON = str(base_python(OLD_BASE))      # 3.9


@dataclass(frozen=True)
class Fact:
    """One inferred value: `line` is the page line it came from (None: a default or the issue's date)."""

    name: str
    value: str
    line: int | None
    how: str
    default: bool = False

    def words(self) -> str:
        where = f"line {self.line}" if self.line else ("default" if self.default else "page")
        return f"{self.name}: {self.value} ({where}: {self.how})"


@dataclass
class Inference:
    page: IssuePage
    torch: str
    arch: Arch
    gpu: bool
    cpu_variant: bool
    pip: list[str]
    env: dict[str, str]
    script: str
    script_lines: tuple[int, int]
    expect: dict[str, object]
    facts: list[Fact] = field(default_factory=list)
    fixups: list[str] = field(default_factory=list)
    python: str | None = None
    base: str = CPU_BASE
    # The release before `torch` when the page ran a nightly or a source build: that code was main's between
    # `earlier` and `torch`, so a fix that landed after the page's build and before `torch` leaves the bug in
    # `earlier` only (lab triage runs it when `torch` does not reproduce). None for a released version.
    earlier: str | None = None

    def fact(self, name: str) -> Fact | None:
        return next((f for f in self.facts if f.name == name), None)


def infer(page: IssuePage) -> Inference:
    lines = page.lines
    found = blocks(lines)
    facts: list[Fact] = []
    fixups: list[str] = []
    script, span, chosen = _script(page, found, facts, fixups)
    torch_v, dev_build = _torch(page, lines, found, script, facts, fixups)
    arch = _arch(page, lines, facts)
    python = _python(lines, facts)
    gpu, cpu_variant = _cuda(script, chosen, facts)
    base = _base(torch_v, script, facts, fixups)
    if base != CPU_BASE:
        facts[:] = [Fact("python", str(base_python(base)), f.line, f"{base}'s python3 (see the fix-ups); the page: "
                         f"{python or 'not given'}") if f.name == "python" else f for f in facts]
    env: dict[str, str] = {}
    raw = _find_torch(page, lines, found)[0]
    same_env = raw is not None and _plausible(raw) and Version(Version(raw).public) == Version(torch_v)
    chosen_oracle: list[oracle.Oracle] = []
    expect = _expect(page, lines, found, chosen, script, facts, fixups, env, same_torch=same_env,
                     oracle_out=chosen_oracle)
    if chosen_oracle:
        script = chosen_oracle[0].wrap(script)
        fixups.append(f"script: the lab's {chosen_oracle[0].kind} oracle "
                      + ("printed first: the page has no oracle" if chosen_oracle[0].kind == "none"
                         else "appended after the page's code") + " (issue 28: a wrong result needs an oracle)")
    pip = _pip(lines, script, torch_v, facts, fixups, keep_pins=same_env)
    return Inference(page=page, torch=torch_v, arch=arch, gpu=gpu, cpu_variant=cpu_variant, pip=pip, env=env,
                     script=script, script_lines=span, expect=expect, facts=facts, fixups=fixups, python=python,
                     base=base, earlier=_earlier(torch_v, script, base) if dev_build else None)


# ----------------------------------------------------------------------------- the script

_MINIFIER = ("load_config(b'", "rand_strided", "run_repro(", "load_args(", "make_fx(Repro", "compile_fx_inner(")


def _score(b: Block, first_script: int) -> float:
    code = b.code
    score = 0.0
    score += 10 if re.search(r"^\s*(import torch|from torch)", code, re.M) else 0
    score += 4 if b.index == first_script else 0
    score += min(len(code.splitlines()), 60) / 10
    score -= 12 if any(m in code for m in _MINIFIER) else 0
    score -= 6 if "minif" in b.label.lower() else 0
    score -= 3 * len(_undefined(code) - set(_IMPORT_FIXES))
    return score


def _script(page: IssuePage, found: list[Block], facts: list[Fact], fixups: list[str]):
    if not found:
        raise IssueError(_no_code(page, "has no code block"), hint="Write the scenario by hand with "
                         "`lab new NAME`, or add the reproducing script to the page.")
    runnable = [b for b in found if b.kind is Kind.SCRIPT] or [b for b in found if b.kind is Kind.PYTHON]
    if not runnable:
        kinds = ", ".join(sorted({b.kind.value for b in found}))
        raise IssueError(_no_code(page, f"has {len(found)} code block(s) ({kinds}) and none is a Python "
                                        "script that uses torch"),
                         hint="Write the scenario by hand with `lab new NAME`.")
    first = runnable[0].index
    chosen = max(runnable, key=lambda b: (_score(b, first), -b.index))
    others = [b for b in found if b is not chosen]
    why = f"code block {chosen.index + 1} of {len(found)}" + (f" ({chosen.info})" if chosen.info else "")
    code = chosen.code
    if chosen.prompts:
        fixups.append(f"script (line {chosen.line}): removed the >>> and ... prompts of an interactive session")
    if chosen.output:
        n = chosen.output.count("\n") + 1
        fixups.append(f"script (line {chosen.output_line}): left out the {n} line{'s' if n > 1 else ''} of output "
                      "pasted under the code in the same block: they are what the page saw, not code to run")
    if "(IPython magic, commented out by the lab)" in code:
        fixups.append(f"script (line {chosen.line}): commented out IPython magics (%, !)")
    before = len(fixups)
    code = _merge_definitions(code, chosen, found, fixups)
    joined = {int(m.group(1)) for f in fixups[before:] if (m := re.search(r"code block (\d+)", f))}
    skipped = [f"{b.index + 1} ({b.kind.value})" for b in others if b.index + 1 not in joined]
    facts.append(Fact("script", f"{len(code.splitlines())} lines", chosen.line,
                      why + (f" with block {', '.join(map(str, sorted(joined)))} joined" if joined else "")
                      + (f"; not blocks {', '.join(skipped)}" if skipped else "")))
    code = _fix_imports(code, fixups)
    return code.rstrip() + "\n", (chosen.line, chosen.end_line), chosen


def _no_code(page: IssuePage, what: str) -> str:
    name = page.url or page.source
    return (f"{name} {what}, so there is nothing to run: the lab turns a page's code block into the "
            "scenario's script and never guesses code from prose.")


def _defined(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                names.add((alias.asname or alias.name).split(".")[0])
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            names.update(node.names)
    return names


def _imported(tree: ast.AST) -> set[str]:
    return {(alias.asname or alias.name).split(".")[0] for node in ast.walk(tree)
            if isinstance(node, (ast.Import, ast.ImportFrom)) for alias in node.names}


def _undefined(code: str) -> set[str]:
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return set()
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return used - _defined(tree) - set(dir(builtins)) - {"__file__", "__name__"}


def _merge_definitions(code: str, chosen: Block, found: list[Block], fixups: list[str]) -> str:
    """Names the block uses but another Python block of the page defines: that block goes first. A
    later block that uses what this one defines (a class, then "test with") goes after it."""
    # what the block defines, not the modules it imports: a later block that only uses `torch` or `nn`
    # is another snippet (72594's "if I remove nn.Sequential ..."), not the rest of this one
    defined = _defined(ast.parse(code)) - _imported(ast.parse(code))
    users = [b for b in found if b.index > chosen.index and b.kind in (Kind.SCRIPT, Kind.PYTHON)
             and (_undefined(b.code) & defined)]
    for b in users:
        fixups.append(f"script: appended code block {b.index + 1} (line {b.line}), which uses what block "
                      f"{chosen.index + 1} defines ({', '.join(sorted(_undefined(b.code) & defined))[:80]})")
        code = code + "\n\n" + b.code
    missing = _undefined(code) - set(_IMPORT_FIXES)
    if not missing:
        return code
    parts: list[Block] = []
    for b in found:
        if b is chosen or b.kind not in (Kind.SCRIPT, Kind.PYTHON):
            continue
        gives = _defined(ast.parse(b.code)) & missing
        if gives:
            parts.append(b)
            missing -= gives
    if not parts:
        return code
    for b in parts:
        fixups.append(f"script: put code block {b.index + 1} (line {b.line}) first, for what it defines "
                      f"({', '.join(sorted(_defined(ast.parse(b.code)) & _undefined(code)))[:80]})")
    ordered = sorted([*parts, chosen], key=lambda b: b.index)  # noqa: F841 (kept below)
    return "\n\n".join(b.code if b is not chosen else code for b in ordered)


_IMPORT_FIXES = {
    "torch": "import torch", "nn": "import torch.nn as nn", "F": "import torch.nn.functional as F",
    "np": "import numpy as np", "numpy": "import numpy", "Tensor": "from torch import Tensor",
    "math": "import math", "time": "import time", "os": "import os", "sys": "import sys",
    "random": "import random", "warnings": "import warnings", "functools": "import functools",
    "itertools": "import itertools", "copy": "import copy", "contextlib": "import contextlib",
    "collections": "import collections", "operator": "import operator", "traceback": "import traceback",
    "gc": "import gc", "pickle": "import pickle", "typing": "import typing", "dataclasses": "import dataclasses",
    "Optional": "from typing import Optional", "List": "from typing import List",
    "Tuple": "from typing import Tuple", "Dict": "from typing import Dict", "Any": "from typing import Any",
}


def _fix_imports(code: str, fixups: list[str]) -> str:
    missing = sorted(_undefined(code) & set(_IMPORT_FIXES))
    if not missing:
        return code
    lines = [_IMPORT_FIXES[n] for n in missing]
    has_torch = re.search(r"^import torch\b", code, re.M)
    if any(n in missing for n in ("nn", "F")) and "torch" not in missing and not has_torch:
        lines.insert(0, "import torch")
    fixups.append("script: added the imports the page left out: " + "; ".join(lines))
    return "\n".join(lines) + "\n" + code


# ----------------------------------------------------------------------------- the torch version

_V = r"(\d+\.\d+(?:\.\d+)?(?:(?:a|b|rc)\d+|\.dev\d+|\.post\d+)?(?:\+[\w.]+)?)"
_TORCH_PATTERNS = (
    ("PyTorch version:", re.compile(r"^\s*PyTorch version:\s*" + _V)),
    ("[pip3] torch==", re.compile(r"^\s*\[pip3?\]\s*torch\s*[=]=\s*" + _V)),
    ("[conda] pytorch", re.compile(r"^\s*\[conda\]\s*(?:py)?torch\s+" + _V)),
    ("torch==", re.compile(r"\btorch\s*==\s*" + _V)),
    ("PyTorch Version", re.compile(r"(?i)\b(?:py)?torch\s+version\s*(?:\([^)]*\))?\s*[:=-]\s*v?" + _V)),
    ("torch.__version__ output", re.compile(r"^\s*(?:torch(?: version)?:\s*)?" + _V + r"\s*$")),
    ("a version line", re.compile(r"^\s*(\d+\.\d+\.\d+(?:a0\+git\w+|\.dev\d+(?:\+\w+)?|\+\w+))\s*$")),
)


_MAIN_ON = re.compile(r"(?i)\b(?:nightly|main|master|trunk)\b\D{0,40}?\b(20\d\d)-?(\d\d)-?(\d\d)\b")


def _main_on(lines: list[str], found: list[Block]) -> tuple[str, int, str] | None:
    """A build from main named by its date (`nightly 2023-09-02`, `main (20230902)`): the release that
    first shipped main's code of that day, by the release branch cuts."""
    for i, text in enumerate(lines):
        if m := _MAIN_ON.search(text):
            try:
                day = date(int(m.group(1)), int(m.group(2)), int(m.group(3)))
            except ValueError:
                continue
            if (shipped := releases.shipped_after(day)) is not None:
                return shipped[0], i + 1, f"`{text.strip()[:80]}`: {shipped[1]}"
    return None


def _torch(page, lines, found, script, facts, fixups) -> tuple[str, bool]:
    """The release to run, and whether the page ran a nightly or a source build (main's code, not a
    release: a release candidate is the release's own branch, so it is not one)."""
    raw, line, how = _find_torch(page, lines, found)
    if raw is None and (main := _main_on(lines, found)) is not None:
        facts.append(Fact("torch", main[0], main[1], main[2]))
        return _minimums(main[0], script, facts, fixups), True
    if raw is None and page.created is not None:
        current = releases.on_date(page.created)
        if current:
            raw, how = current, f"no version on the page: the release current on the issue's date, {page.created}"
        else:
            raw = releases.RELEASES[0][0]
            how = (f"no version on the page, and the issue ({page.created}) predates the oldest release with "
                   f"wheels for Python {CPU_PYTHON}: {raw}")
    if raw is None:
        raw = releases.newest()
        facts.append(Fact("torch", raw, None, "not found on the page (no Versions, no date): the newest release",
                          default=True))
        return _minimums(raw, script, facts, fixups), False
    version, why = releases.normalize(raw)
    facts.append(Fact("torch", version, line, how + (f"; {why}" if why else "")))
    return _minimums(version, script, facts, fixups), _dev_build(raw)


def _dev_build(raw: str) -> bool:
    """A nightly (2.4.0.dev20240521) or a source build (2.3.0a0+git...): main's code, not a release."""
    try:
        public = Version(Version(raw).public)
    except InvalidVersion:
        return False
    return public.is_devrelease or (public.pre is not None and public.pre[0] != "rc")


def _earlier(torch_v: str, script: str, base: str) -> str | None:
    """The release before `torch_v`, when the scenario can run it as it is: the script's features are in
    it (torch.compile), it would get the same base (2.0's torch.compile refuses Python 3.11), and it has a
    wheel for that base's Python."""
    earlier = releases.before(torch_v)
    if earlier is None or _minimums(earlier, script, [], []) != earlier or _base(earlier, script, [], []) != base:
        return None
    return earlier if str(base_python(base)) in releases.wheel_pythons(earlier) else None


def _code_lines(found: list[Block]) -> set[int]:
    """The 0-based indexes of the page's lines inside its code blocks: what is not the author's prose."""
    return {i for b in found for i in range(b.line - 1, b.end_line)}


def _find_torch(page: IssuePage, lines: list[str], found: list[Block]):
    output_lines = {i for b in found if b.kind in (Kind.OUTPUT, Kind.TRACEBACK)
                    for i in range(b.line - 1, b.end_line)}
    prints_version = any("__version__" in b.code for b in found)
    for label, pattern in _TORCH_PATTERNS:
        for i, text in enumerate(lines):
            if label == "torch.__version__ output" and not (prints_version and i in output_lines):
                continue
            m = pattern.search(text)
            if m and _plausible(m.group(1)):
                return m.group(1), i + 1, f"`{text.strip()[:80]}`"
    if page.title and (m := re.search(r"(?i)\b(?:py)?torch\s*v?(\d+\.\d+(?:\.\d+)?)|\bPT\s?(2\.\d+(?:\.\d+)?)",
                                      page.title)):
        return m.group(1) or m.group(2), None, f"the title: `{page.title[:80]}`"
    return None, None, ""


def _plausible(text: str) -> bool:
    try:
        v = Version(text)
    except Exception:  # noqa: BLE001 - any unreadable version is simply not one
        return False
    return Version("1.0") <= Version(v.base_version) < Version("3.0")


def _minimums(version: str, script: str, facts: list[Fact], fixups: list[str]) -> str:
    v = Version(version)
    if re.search(r"torch\.(compile|_dynamo|_inductor|export)\b", script) and v < Version(releases.MIN_COMPILE):
        fixups.append(f"torch: {version} has no torch.compile, which the script uses: {releases.MIN_COMPILE}, "
                      "the first release that has it")
        return releases.MIN_COMPILE
    if v < Version(releases.MIN_CP311) and _older_base(version) is None:
        fixups.append(f"torch: {version} has no wheel for Python {CPU_PYTHON}: {releases.MIN_CP311}")
        return releases.MIN_CP311
    return version


def _older_base(torch_v: str) -> tuple[str, str] | None:
    """(base, its Python) for a release the page names that has no wheel for debian:bookworm's Python 3.11
    (1.12.1: ubuntu:22.04, Python 3.10), from the releases' wheel tags and the bases the lab knows."""
    if torch_v not in {v for v, _ in releases.OLDER}:
        return None
    wanted = releases.python_for(torch_v, CPU_PYTHON)
    for base in (OLD_BASE, "ubuntu:22.04", "ubuntu:20.04"):
        if wanted is not None and base_python(base) == wanted:
            return base, wanted
    return None


def _base(torch_v: str, script: str, facts: list[Fact], fixups: list[str]) -> str:
    """debian:bookworm (Python 3.11), or debian:bullseye (3.9) where the script compiles with a torch
    whose torch.compile refuses Python 3.11 (before 2.1.0: "Python 3.11+ not yet supported"), or, for a
    release with no Python 3.11 wheel, a base whose python3 it has wheels for."""
    if (older := _older_base(torch_v)) is not None:
        fixups.append(f"base: {older[0]} (Python {older[1]}): torch {torch_v} has no wheel for Python {CPU_PYTHON}, "
                      f"the python3 of {CPU_BASE}")
        return older[0]
    if re.search(r"torch\.(compile|_dynamo|_inductor|export)\b", script) and Version(torch_v) < Version("2.1.0"):
        fixups.append(f"base: {OLD_BASE} (Python {OLD_PYTHON}): torch.compile in torch {torch_v} refuses Python "
                      f"{CPU_PYTHON}, the python3 of {CPU_BASE}")
        return OLD_BASE
    return CPU_BASE


# ----------------------------------------------------------------------------- arch, Python, CUDA

_ARM = re.compile(r"(?i)\b(aarch64|arm64|graviton\d?|neoverse[- ]?\w*|ampere altra|apple m\d)\b")
_X86 = re.compile(r"(?i)\b(x86_64|amd64|x86-64)\b")
_ENV_KEYS = ("OS:", "Python platform:", "Architecture:", "CPU:")


def _arch(page: IssuePage, lines: list[str], facts: list[Fact]) -> Arch:
    for i, text in enumerate(lines):
        if text.lstrip().startswith(_ENV_KEYS) and (m := _ARM.search(text) or _X86.search(text)):
            arch = Arch.ARM64 if _ARM.search(text) else Arch.AMD64
            facts.append(Fact("arch", arch.value, i + 1, f"`{text.strip()[:80]}`"))
            return arch
    if page.title and (m := _ARM.search(page.title)):
        facts.append(Fact("arch", "arm64", None, f"the title names {m.group(1)}"))
        return Arch.ARM64
    for i, text in enumerate(lines):
        if m := _ARM.search(text):
            facts.append(Fact("arch", "arm64", i + 1, f"the page names {m.group(1)}"))
            return Arch.ARM64
    facts.append(Fact("arch", "amd64", None, "no architecture on the page: amd64", default=True))
    return Arch.AMD64


def _python(lines: list[str], facts: list[Fact]) -> str | None:
    for i, text in enumerate(lines):
        m = re.match(r"\s*Python version:\s*(3\.\d+)", text)
        if m:
            note = "" if m.group(1) == CPU_PYTHON else f"; the image has {CPU_PYTHON} ({CPU_BASE}'s python3)"
            facts.append(Fact("python", m.group(1), i + 1, f"`{text.strip()[:60]}`{note}"))
            return m.group(1)
    facts.append(Fact("python", CPU_PYTHON, None, f"not on the page: {CPU_BASE}'s python3", default=True))
    return None


_CUDA = re.compile(r"""torch\.device\(\s*['"]cuda|\.cuda\(|\.to\(\s*['"]cuda|device\s*=\s*['"]cuda"""
                   r"""|['"]cuda(?::\d+)?['"]|torch\.cuda\.(?!is_available)""")


def _cuda(script: str, chosen: Block, facts: list[Fact]) -> tuple[bool, bool]:
    uses = [i for i, ln in enumerate(script.splitlines()) if _CUDA.search(ln.split("#", 1)[0])]
    if not uses:
        facts.append(Fact("cuda", "not needed", chosen.line, "the script names no CUDA device"))
        return False, False
    lines = script.splitlines()
    optional = all("is_available()" in lines[i] for i in uses)
    first = chosen.line + uses[0]
    if optional:
        facts.append(Fact("cuda", "optional", first, "every CUDA use is behind torch.cuda.is_available(): a GPU "
                          "scenario and a CPU variant"))
        return True, True
    facts.append(Fact("cuda", "needed", first, f"`{lines[uses[0]].strip()[:70]}`: a GPU scenario; no CPU variant, "
                      "the script does not run unchanged without CUDA"))
    return True, False


# ----------------------------------------------------------------------------- pip

_PYPI = {"PIL": "pillow", "sklearn": "scikit-learn", "cv2": "opencv-python-headless", "yaml": "pyyaml",
         "skimage": "scikit-image", "attr": "attrs", "google.protobuf": "protobuf", "Crypto": "pycryptodome"}
_SHIPPED = {"torch", "torchgen", "functorch", "triton", "numpy", "typing_extensions", "sympy", "networkx",
            "jinja2", "filelock", "fsspec", "setuptools"}


def _pip(lines: list[str], script: str, torch_v: str, facts: list[Fact], fixups: list[str], *,
         keep_pins: bool) -> list[str]:
    """The script's imports as requirements. The page's pins (`[pip3] numpy==1.17.2`) are kept only when
    the lab runs the torch the page ran: pins from another environment (torch 1.2 and Python 3.6) need
    not even have a wheel for the image's Python."""
    pins = _page_pins(lines)
    if pins and not keep_pins:
        wanted = {"numpy"} | {_PYPI.get(m, m).replace("_", "-").lower() for m in _imports(script)}
        dropped = [f"{n}=={v}" for n, (v, _) in pins.items() if n in wanted and n not in ("torch", "pytorch")]
        if dropped:
            fixups.append(f"pip: not the page's pins ({', '.join(dropped)}): they are from the page's environment, "
                          f"and the lab runs torch {torch_v}, not the torch the page ran")
        pins = {}
    modules = _imports(script)
    reqs: list[str] = []
    numpy = _numpy(pins, torch_v, facts, fixups)
    reqs.append(numpy)
    for mod in sorted(modules):
        if mod in _SHIPPED or mod in sys.stdlib_module_names:
            continue
        name = _PYPI.get(mod, mod).replace("_", "-")
        if name in ("torchvision", "torchaudio"):
            pinned = _companion(name, torch_v)
            facts.append(Fact("pip", pinned, None,
                              f"the script imports {mod}; the release that goes with torch {torch_v}"))
            reqs.append(pinned)
            continue
        page = pins.get(name.lower())
        if page:
            facts.append(Fact("pip", f"{name}=={page[0]}", page[1],
                              f"the script imports {mod}, pinned as the page pins it"))
            reqs.append(f"{name}=={page[0]}")
        else:
            facts.append(Fact("pip", name, None, f"the script imports {mod}; the page pins no version"))
            reqs.append(name)
    return reqs


def _page_pins(lines: list[str]) -> dict[str, tuple[str, int]]:
    return named_versions(lines)


def _numpy(pins, torch_v, facts, fixups) -> str:
    """numpy as the page pins it, else unpinned: the scenario's `deps: era` resolves it (and the rest)
    as of torch's release (lab.image.era), so an old torch meets the NumPy it was built against."""
    page = pins.get("numpy")
    if page:
        facts.append(Fact("pip", f"numpy=={page[0]}", page[1], "pinned as the page pins it"))
        return f"numpy=={page[0]}"
    facts.append(Fact("pip", "numpy", None, f"torch imports it when present; its version is torch {torch_v}'s era's "
                                            "(deps: era)", default=True))
    return "numpy"


def _companion(name: str, torch_v: str) -> str:
    major, minor, patch = (Version(torch_v).release + (0, 0))[:3]
    if major != 2:
        return name
    if name == "torchvision":
        return f"torchvision==0.{minor + 15}.{2 if (minor, patch) == (0, 1) else patch}"
    return f"torchaudio=={torch_v if (minor, patch) != (0, 1) else '2.0.2'}"


def _imports(script: str) -> set[str]:
    tree = ast.parse(script)
    mods: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            mods.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            mods.add(node.module.split(".")[0])
    return mods


# ----------------------------------------------------------------------------- the expectation

_EXC_LINE = re.compile(r"^((?:[A-Za-z_][\w.]*)?(?:Error|Exception|Warning|Exit|Interrupt|Unsupported|Failed|"
                       r"Exception\w*))(?::\s?(.*))?$")
_SIGNALS = ((re.compile(r"(?i)segmentation fault|SIGSEGV|segfault"), 139, "a segmentation fault"),
            (re.compile(r"(?i)floating point exception|SIGFPE"), 136, "a floating point exception (SIGFPE)"),
            (re.compile(r"(?i)\bAborted\b|IOT instruction|SIGABRT|^terminate called\b", re.M), 134,
             "an abort (SIGABRT)"),
            (re.compile(r"(?i)illegal instruction|SIGILL"), 132, "an illegal instruction (SIGILL)"))


def _expect(page, lines, found, chosen, script, facts, fixups, env, *, same_torch: bool = True,
            oracle_out: list | None = None) -> dict[str, object]:
    for i, text in enumerate(lines):
        if re.search(r"\bpython3?(?:\.\d+)?\s+(?:-W\s*error|-Werror)\b|PYTHONWARNINGS=error", text):
            env["PYTHONWARNINGS"] = "error"
            fixups.append(f"env: PYTHONWARNINGS=error: the page ran Python with warnings as errors (line {i + 1})")
            break
    exc = _page_exception(lines, found)
    if exc:
        text, line = exc
        how = "the final exception line of the page's traceback"
        text, how = _dynamo_wording(text, how, same_torch)
        facts.append(Fact("expect", f"traceback_contains: {text!r}", line, how))
        kind = text.split(":", 1)[0]
        filtered = re.search(r"simplefilter\(\s*['\"]error|filterwarnings\(\s*['\"]error", script)
        if kind.endswith("Warning") and "PYTHONWARNINGS" not in env and not filtered:
            action = f"error::{kind}" if kind in dir(builtins) else "error"
            env["PYTHONWARNINGS"] = action
            fixups.append(f"env: PYTHONWARNINGS={action}, because the page's error is a {kind} raised as an "
                          "exception (the page ran with warnings turned into errors)")
        return {"traceback_contains": text}
    named = _title_or_comment_exception(page, chosen)
    if named:
        text, line, how = named
        text, how = _dynamo_wording(text, how, same_torch)
        facts.append(Fact("expect", f"traceback_contains: {text!r}", line, how))
        return {"traceback_contains": text}
    crash = _crash(found, chosen, page)
    if crash:
        code, words, line = crash
        facts.append(Fact("expect", f"exit_code: {code}", line, f"the page shows {words}"
                          + (" (any one counts)" if isinstance(code, list) else "")))
        return {"exit_code": code}
    gb = _graph_break_claim(page, lines, found, script)
    if gb:
        facts.append(Fact("expect", "graph_breaks_min: 1", gb[1], gb[0]))
        return {"graph_breaks_min": 1}
    values = oracle.stated_values(lines, found, chosen)
    claim = oracle.wrong_result_claim(page.title, lines) or (values and "it states the right output")
    if claim and oracle_out is not None:
        prose = "\n".join(t for i, t in enumerate(lines) if i not in _code_lines(found))
        pair = None if values else oracle.compared_pair(script, prose)
        chosen_oracle = oracle.expected_value(values) if values else \
            oracle.two_computations(pair, chosen.line) if pair else None
        if chosen_oracle:
            oracle_out.append(chosen_oracle)
            facts.append(Fact("expect", f"stdout_contains: {oracle.WRONG!r}", chosen_oracle.line,
                              f"oracle: {chosen_oracle.kind}: {chosen_oracle.words}; a wrong result ({claim})"))
            return chosen_oracle.expect()
    named = "oracle: observed output: " if claim else ""
    out = _page_output(found, chosen, script)
    if out:
        text, line = out
        facts.append(Fact("expect", f"stdout_contains_normalized: {text!r}", line,
                          named + "the page's printed output, compared with whitespace normalized"))
        return {"stdout_contains_normalized": text}
    said = _comment_output(chosen)
    if said:
        text, line = said
        facts.append(Fact("expect", f"stdout_contains_normalized: {text!r}", line,
                          named + "the output the script's comment says it printed"))
        return {"stdout_contains_normalized": text}
    warned = _page_warning(found, lines)
    if warned:
        text, line = warned
        facts.append(Fact("expect", f"stderr_contains: {text!r}", line, "the warning the page's log shows"))
        return {"stderr_contains": text}
    own = _script_check(script)
    if own:
        facts.append(Fact("expect", f"traceback_contains: {own!r}", chosen.line, "the script's own check"))
        return {"traceback_contains": own}
    if claim and oracle_out is not None:
        none = oracle.no_oracle(claim)
        oracle_out.append(none)
        facts.append(Fact("expect", f"stdout_contains: {oracle.NONE!r}", None, f"oracle: none: {none.words}; "
                          "the judge gives the verdict error"))
        return none.expect()
    facts.append(Fact("expect", "exit_code: 1", None, "no traceback, crash or output on the page and no check in "
                      "the script: reproduced when the script fails", default=True))
    return {"exit_code": 1}


def _dynamo_wording(text: str, how: str, same_torch: bool) -> tuple[str, str]:
    """Dynamo's `Unsupported` message names its own variable trackers, and their wording changes between
    releases for the same graph break (`builtin: or_ [<class '...ConstDictVariable'>, ...] False` in 2.6.0,
    `call_function BuiltinVariable(or_) [ConstDictVariable(), ...] {}` on main a week later). Where the lab
    runs another torch than the page did (the page names none, or a nightly or source build), such a
    message is expected as the exception type alone."""
    kind, _, message = text.partition(": ")
    if same_torch or kind.rsplit(".", 1)[-1] != "Unsupported" or not re.search(r"\b[A-Z]\w*Variable\b", message):
        return text, how
    return "Unsupported", (f"{how}, {text[:90]!r}, cut to its type: the lab runs another torch than the page's, "
                           "and Dynamo words the same graph break differently from release to release")


def _page_exception(lines: list[str], found: list[Block]) -> tuple[str, int] | None:
    """The final exception line of the first complete traceback in the page's code blocks (or in its
    text, for pages that paste logs unfenced), cut to its stable part."""
    expected = [b for b in found if re.search(r"(?i)expect", b.label)]  # what should happen, not what did
    in_blocks = [(b.line - 1, b.end_line) for b in found
                 if b not in expected and (b.kind not in (Kind.SCRIPT, Kind.PYTHON) or b.prompts)]
    in_blocks += [(b.output_line - 1, b.end_line) for b in found if b.output and b not in expected]
    for start, end in in_blocks:
        hit = _exception_in(lines, start, end)
        if hit:
            return hit
    skip = {i for b in expected for i in range(b.line - 1, b.end_line)}
    prose = [ln if i not in skip else "" for i, ln in enumerate(lines)]
    hit = _exception_in(prose, 0, len(prose))
    if hit:
        return hit
    # a traceback's tail without its header (the last frames, then `ValueError: ...`): in an output,
    # traceback or shell block (`$ python repro.py` and what it printed), or pasted after a script's code
    tails = [(b.text, b.line) for b in found if b.kind in (Kind.OUTPUT, Kind.TRACEBACK, Kind.SHELL)
             and b not in expected]
    tails += [(b.output, b.output_line) for b in found if b.output and b not in expected]
    for text_block, first in tails:
        block_lines = text_block.splitlines()
        for k, text in reversed(list(enumerate(block_lines))):
            m = _EXC_LINE.match(text.strip()) if text and not text.startswith((" ", "\t")) else None
            if m and re.search(r"Error|Exception|Unsupported|exc\.", m.group(1)):
                return _stable(m.group(1), m.group(2) or "", block_lines, k), first + k
    return None


def _title_or_comment_exception(page: IssuePage, chosen: Block) -> tuple[str, int | None, str] | None:
    """An exception named in the script's comments (`# raises Unsupported: ...`) or in the title
    (`CppCompileError: C++ compile error`)."""
    for k, text in enumerate(chosen.code.splitlines()):
        if "#" not in text:
            continue
        comment = text.split("#", 1)[1].strip()
        comment = re.sub(r"^(?:raises|error|fails with|gives)[:\s]+", "", comment, flags=re.I)
        m = _EXC_LINE.match(comment)
        if m and m.group(2) and re.search(r"Error|Exception|Unsupported", m.group(1)):
            return (_stable(m.group(1), m.group(2), [], 0), chosen.line + k,
                    "an exception named in the script's comments")
    if page.title:
        m = re.search(r"`?([A-Za-z_][\w.]*(?:Error|Exception|Unsupported))(?::\s*([^`]+))?`?", page.title)
        if m and m.group(2):
            return _stable(m.group(1), m.group(2).strip(), [], 0), None, "the exception the title names"
    return None


_COMMENT_OUTPUT = re.compile(r"#\s*(?:got|gets|returns|outputs?|prints)[:\s]+(.+?)"
                             r"(?:,?\s*(?:but|it should|should|expected|instead)\b.*)?$", re.I)


def _comment_output(chosen: Block) -> tuple[str, int] | None:
    """Output written as a comment of the script: `print(b)  # got tensor(28.), it should be 36`."""
    for k, text in enumerate(chosen.code.splitlines()):
        m = _COMMENT_OUTPUT.search(text)
        if m and len(m.group(1).strip().rstrip(",.;")) >= 3:
            return " ".join(m.group(1).strip().rstrip(",;").split()), chosen.line + k
    return None


def _page_warning(found: list[Block], lines: list[str]) -> tuple[str, int] | None:
    """A warning the page's log shows (`[WARNING] ...`, `UserWarning: ...`), for stderr."""
    for i, text in enumerate(lines):
        m = re.search(r"\[WARNING\]\s*(.+)$|\b(\w*Warning): (.+)$", text)
        if m:
            message = m.group(1) or f"{m.group(2)}: {m.group(3)}"
            message = re.split(r"0x[0-9a-fA-F]{6,}|<bound method", message)[0].strip() or message
            return message[:100].strip(), i + 1
    return None


def _exception_in(lines: list[str], start: int, end: int) -> tuple[str, int] | None:
    i = start
    while i < end:
        if lines[i].lstrip().startswith("Traceback (most recent call last)"):
            j = i + 1
            while j < end:
                text = lines[j].rstrip()
                bare = re.sub(r"^\[rank\d+\]:\s*|^\s*[WE]\d{4} [\d:. ]+\d+ [\w/.]+:\d+\]\s*(\[[^\]]*\]\s*)*", "", text)
                m = _EXC_LINE.match(bare.strip()) if bare and not bare.startswith((" ", "\t")) else None
                if m and m.group(1) != "Traceback":
                    return _stable(m.group(1), m.group(2) or "", lines, j), j + 1
                j += 1
            i = j
        i += 1
    return None


def _stable(kind: str, message: str, lines: list[str], at: int) -> str:
    short = kind.rsplit(".", 1)[-1]
    if short in ("BackendCompilerFailed", "InductorError") or message.rstrip().endswith("raised:"):
        nxt = next((ln.strip() for ln in lines[at + 1:at + 4] if ln.strip()), "")
        if m := _EXC_LINE.match(nxt):
            short, message = m.group(1).rsplit(".", 1)[-1], m.group(2) or ""
    message = re.split(r"0x[0-9a-fA-F]{6,}|(?:/[\w.-]+){2,}|\bline \d+|\bat index \(|tensor\(", message)[0]
    message = message.strip().rstrip(":,;( ")
    if len(message) > 100:
        cut = message[:100].rsplit(" ", 1)[0]
        message = cut if len(cut) > 30 else message[:100]
    return f"{short}: {message}" if message else short


def _crash(found: list[Block], chosen: Block, page: IssuePage):
    pools = [(b.text, b.line) for b in found if b.kind in (Kind.OUTPUT, Kind.TRACEBACK)]
    pools += [("\n".join(ln for ln in chosen.code.splitlines() if ln.lstrip().startswith("#") or " # " in ln),
               chosen.line)]
    pools += [(page.title or "", None)]
    for text, line in pools:
        hits = sorted((m.start(), code, words) for pattern, code, words in _SIGNALS if (m := pattern.search(text)))
        if len(hits) == 1:
            _, code, words = hits[0]
            return code, words, line
        if hits:  # "IOT instruction (core dumped) or segmentation fault": any one of them counts
            return [code for _, code, _ in hits], " or ".join(words for _, _, words in hits), line
    return _memory_corruption(found, page)


_MEMORY = re.compile(r"(?i)\b(?:memory|heap) corruption\b|\bcorrupt(?:ed|s|ing)? (?:the )?(?:memory|heap)\b"
                     r"|\bheap[- ]buffer[- ]overflow\b|\bdouble free\b")


def _memory_corruption(found: list[Block], page: IssuePage):
    """A page that reports memory corruption in words (the title or its prose, not its code) and shows no
    signal: a crash, expected as SIGSEGV, the usual end of a write out of bounds."""
    in_code = _code_lines(found)
    said = [(page.title or "", None)] + [(t, i + 1) for i, t in enumerate(page.lines) if i not in in_code]
    for text, line in said:
        if m := _MEMORY.search(text):
            where = "the title" if line is None else "its text"
            return 139, (f"memory corruption ({where}: {m.group(0)!r}) and no signal: expected as a segmentation "
                         "fault (SIGSEGV, exit 139), the usual end of a write out of bounds"), line
    return None


_FLOAT = re.compile(r"-?\d+\.\d+(e[-+]?\d+)?|\bnan\b|\binf\b")


def _graph_break_claim(page: IssuePage, lines: list[str], found: list[Block], script: str):
    """The page says the compiled code graph-breaks (and shows no error): at least one graph break."""
    if not re.search(r"torch\.compile|torch\._dynamo", script):
        return None
    if page.title and re.search(r"(?i)graph[- ]?break", page.title):
        return "the title reports a graph break", None
    in_code = _code_lines(found)
    for i, text in enumerate(lines):
        claim = re.search(r"(?i)\b(causes?|gives?|there is|hits?|leads? to) (a )?graph[- ]?break", text)
        if i not in in_code and claim:
            return "the page reports a graph break", i + 1
    return None


def _page_output(found: list[Block], chosen: Block, script: str):
    random = re.search(r"\b(rand|randn|randint|rand_like|randn_like|normal_|uniform_|dropout)\b", script) and \
        "manual_seed" not in script
    if chosen.output and "Traceback" not in chosen.output:  # pasted under the code, in the same fence
        body = [ln.strip() for ln in chosen.output.splitlines() if ln.strip()]
        candidates = [ln for ln in body if not (random and _FLOAT.search(ln)) and not _EXC_LINE.match(ln)]
        if candidates:
            pick = candidates[-1]
            offset = next(k for k, ln in enumerate(chosen.output.splitlines()) if ln.strip() == pick)
            return " ".join(pick.split()), chosen.output_line + offset
    for b in found:
        if b.index <= chosen.index or b.kind is not Kind.OUTPUT:
            continue
        if re.search(r"(?i)expect", b.label):
            continue  # what should be printed, not what was
        code_like = re.search(r"^\s*(import|from) \w", b.text, re.M)
        if b.info in ("cpp", "c", "c++", "diff", "json", "yaml", "cuda") or code_like or "Traceback" in b.text:
            continue  # code, or a traceback cut short: not printed output
        body = [ln.strip() for ln in b.text.splitlines() if ln.strip()]
        candidates = [ln for ln in body if not (random and _FLOAT.search(ln))]
        if not candidates:
            continue
        pick = candidates[-1]
        offset = next(k for k, ln in enumerate(b.text.splitlines()) if ln.strip() == pick)
        return " ".join(pick.split()), b.line + offset
    return None


def _script_check(script: str) -> str | None:
    tree = ast.parse(script)
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and isinstance(node.exc.func, ast.Name):
            args = node.exc.args
            msg = _const(args[0]) if args else None
            return f"{node.exc.func.id}: {msg}" if msg else node.exc.func.id
        if isinstance(node, ast.Assert):
            msg = _const(node.msg) if node.msg is not None else None
            return f"AssertionError: {msg}" if msg else "AssertionError"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in ("assert_close", "assert_allclose", "assert_equal", "assert_array_equal"):
            return "AssertionError"
    return None


def _const(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.strip()[:100] or None
    if isinstance(node, ast.JoinedStr):
        parts = [v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str)]
        text = "".join(parts).strip()
        if len(text) >= 3 and len(parts) == len(node.values):
            return text[:100]
        return parts[0].strip()[:100] if parts and len(parts[0].strip()) >= 3 else None
    return None

