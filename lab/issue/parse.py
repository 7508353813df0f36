"""An issue page split into what the inference reads: fenced code blocks (with the page line each
starts on, its info string and its kind), the text outside them, and the Versions block."""

from __future__ import annotations

import ast
import re
import textwrap
from dataclasses import dataclass
from enum import Enum

__all__ = ["Block", "Kind", "blocks", "classify", "named_versions", "split_output", "versions_lines"]

_FENCE = re.compile(r"^(\s*(?:>\s*)*)(`{3,}|~{3,})\s*([\w+-]*)")
_PROMPT = re.compile(r"^(>>>|\.\.\.)( |$)")
_FRAME = re.compile(r'^\s*File "[^"]+", line \d+')
_LOG_PREFIX = re.compile(r"^\s*(\[?[WIEDV]\d{4} |\[\d{4}-\d\d-\d\d|\(\w+ pid=\d+\))")
_ENV_MARKERS = ("Collecting environment information", "PyTorch version:", "Is debug build:",
                "Versions of relevant libraries", "[pip3] ", "[conda] ", "CUDA used to build PyTorch")


# `transformers version: 4.31.0`, `- PyTorch Lightning Version (e.g., 1.5.0): 2.0.0`, `PyTorch version (GPU?): ...`
_VERSION_LINE = re.compile(r"^\s*[-*]?\s*([A-Za-z][\w .-]*?)\s+[Vv]ersion(?:\s*\([^)]*\))?\s*:\s*v?"
                           r"(\d+(?:\.\d+)+[\w.+-]*)")
# a `pip freeze` line: `numpy==1.26.4`
_FREEZE_LINE = re.compile(r"^\s*([A-Za-z][\w.-]*)\s*==\s*(\d[\w.+!-]*)\s*$")


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
    output: str = ""           # output pasted in the same fence after the code (split off, never run)
    output_line: int = 0       # the page line of its first line (0: none)

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
    output, at = "", 0
    if not prompts and info not in _SHELL_INFO and not text.lstrip().startswith("Traceback (most recent call last)"):
        split = split_output(text)
        if split is not None:
            kind2, code2, _ = classify(split[0], info)
            if kind2 in (Kind.SCRIPT, Kind.PYTHON):
                kind, code, output, at = kind2, code2, split[1], line + split[2]
    return Block(index=index, line=line, info=info, text=text, kind=kind, prompts=prompts, code=code, label=label,
                 output=output, output_line=at)


_SHELL_INFO = ("bash", "sh", "shell", "console")
# a line that says "what follows is the output": `# output`, `# Output:`, `'''output`, `Output:`, `# prints:`
_OUTPUT_MARKER = re.compile(r"""^\s*(?:#+\s*|'{3}\s*|"{3}\s*)?(?:the\s+)?(?:output|outputs|result|results|prints|"""
                            r"""printed|stdout|stderr|out|error|error message|log)\s*:?\s*(?:'{3}|"{3})?\s*$""", re.I)
# a line that starts printed output or an error at the top level: a tensor's repr, a number, a bool, an
# exception line, a traceback (header or frame), a crash message
_OUTPUT_START = re.compile(r"^(?:tensor\(|\(tensor\(|\[tensor\(|Parameter containing:|torch\.Size\(|array\(|"
                           r"[-+]?(?:\d|\.\d)|nan\b|inf\b|True$|False$|None$|"
                           r"[A-Z]\w*(?:Error|Exception|Warning|Unsupported|Failed)(?::|$)|"
                           r"[a-z_][\w.]*\.[A-Z]\w*(?:Error|Exception|Unsupported|Failed):|"
                           r"Traceback \(most recent call last\)|\s+File \"[^\"]+\", line \d+|"
                           r"Segmentation fault|Aborted|Illegal instruction|Floating point exception|terminate called)")
