"""An issue page split into what the inference reads: fenced code blocks (with the page line each
starts on, its info string and its kind), the text outside them, and the Versions block."""

from __future__ import annotations

import ast
import re
import textwrap
from dataclasses import dataclass
from enum import Enum

__all__ = ["Block", "Kind", "blocks", "classify", "versions_lines"]

_FENCE = re.compile(r"^(\s*(?:>\s*)*)(`{3,}|~{3,})\s*([\w+-]*)")
_PROMPT = re.compile(r"^(>>>|\.\.\.)( |$)")
_FRAME = re.compile(r'^\s*File "[^"]+", line \d+')
_LOG_PREFIX = re.compile(r"^\s*(\[?[WIEDV]\d{4} |\[\d{4}-\d\d-\d\d|\(\w+ pid=\d+\))")
_ENV_MARKERS = ("Collecting environment information", "PyTorch version:", "Is debug build:",
                "Versions of relevant libraries", "[pip3] ", "[conda] ", "CUDA used to build PyTorch")


class Kind(str, Enum):
    SCRIPT = "script"          # Python that parses and does something with torch
    PYTHON = "python"          # Python that parses, but looks like a fragment
    TRACEBACK = "traceback"    # a traceback or a log
    OUTPUT = "output"          # printed output (tensors, text)
    ENV = "env"                # collect_env output, pip lists
    SHELL = "shell"            # commands


@dataclass(frozen=True)
class Block:
    """One fenced code block: `line` is the page line (1-based) of its first content line."""

    index: int
    line: int
    info: str
    text: str
    kind: Kind
    prompts: bool = False      # written as a >>> session (prompts removed from `code`)
    code: str = ""             # the Python to run, for SCRIPT and PYTHON blocks
    label: str = ""            # the text just before the block ("Output:", "Error logs")

    @property
    def end_line(self) -> int:
        return self.line + self.text.count("\n")


def blocks(lines: list[str]) -> list[Block]:
    """Fenced blocks in page order. A fence inside a block quote (`> ```python`) counts; an unclosed
    fence runs to the end of the page."""
    found: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        quote, fence, info = m.group(1), m.group(2), m.group(3).lower()
        body: list[str] = []
        j = i + 1
        while j < len(lines):
            stripped = lines[j][len(quote):] if lines[j].startswith(quote) else lines[j].lstrip("> ")
            if stripped.strip().startswith(fence[0] * len(fence)) and not stripped.strip().strip(fence[0]):
                break
            body.append(stripped)
            j += 1
        label = _label(lines, i)
        text = textwrap.dedent("\n".join(body)).strip("\n")
        found.append(_make(len(found), i + 2, info, text, label))
        i = j + 1
    return found


def _label(lines: list[str], fence_index: int) -> str:
    for k in range(fence_index - 1, max(-1, fence_index - 4), -1):
        text = lines[k].strip().lstrip("#*> ").strip()
        if text:
            return text[:120]
    return ""


def _make(index: int, line: int, info: str, text: str, label: str) -> Block:
    kind, code, prompts = classify(text, info)
    return Block(index=index, line=line, info=info, text=text, kind=kind, prompts=prompts, code=code, label=label)


def classify(text: str, info: str = "") -> tuple[Kind, str, bool]:
    """(kind, runnable code, whether >>> prompts were removed)."""
    stripped = text.strip()
    if not stripped:
        return Kind.OUTPUT, "", False
    lines = stripped.splitlines()
    if stripped.startswith("Traceback (most recent call last)") or sum(bool(_FRAME.match(ln)) for ln in lines) >= 2 \
            or sum(bool(_LOG_PREFIX.match(ln)) for ln in lines) >= max(2, len(lines) // 2):
        return Kind.TRACEBACK, "", False
    if any(marker in stripped for marker in _ENV_MARKERS) and "import" not in stripped:
        return Kind.ENV, "", False
    prompts = sum(bool(_PROMPT.match(ln)) for ln in lines) >= 2 or _PROMPT.match(lines[0]) is not None
    code = _strip_prompts(lines) if prompts else stripped
    code = _comment_magics(code)
    if info in ("bash", "sh", "shell", "console") or all(ln.lstrip().startswith(("$ ", "pip ", "python ", "conda "))
                                                          for ln in lines):
        return Kind.SHELL, "", False
    if _parses(code):
        if _is_output_like(stripped) and all(isinstance(n, ast.Expr) for n in ast.parse(code).body):
            return Kind.OUTPUT, "", False
        if _looks_like_script(code):
            return Kind.SCRIPT, code, prompts
        if _is_output_like(stripped) or not _codeish(code):
            return Kind.OUTPUT, "", False  # `eager = 31` parses too
        return Kind.PYTHON, code, prompts
    return Kind.OUTPUT, "", False


def _strip_prompts(lines: list[str]) -> str:
    """A >>> session: the statements, without the printed results."""
    kept = []
    for ln in lines:
        m = _PROMPT.match(ln)
        if m:
            kept.append(ln[4:] if len(ln) > 3 else "")
    return "\n".join(kept)


_MAGIC = re.compile(r"^(\s*)([%!].*)$", re.M)


def _comment_magics(code: str) -> str:
    """IPython magics (`%timeit f(x)`, `!pip install`) are not Python: commented out."""
    return _MAGIC.sub(lambda m: f"{m.group(1)}# {m.group(2)}  # (IPython magic, commented out by the lab)", code)


def _parses(code: str) -> bool:
    try:
        ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return True


def _looks_like_script(code: str) -> bool:
    tree = ast.parse(code)
    statements = list(ast.walk(tree))
    has_import = any(isinstance(n, (ast.Import, ast.ImportFrom)) for n in statements)
    calls = sum(isinstance(n, ast.Call) for n in statements)
    mentions_torch = "torch" in code or re.search(r"\b(nn|F)\.", code) is not None
    top = tree.body
    only_exprs = all(isinstance(s, ast.Expr) for s in top)
    if only_exprs and not has_import and len(top) <= 2 and calls <= 1:
        return False  # `tensor([1., 2.])` printed output also parses
    return mentions_torch and (has_import or calls >= 1 or any(isinstance(s, (ast.FunctionDef, ast.ClassDef))
                                                               for s in top))


def _codeish(code: str) -> bool:
    """Python that does something: mentions torch, defines, imports or calls."""
    tree = ast.parse(code)
    return "torch" in code or any(isinstance(n, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef, ast.Call))
                                  for n in ast.walk(tree))


def _is_output_like(text: str) -> bool:
    return text.startswith(("tensor(", "(tensor", "[tensor", "Parameter", "True", "False", "torch.Size"))


def versions_lines(lines: list[str]) -> list[int]:
    """Indexes of the page lines that belong to collect_env output (in or out of code blocks)."""
    keep = []
    for i, ln in enumerate(lines):
        if any(ln.lstrip().startswith(m) for m in _ENV_MARKERS) or ln.lstrip().startswith(
                ("OS:", "Python version:", "Python platform:", "Architecture:", "Is CUDA available:",
                 "CUDA runtime version:", "GPU models and configuration:")):
            keep.append(i)
    return keep
