"""Oracles for wrong-result pages (issue 28): what makes a printed value wrong.

A page that reports a wrong result is judged by one of these, in this order, and the scenario's
script and report name the one used:

1. **expected value**: the page states what the output should be (`it should be 36`, `expected:
   tensor([1., 2.])`, `# should be True`): the script's whole stdout must show every stated value;
   a run that does not is a wrong result.
2. **two computations**: the page's script computes the same thing twice and says they should agree
   (eager against compiled, `expected` against `actual`, `ref` against `res`): the two values are
   compared with torch.testing.assert_close's tolerances for their dtype.
3. **observed output**: only the wrong output the page printed (lab.issue.infer's `_page_output`),
   kept where the page's numbers are deterministic.
4. **none**: no stated value, no pair, no deterministic output: the scenario says so (it prints
   `LAB-ORACLE: none: ...` first) and the judge gives the verdict `error`, never a guess.

The checks are appended to the page's script, so they run only when the script completes: a script
that raises is judged by its exception, as any other.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from lab.analyze.judge import NO_ORACLE, ORACLE_MARK
from lab.issue.parse import Block

__all__ = ["MARK", "NONE", "RIGHT", "WRONG", "Oracle", "compared_pair", "expected_value", "no_oracle",
           "stated_values", "two_computations", "wrong_result_claim"]

MARK = ORACLE_MARK
WRONG = f"{MARK} wrong result"
RIGHT = f"{MARK} right result"
NONE = NO_ORACLE

_CLAIM = re.compile(r"(?i)\b(wrong|incorrect(?:ly)?|silent(?:ly)?|inconsisten\w*|discrepanc\w*|mismatch\w*|"
                    r"miscompil\w*|different (?:values?|results?|outputs?)|outputs? differ\w*|accuracy)\b")
_VALUE = re.compile(r"^(?:tensor\(.*\)|\[[^\]]*\]|\([^)]*\)|-?\d+(?:\.\d*)?(?:e[-+]?\d+)?|True|False|nan|-?inf)$")
_STATED = re.compile(r"(?i)\b(?:should|must)\s+(?:be|return|print|give|equal|output)\s+[`'\"]?(?P<v>[^`'\",;]+?)"
                     r"[`'\"]?\s*(?:[,;]|\.(?:\s|$)|\s+(?:but|instead|not)\b|$)"
                     r"|\bexpected(?:\s+(?:output|result|value))?\s*(?:is|=|:)\s*[`'\"]?(?P<w>[^`'\",;]+?)[`'\"]?"
                     r"\s*(?:[,;]|\.(?:\s|$)|$)")
_REF = re.compile(r"(?i)^(?:eager\w*|\w*_eager|ref\w*|\w*_ref|expected\w*|expect|reference|res|out|output|result)$")
_OTHER = re.compile(r"(?i)(compil|actual|\bopt|_opt|inductor|^c_|_c$|jit|traced|aot|fast)")


@dataclass(frozen=True)
class Oracle:
    kind: str            # "expected value", "two computations", "none"
    words: str           # what is checked, for the fact and the script's comment
    line: int | None     # the page line it came from
    values: tuple[str, ...] = ()
    pair: tuple[str, str] | None = None

    def expect(self) -> dict[str, object]:
        return {"stdout_contains": NONE if self.kind == "none" else WRONG}

    def wrap(self, script: str) -> str:
        """The page's script with this oracle's check (or, for `none`, its notice first). The check runs
        after the page's code, or when the page's code calls sys.exit (many repros exit with their own
        verdict), never after an exception."""
        if self.kind == "none":
            return (f"# {NONE}: {self.words}\nprint({f'{NONE}: {self.words}'!r}, flush=True)\n\n" + script)
        if self.kind == "expected value":
            body = _EXPECTED.format(values=list(self.values), line=self.line, wrong=WRONG, right=RIGHT)
        else:
            a, b = self.pair or ("", "")
            body = _PAIR.format(a=a, b=b, wrong=WRONG, right=RIGHT)
        head = _HEAD.format(kind=self.kind, words=self.words, tee=_TEE if self.kind == "expected value" else "",
                            body=body)
        return (head + f"# --- the page's script (oracle: {self.kind}: {self.words})\n" + script.rstrip()
                + "\n\n_lab_oracle()\n")


_HEAD = '''# --- lab oracle (issue 28), {kind}: {words}
import sys as _lab_sys
{tee}
_lab_oracle_done = []


def _lab_oracle():
    if _lab_oracle_done:
        return
    _lab_oracle_done.append(True)
{body}

_lab_real_exit = _lab_sys.exit


def _lab_exit(*args):
    _lab_oracle()
    _lab_real_exit(*args)


_lab_sys.exit = _lab_exit

'''

_TEE = '''

class _LabTee:
    def __init__(self, out):
        self.out, self.seen = out, []

    def write(self, text):
        self.seen.append(str(text))
        return self.out.write(text)

    def __getattr__(self, name):
        return getattr(self.out, name)


_lab_tee = _LabTee(_lab_sys.stdout)
_lab_sys.stdout = _lab_tee
'''

_EXPECTED = '''    import re
    _lab_sys.stdout = _lab_tee.out
    seen = " ".join("".join(_lab_tee.seen).split())

    def shown(value):
        if re.fullmatch(r"-?\\d+", value):  # a whole number: 3 is shown by 3, 3. or 3.0000, not by 13 or 0.3
            return re.search(r"(?<![\\w.])" + re.escape(value) + r"(?:\\.0*)?(?![\\w.]*\\d)", seen) is not None
        if re.fullmatch(r"-?\\d+\\.\\d*(?:e[-+]?\\d+)?", value):
            return re.search(r"(?<![\\w.])" + re.escape(value) + r"(?!\\d)", seen) is not None
        return " ".join(value.split()) in seen

    missing = [v for v in {values!r} if not shown(v)]
    if missing:
        print("{wrong} (expected-value oracle, page line {line}): the page says the output should show "
              + ", ".join(repr(v) for v in missing) + "; the script did not print it", flush=True)
    else:
        print("{right} (expected-value oracle, page line {line}): every value the page expects was printed",
              flush=True)
'''

_PAIR = '''    def agree(a, b):
        torch = _lab_sys.modules.get("torch")
        try:
            if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
                return len(a) == len(b) and all(agree(x, y) for x, y in zip(a, b))
            if torch is not None and (isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor)):
                torch.testing.assert_close(torch.as_tensor(b).cpu(), torch.as_tensor(a).cpu(), equal_nan=True,
                                           check_dtype=False, check_device=False)
                return True
            return bool(a == b)
        except Exception as e:  # a mismatch (AssertionError) or values that cannot be compared
            print(f"lab oracle: {{type(e).__name__}}: {{str(e).strip()[:400]}}")
            return False

    try:
        same = agree({a}, {b})
    except NameError as e:  # the page's code exited before computing both
        print(f"lab oracle: cannot compare: {{e}}", flush=True)
        return
    if same:
        print("{right} (two-computation oracle): {a} and {b} agree", flush=True)
    else:
        print("{wrong} (two-computation oracle): {a} and {b} differ", flush=True)
'''


def wrong_result_claim(title: str | None, lines: list[str]) -> str | None:
    """Why the page reports a wrong result (its title or its `module: correctness` label), or None."""
    for text in lines[:12]:  # the stored page's head (after a front matter)
        if text.startswith("labels:") and "correctness" in text:
            return "its label 'module: correctness'"
    if title and (m := _CLAIM.search(title)):
        return f"its title ({m.group(0)!r})"
    return None


def stated_values(lines: list[str], found: list[Block], chosen: Block) -> list[tuple[str, int]]:
    """Values the page says the output should be, in its prose or the script's comments."""
    in_code = {i for b in found for i in range(b.line - 1, b.end_line)}
    said = [(t, i + 1) for i, t in enumerate(lines) if i not in in_code]
    said += [(t.split("#", 1)[1], chosen.line + k) for k, t in enumerate(chosen.code.splitlines()) if "#" in t]
    got = []
    for text, line in said:
        for m in _STATED.finditer(text):
            value = (m.group("v") or m.group("w") or "").strip().strip("*").rstrip(".").strip()
            if _VALUE.match(value) and (value, line) not in got:
                got.append((value, line))
    return got