# a line that (re)starts code at the top level
_CODE_START = re.compile(r"^(?:import \w|from [\w.]+ import |def |class |@\w|if |for |while |with |try:|assert |"
                         r"print\(|return\b|[A-Za-z_][\w.]*(?:\[[^\]]*\])?\s*(?:[-+*/]?=(?!=)|,\s*\w+\s*=)|"
                         r"[A-Za-z_][\w.]*\()")
_TRIPLE = ("'''", '"""')


def split_output(text: str) -> tuple[str, str, int] | None:
    """(code, output, the output's first line as an offset in the block) when a code block has output
    pasted after its code: after a marker line (`# output`, `'''output`, `Output:`), or as lines that
    are not Python (a tensor's repr, an exception line, a traceback) after code that parses. Output
    between two pieces of code is removed too (the offset is then the first one's). None when there is
    nothing to split off, or when the code left does not parse."""
    lines = text.splitlines()
    code: list[str] = []
    output: list[str] = []
    first = -1
    in_output, quoted = False, ""
    for k, ln in enumerate(lines):
        if in_output:
            if quoted and ln.rstrip().endswith(quoted):
                in_output, quoted = False, ""  # the string that held the output closes here
                output.append(ln.rstrip()[:-3])
                continue
            if not quoted and ln.strip() and not ln[:1].isspace() and _CODE_START.match(ln) \
                    and not _OUTPUT_START.match(ln) and _parses("\n".join([*code, ln])):
                in_output = False
            else:
                output.append(ln)
                continue
        marker = _OUTPUT_MARKER.match(ln)
        starts = ln.strip() and not ln[:1].isspace() and _OUTPUT_START.match(ln)
        if marker or (starts and code and _parses("\n".join(code))):
            in_output = True
            first = (k + 1 if marker else k) if first < 0 else first
            if marker:
                stripped = ln.strip()
                quoted = next((q for q in _TRIPLE if stripped.startswith(q) and stripped.count(q) == 1), "")
            else:
                output.append(ln)
            continue
        code.append(ln)
    body = "\n".join(code).strip("\n")
    shown = "\n".join(output).strip("\n")
    if first < 0 or not shown.strip() or not body.strip() or not _parses(body) or _is_output_like(body):
        return None
    return body, shown, first


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
    named = sum(bool(_VERSION_LINE.match(ln) or _FREEZE_LINE.match(ln)) for ln in lines)
    if named >= 2 and named * 2 >= len(lines):  # `transformers version: 4.31.0` lines, a Lightning list, pip freeze
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


_NOT_PACKAGES = {"python", "torch", "pytorch", "cuda", "cudnn", "os", "gcc", "clang", "cmake", "libc", "rocm",
                 "nvidia driver", "driver", "hip runtime", "miopen runtime", "cuda runtime", "xla", "jax", "jaxlib",
                 "tensorflow", "flax"}


def named_versions(lines: list[str]) -> dict[str, tuple[str, int]]:
    """The packages an environment block pins, {PyPI-style name: (version, page line)}: collect_env's
    `[pip3] numpy==1.26.4` and `[conda] numpy 1.26.4`, `pip freeze`'s `numpy==1.26.4`, and the
    `transformers version: 4.31.0` / `- PyTorch Lightning Version (e.g., 1.5.0): 2.0.0` lines of
    transformers-cli env and Lightning's template. torch, Python and the system's tools are left out
    (the lab chooses those itself)."""
    pins: dict[str, tuple[str, int]] = {}
    for i, text in enumerate(lines):
        m = re.match(r"\s*\[(?:pip3?|conda)\]\s*([A-Za-z0-9_.-]+)\s*(?:==|\s)\s*(\d[\w.+!-]*)", text) \
            or _FREEZE_LINE.match(text) or _VERSION_LINE.match(text)
        if not m:
            continue
        name = re.sub(r"[\s_]+", "-", m.group(1).strip().lower())
        if name.replace("-", " ") in _NOT_PACKAGES or name in pins:
            continue
        pins[name] = (m.group(2).rstrip(".,;"), i + 1)
    return pins