_AGREE = re.compile(r"(?i)\b(?:not equal|equal to|(?:should|must) (?:be )?(?:the )?same|should agree|should match|"
                    r"differs? from|different from|inconsisten\w*|mismatch\w*|discrepanc\w*)\b")


def compared_pair(script: str, prose: str = "") -> tuple[str, str] | None:
    """Two module-level names the script assigns, one the reference (eager, expected, ref...) and one
    the result under test (compiled, actual, opt...): the last of each kind. Failing that, where the
    page's prose says two results should agree (`is not equal to`), the script's last two
    `print(expression)` lines."""
    try:
        tree = ast.parse(script)
    except SyntaxError:
        return None
    pair = _named_pair(tree)
    if pair or not _AGREE.search(prose):
        return pair
    printed = [node.value.args[0] for node in tree.body
               if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
               and isinstance(node.value.func, ast.Name) and node.value.func.id == "print"
               and len(node.value.args) == 1 and not node.value.keywords
               and not isinstance(node.value.args[0], (ast.Constant, ast.JoinedStr))]
    if len(printed) >= 2:
        return ast.unparse(printed[-2]), ast.unparse(printed[-1])
    return None


def _named_pair(tree: ast.Module) -> tuple[str, str] | None:
    names = [t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets
             if isinstance(t, ast.Name)]
    other = [n for n in names if _OTHER.search(n) and not _is_callable_name(n, tree)]
    ref = [n for n in names if _REF.match(n) and n not in other and not _is_callable_name(n, tree)]
    if ref and other:
        return ref[-1], other[-1]
    return None


def _is_callable_name(name: str, tree: ast.Module) -> bool:
    """A name bound to a model or a compiled function (`c_model = torch.compile(model)`), not a value."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            value = node.value
            if isinstance(value, ast.Call):
                func = ast.unparse(value.func)
                if func.endswith(("compile", "optimize", "script", "trace")) or func[:1].isupper():
                    return True
    return False


def no_oracle(claim: str) -> Oracle:
    return Oracle("none", f"the page reports a wrong result ({claim}) but states neither the right output nor "
                          "two computations that should agree, and shows no deterministic output: no oracle",
                  None)


def expected_value(values: list[tuple[str, int]]) -> Oracle:
    shown = ", ".join(repr(v) for v, _ in values)
    return Oracle("expected value", f"the page says the output should be {shown}", values[0][1],
                  values=tuple(v for v, _ in values))


def two_computations(pair: tuple[str, str], line: int | None) -> Oracle:
    return Oracle("two computations", f"{pair[0]} and {pair[1]} should agree (torch.testing.assert_close's "
                                      "tolerances)", line, pair=pair)
