"""Tests for lab.dynamo on real diagnose-run output (see tests/data/dynamo/README.md), and for the
in-container runner lab/probe/lab_run.py driven by a stub torch, so that neither torch nor Docker
is needed here."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lab.analyze.dynamo import (
    COMPILE_TIMES_FORMAT,
    EXPLAIN_FORMAT,
    CompiledFunction,
    Diagnostics,
    ExplainReport,
    GraphBreakReason,
    PhaseTime,
    Recompile,
    load_diagnostics,
    parse_compile_times,
    parse_explain,
    parse_recompiles,
)

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parents[1] / "data" / "dynamo"
RUNNER = ROOT / "lab" / "probe" / "lab_run.py"

HOST = "torch2.13.0-x86_64"
ARM = ("torch2.9.0-arm64", "torch2.3.1-arm64", "torch2.1.2-arm64")
VERSIONS = (HOST, *ARM)
TORCH = {HOST: "2.13.0+cpu", "torch2.9.0-arm64": "2.9.0+cpu", "torch2.3.1-arm64": "2.3.1", "torch2.1.2-arm64": "2.1.2"}
# How each torch words the graph break on print("woo").
PRINT_BREAK = {
    HOST: "Failed to trace builtin operator",
    "torch2.9.0-arm64": "Failed to trace builtin operator",
    "torch2.3.1-arm64": "call_function BuiltinVariable(print) [ConstantVariable()] {}",
    "torch2.1.2-arm64": "call_function BuiltinVariable(print) [ConstantVariable(str)] {}",
}


def _run(version: str, program: str) -> Path:
    return DATA / version / program


def _stderr(version: str, program: str) -> str:
    return (_run(version, program) / "stderr.txt").read_text()


# --- explain.json -------------------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
def test_toy_example_has_two_graph_breaks(version):
    report = parse_explain(_run(version, "toy") / "explain.json")
    assert report is not None
    assert report.torch == TORCH[version]
    assert report.notes == ()
    (fn,) = report.functions
    assert (fn.name, fn.kind, fn.status, fn.error) == ("toy_example", "function", "explained", None)
    assert fn.location is not None and fn.location.endswith("toy.py:4")
    assert (fn.graph_count, fn.graph_break_count) == (3, 2)
    assert fn.op_count is not None and fn.op_count >= 5
    printed, branch = fn.breaks
    assert printed.headline == PRINT_BREAK[version]
    assert printed.location is not None and printed.location.endswith("toy.py:6")
    assert (printed.source, printed.function) == ('print("woo")', "toy_example")
    assert branch.headline == "generic_jump TensorVariable()"
    assert branch.location is not None and branch.location.endswith("toy.py:7")
    assert branch.source == "if b.sum() < 0:"
    # the frame after a graph break runs in a generated "resume" function, named differently in 2.1
    resume = "<resume in toy_example>" if version == "torch2.1.2-arm64" else "torch_dynamo_resume_in_toy_example_at_6"
    assert branch.function == resume
    assert (report.graph_count, report.graph_break_count) == (3, 2)


def test_new_torch_reasons_carry_an_explanation():
    report = parse_explain(_run(HOST, "toy") / "explain.json")
    assert report is not None
    printed = report.functions[0].breaks[0]
    assert printed.explanation == ("Dynamo does not know how to trace builtin operator `print` with argument "
                                   "types ['str'] (has_kwargs False)")
    assert "Hint:" in printed.reason
    old = parse_explain(_run("torch2.3.1-arm64", "toy") / "explain.json")
    assert old is not None and old.functions[0].breaks[0].explanation is None


@pytest.mark.parametrize("version", VERSIONS)
def test_compiled_module_is_explained_as_a_module(version):
    report = parse_explain(_run(version, "module") / "explain.json")
    assert report is not None
    (fn,) = report.functions
    assert (fn.name, fn.kind, fn.status) == ("Net", "module", "explained")
    assert fn.location is not None and fn.location.endswith("module.py:9")
    assert (fn.graph_count, fn.graph_break_count) == (2, 1)
    (branch,) = fn.breaks
    assert branch.location is not None and branch.location.endswith("module.py:11")
    assert branch.source == "if y.sum() > 0:"
    # the compiled module stayed a module: the script printed its class, a child's attribute, .eval()
    assert (_run(version, "module") / "stdout.txt").read_text() == "OptimizedModule 3 False\n(2, 3)\n"


@pytest.mark.parametrize("version", VERSIONS)
def test_hooked_compile_calls(version):
    """mixed.py ran with LAB_COMPILE_HOOK=1 LAB_BACKEND=eager."""
    report = parse_explain(_run(version, "mixed") / "explain.json")
    assert report is not None
    by_name = {f.name: f for f in report.functions}
    assert by_name["bare"].hook_changes == ("backend 'default' -> 'eager'",)
    assert by_name["configured"].hook_changes == (
        "backend 'inductor' -> 'eager'", "mode 'max-autotune' dropped (backend 'eager')")
    assert by_name["configured"].graph_break_count == 1
    assert by_name["never_called"].status == "never_called"
    assert by_name["broken"].status == "failed"
    assert by_name["broken"].error == "ValueError: broken on purpose"
    assert (by_name["Small"].kind, by_name["Small"].status) == ("module.compile", "explained")
    stdout = (_run(version, "mixed") / "stdout.txt").read_text()
    assert "caught: broken on purpose" in stdout


@pytest.mark.parametrize("version", VERSIONS)
def test_nested_compiled_calls_are_explained_once_each(version):
    report = parse_explain(_run(version, "nested") / "explain.json")
    assert report is not None
    assert [(f.name, f.status, f.graph_break_count) for f in report.functions] == [
        ("inner", "explained", 0), ("Block", "explained", 0), ("outer", "explained", 1)]


@pytest.mark.parametrize("version", VERSIONS)
def test_explain_text_is_kept_for_humans(version):
    text = (_run(version, "toy") / "explain.txt").read_text()
    assert text.startswith("=== [0] function toy_example (")
    assert "Graph Count: 3" in text and "Graph Break Count: 2" in text


def test_script_that_raises_still_leaves_its_explanation():
    """The dlpack-cpu scenario (fullgraph=True) through lab_run.py: exit 1, and explain.json."""
    run = DATA / "torch2.9.0-arm64" / "dlpack"
    assert (run / "rc.txt").read_text().strip() == "dlpack rc=1"
    assert "torch._dynamo.exc.Unsupported" in (run / "stderr.txt").read_text()
    report = parse_explain(run / "explain.json")
    assert report is not None
    (fn,) = report.functions
    assert (fn.name, fn.kind, fn.status) == ("MyModel", "module", "explained")
    assert fn.graph_break_count and fn.graph_break_count >= 1
    assert any("to_dlpack" in b.reason for b in fn.breaks)


def test_unsupported_trace_on_torch_2_1():
    report = parse_explain(_run("torch2.1.2-arm64", "toy") / "explain.json")
    assert report is not None
    assert report.unsupported == ("TORCH_TRACE: structured trace logging is missing in this torch",)


# --- TORCH_LOGS=recompiles ----------------------------------------------------------------------


def test_recompiles_torch_2_13_and_2_9():
    for version in (HOST, "torch2.9.0-arm64"):
        found = parse_recompiles(_stderr(version, "recompile"))
        assert [r.compile_id for r in found] == ["0/1", "0/2", "0/3"]
        assert all(r.function == "scale" and r.location.endswith("recompile.py:4") for r in found)
        assert found[0].reasons == ("tensor 'x' size mismatch at index 0. expected 2, actual 3",)
        assert found[1].reasons == ("tensor 'x' size mismatch at index 0. expected 3, actual 4",
                                    "tensor 'x' size mismatch at index 0. expected 2, actual 4")
        assert found[2].reasons == ("tensor 'x' dtype mismatch. expected Float, actual Double",) * 3


def test_recompiles_torch_2_3_has_no_compile_ids():
    found = parse_recompiles(_stderr("torch2.3.1-arm64", "recompile"))
    assert len(found) == 3
    assert [r.compile_id for r in found] == [None, None, None]
    assert found[0] == Recompile("scale", "/s/recompile.py:4",
                                 ("tensor 'L['x']' size mismatch at index 0. expected 2, actual 3",))
    assert len(found[2].reasons) == 3


def test_recompiles_torch_2_1_tuple_records():
    found = parse_recompiles(_stderr("torch2.1.2-arm64", "recompile"))
    assert [r.reasons for r in found] == [
        ("tensor 'L['x']' size mismatch at index 0. expected 2, actual 3",),
        ("tensor 'L['x']' size mismatch at index 0. expected 3, actual 4",),
        ("tensor 'L['x']' dtype mismatch. expected Float, actual Double",),
    ]
    assert {r.location for r in found} == {"/s/recompile.py:4"}


@pytest.mark.parametrize("version", VERSIONS)
def test_no_recompiles_where_none_happened(version):
    for program in ("toy", "module", "mixed", "nested"):
        assert parse_recompiles(_stderr(version, program)) == ()


def test_recompile_snippets():
    text = (
        "woo\n"
        "[rank0]:V1122 12:40:29.338000 7091 torch/_dynamo/guards.py:5396] [0/1_1] [__recompiles_verbose] "
        "Recompiling function f in /a b/x.py:12\n"
        "    triggered by the following guard failure(s):\n"
        "    - 0/0: ___check_obj_id(L['self'], 1)\n"
        "        guard detail on a second line\n"
        "    - 0/1: tensor 'x' dtype mismatch\n"
        "Traceback (most recent call last):\n"
    )
    (r,) = parse_recompiles(text)
    assert r == Recompile("f", "/a b/x.py:12", ("___check_obj_id(L['self'], 1)\nguard detail on a second line",
                                                 "tensor 'x' dtype mismatch"), "0/1_1")
    assert parse_recompiles("") == ()
    assert parse_recompiles("Recompiling function g in y.py:3\n")[0].reasons == ()


# --- compile_times.json -------------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
def test_compile_times(version):
    phases = parse_compile_times(_run(version, "toy") / "compile_times.json")
    names = {p.name for p in phases}
    inner = "_compile.compile_inner" if version in (HOST, "torch2.9.0-arm64") else "_compile.<locals>.compile_inner"
    assert inner in names
    assert "OutputGraph.call_user_compiler" in names
    assert all(p.total_s >= 0 and (p.calls is None or p.calls >= 1) for p in phases)
    compile_inner = next(p for p in phases if p.name == inner)
    assert compile_inner.calls in (3, 4) and compile_inner.total_s > 0


def test_compile_times_exclude_explains_own_compiles():
    """Explain compiles the toy example's 3 frames too; the runner puts the metrics back afterwards.

    The real run compiles 3 frames, or 4 when the random `b.sum() < 0` took both branches (the
    frame after the `if` is compiled per branch); with explain's compiles left in it would be 6-7.
    """
    for version in VERSIONS:
        phases = parse_compile_times(_run(version, "toy") / "compile_times.json")
        assert next(p for p in phases if p.name.endswith("compile_inner")).calls in (3, 4)


def test_compile_times_missing_or_unavailable(tmp_path):
    assert parse_compile_times(tmp_path / "nope.json") == ()
    doc = {"format": COMPILE_TIMES_FORMAT, "available": False, "phases": [],
           "note": "torch._dynamo.utils.compile_times: missing in this torch"}
    (tmp_path / "compile_times.json").write_text(json.dumps(doc))
    assert parse_compile_times(tmp_path / "compile_times.json") == ()
    diag = load_diagnostics(tmp_path, tmp_path / "trace", "")
    assert "compile times: torch._dynamo.utils.compile_times: missing in this torch" in diag.notes


# --- the combined record ------------------------------------------------------------------------


def test_load_diagnostics_toy_on_the_host():
    run = _run(HOST, "toy")
    diag = load_diagnostics(run, run / "trace", _stderr(HOST, "toy"))
    (trace,) = diag.trace_files
    assert trace.startswith("dedicated_log_torch_trace_") and trace.endswith(".log")
    assert diag.trace_files == tuple(p.name for p in (run / "trace").iterdir())
    assert diag.notes == ()
    words = diag.plain_words()
    assert words[0] == (
        "2 graph breaks in toy_example (3 graphs): 1. Failed to trace builtin operator (Dynamo does not know "
        "how to trace builtin operator `print` with argument types ['str'] (has_kwargs False)) at toy.py:6 "
        "`print(\"woo\")`; 2. generic_jump TensorVariable() at toy.py:7 `if b.sum() < 0:`")
    assert words[1].startswith("compile time by phase: _compile.compile_inner ")
    assert words[2] == f"TORCH_TRACE wrote 1 file (open with tlparse): `{trace}`"
    doc = diag.to_json()
    assert json.loads(json.dumps(doc)) == doc
    assert doc["explain"]["graph_break_count"] == 2
    assert doc["explain"]["functions"][0]["breaks"][1]["source"] == "if b.sum() < 0:"


def test_load_diagnostics_recompiles_in_words():
    run = _run("torch2.3.1-arm64", "recompile")
    diag = load_diagnostics(run, run / "trace", _stderr("torch2.3.1-arm64", "recompile"))
    assert len(diag.recompiles) == 3
    assert ("recompiled scale (recompile.py:4): tensor 'L['x']' size mismatch at index 0. expected 2, actual 3"
            in diag.plain_words())
    assert "no graph breaks in scale (1 graph)" in diag.plain_words()


def test_repeated_guard_failures_are_said_once():
    run = _run("torch2.9.0-arm64", "recompile")
    diag = load_diagnostics(run, run / "trace", _stderr("torch2.9.0-arm64", "recompile"))
    assert ("recompiled scale (recompile.py:4): tensor 'x' dtype mismatch. expected Float, actual Double "
            "(3 cache entries)") in diag.plain_words()


def test_load_diagnostics_notes_when_trace_predates_torch():
    run = _run("torch2.1.2-arm64", "toy")
    diag = load_diagnostics(run, run / "trace", _stderr("torch2.1.2-arm64", "toy"))
    assert diag.trace_files == ()
    assert diag.notes == ("TORCH_TRACE produced nothing: torch 2.1.2 predates structured trace logging",)
    assert diag.plain_words()[-1] == diag.notes[0]


def test_load_diagnostics_with_nothing(tmp_path):
    diag = load_diagnostics(tmp_path / "diag", tmp_path / "trace", "")
    assert diag.explain is None and diag.recompiles == () and diag.compile_times == ()
    assert diag.notes[0].startswith("no readable explain.json")
    assert diag.notes[1] == "TORCH_TRACE produced nothing (this torch)"
    assert diag.to_json()["explain"] is None


def test_trace_files_are_relative_and_sorted(tmp_path):
    (tmp_path / "trace" / "rank_1").mkdir(parents=True)
    (tmp_path / "trace" / "b.log").write_text("x")
    (tmp_path / "trace" / "rank_1" / "a.log").write_text("x")
    diag = load_diagnostics(tmp_path, tmp_path / "trace", "")
    assert diag.trace_files == ("b.log", "rank_1/a.log")
    assert "TORCH_TRACE wrote 2 files" in diag.plain_words()[-2]


def test_malformed_explain_json(tmp_path):
    path = tmp_path / "explain.json"
    assert parse_explain(path) is None
    path.write_text("{not json")
    assert parse_explain(path) is None
    path.write_text("[1, 2]")
    assert parse_explain(path) is None
    path.write_text(json.dumps({"format": "other/9", "records": [7, {"name": 3, "breaks": [None, {}]}]}))
    report = parse_explain(path)
    assert report is not None
    assert report.notes == ("explain.json: unexpected format 'other/9' (expected 'torch-repro-lab/explain/1'); "
                            "read anyway", "explain.json: record 0 is not an object; skipped")
    (fn,) = report.functions
    assert fn == CompiledFunction(name="<unnamed>", kind="unknown", location=None, status="unknown",
                                  breaks=(GraphBreakReason(reason=""),))


def test_plain_words_cover_every_status():
    report = ExplainReport(torch="2.5.1", python="3.11.2", functions=(
        CompiledFunction("f", "function", "/a/f.py:1", "never_called"),
        CompiledFunction("g", "function", None, "failed", error="RuntimeError: boom\nmore"),
        CompiledFunction("h", "function", None, "unsupported"),
        CompiledFunction("k", "function", None, "explained", graph_count=7, graph_break_count=6,
                         breaks=tuple(GraphBreakReason(f"r{i}", f"/a/k.py:{i}") for i in range(6))),
    ))
    diag = Diagnostics(explain=report, compile_times=(PhaseTime("a", 0.5, 2), PhaseTime("b", 1.5)))
    words = diag.plain_words()
    assert words[:3] == ["f (f.py:1) was compiled but never called",
                         "explain failed for g: RuntimeError: boom", "h: not explained (unsupported)"]
    assert words[3].startswith("6 graph breaks in k (7 graphs): 1. r0 at k.py:0; ")
    assert words[3].endswith("5. r4 at k.py:4; ... and 1 more")
    assert words[4] == "compile time by phase: b 1.500 s, a 0.500 s (2 calls)"


# --- robustness ---------------------------------------------------------------------------------

_KEYS = ["format", "torch", "python", "records", "unsupported", "notes", "name", "kind", "file", "line", "status",
         "graph_count", "graph_break_count", "op_count", "breaks", "error", "type", "message", "reason",
         "user_stack", "source", "hook_changes", "phases", "total_s", "calls", "note"]
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(_KEYS) | st.text(max_size=5),
                                                                inner, max_size=6),
    max_leaves=30,
)
_LOG_FRAGMENTS = [
    "V1122 12:40:29.338000 7091 torch/_dynamo/guards.py:5396] [0/1] [__recompiles] ",
    "[2023-10-04 12:00:00,123] torch._dynamo.convert_frame.__recompiles: [DEBUG] ",
    "Recompiling function f in x.py:4", "Recompiling function  in :",
    "    triggered by the following guard failure(s):",
    "triggered by the following guard failure: ", "    - 0/0: tensor 'x' size mismatch", "- ", "        more",
    "('Recompiling function f in x.py:4', 'triggered by the following guard failure: y')", "('Recompiling function",
    "\n", "\r\n", "[rank3]:", "(", ")", "'", '"', "\\",
]


def _check_report(report: ExplainReport | None) -> None:
    diag = Diagnostics(explain=report)
    json.dumps(diag.to_json())
    assert all(isinstance(line, str) for line in diag.plain_words())


@settings(derandomize=True, max_examples=200, deadline=None)
@given(doc=_JSON, raw=st.binary(max_size=200), text=st.lists(
    st.sampled_from(_LOG_FRAGMENTS) | st.text(max_size=30), max_size=25).map("".join))
def test_parsers_never_raise_on_junk(doc, raw, text):
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        for name, payload in (("explain.json", json.dumps(doc).encode()), ("compile_times.json", raw)):
            (base / name).write_bytes(payload)
        _check_report(parse_explain(base / "explain.json"))
        phases = parse_compile_times(base / "compile_times.json")
        assert all(isinstance(p, PhaseTime) for p in phases)
        (base / "compile_times.json").write_text(json.dumps({"phases": doc}))
        parse_compile_times(base / "compile_times.json")
        found = parse_recompiles(text)
        assert all(isinstance(r, Recompile) for r in found)
        diag = load_diagnostics(base, base / "trace", text)
        json.dumps(diag.to_json())
        diag.plain_words()


@settings(derandomize=True, max_examples=200, deadline=None)
@given(path=st.lists(st.sampled_from(["records", 0, 1, "breaks", "user_stack", "error", "line", "file", "name"]),
                     min_size=1, max_size=5), value=_JSON)
def test_parsers_never_raise_on_damaged_real_documents(path, value):
    doc = json.loads((_run(HOST, "mixed") / "explain.json").read_text())
    _plant(doc, path, value)
    with tempfile.TemporaryDirectory() as tmp:
        target = Path(tmp) / "explain.json"
        target.write_text(json.dumps(doc))
        _check_report(parse_explain(target))


def _plant(doc: object, path: list, value: object) -> None:
    """Put `value` at the first position along `path` that exists in `doc`'s structure."""
    node = doc
    for i, key in enumerate(path):
        last = i == len(path) - 1
        if isinstance(node, dict) and isinstance(key, str):
            if last or key not in node:
                node[key] = value
                return
            node = node[key]
        elif isinstance(node, list) and isinstance(key, int) and key < len(node):
            if last:
                node[key] = value
                return
            node = node[key]
        else:
            return


# --- the runner, driven by a stub torch ---------------------------------------------------------


def test_runner_is_python_3_8_syntax():
    ast.parse(RUNNER.read_text(), feature_version=(3, 8))
    assert EXPLAIN_FORMAT in RUNNER.read_text() and COMPILE_TIMES_FORMAT in RUNNER.read_text()


@pytest.fixture
def stub_torch(tmp_path) -> Path:
    """A folder with a package `torch` made from tests/data/dynamo/stub_torch (*.py.txt)."""
    for src in (DATA / "stub_torch").rglob("*.py.txt"):
        dest = tmp_path / "site" / src.relative_to(DATA / "stub_torch").with_suffix("")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dest)
    return tmp_path / "site"


def _run_runner(script: Path, *args: str, env: dict | None = None, pythonpath: Path | None = None,
                python: str = sys.executable) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("LAB_", "TORCH_"))}
    full.pop("PYTHONPATH", None)
    if pythonpath is not None:
        full["PYTHONPATH"] = str(pythonpath)
    full.update(env or {})
    return subprocess.run([python, str(RUNNER), str(script), *args], capture_output=True, text=True,
                          env=full, timeout=60, cwd=script.parent)


PASSTHROUGH = """\
import os, sys
print(__name__, sys.argv, sys.path[0] == os.path.dirname(os.path.realpath(__file__)), "torch" in sys.modules)
if len(sys.argv) > 1 and sys.argv[1] == "exit":
    sys.exit(int(sys.argv[2]))
if len(sys.argv) > 1 and sys.argv[1] == "raise":
    raise KeyError("boom")
"""


def test_runner_passes_argv_and_exit_codes_through(tmp_path):
    script = tmp_path / "s.py"
    script.write_text(PASSTHROUGH)
    done = _run_runner(script, "a", "b c")
    assert done.returncode == 0
    assert done.stdout == f"__main__ {[str(script), 'a', 'b c']} True False\n"
    assert _run_runner(script, "exit", "3").returncode == 3
    raised = _run_runner(script, "raise")
    assert raised.returncode == 1
    assert raised.stderr.rstrip().endswith("KeyError: 'boom'")
    assert not list(tmp_path.glob("*.json"))
    assert _run_runner(tmp_path / "s.py", env={"LAB_DIAG_DIR": ""}).stdout.endswith("False\n")


def test_runner_reports_syntax_errors_and_missing_scripts_like_python(tmp_path):
    bad = tmp_path / "syn.py"
    bad.write_text("x = (\n")
    ours = _run_runner(bad)
    theirs = subprocess.run([sys.executable, str(bad)], capture_output=True, text=True, timeout=60)
    assert ours.returncode == theirs.returncode == 1
    assert ours.stderr == theirs.stderr and "Traceback" not in ours.stderr
    missing = tmp_path / "missing.py"
    ours = _run_runner(missing)
    theirs = subprocess.run([sys.executable, str(missing)], capture_output=True, text=True, timeout=60)
    assert ours.returncode == theirs.returncode == 2
    assert ours.stderr.partition(": ")[2] == theirs.stderr.partition(": ")[2]


def test_runner_without_a_script_prints_usage(tmp_path):
    done = subprocess.run([sys.executable, str(RUNNER)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.startswith("usage:")


SKIPPED_FRAME = """\
import torch
from torch._dynamo import utils

utils.counters["graph_break"]["a break before explain"] += 2

@torch.compile
def skipped_loop(xs):
    return xs

@torch.compile
def plain(x):
    return x

skipped_loop([1, 2])
plain(3)
print(dict(utils.counters["graph_break"]))
"""


def test_runner_counts_the_breaks_dynamo_logged_where_explain_made_no_graph(tmp_path, stub_torch):
    script, diag = tmp_path / "skipped.py", tmp_path / "diag"
    script.write_text(SKIPPED_FRAME)
    done = _run_runner(script, env={"LAB_DIAG_DIR": str(diag)}, pythonpath=stub_torch)
    assert done.returncode == 0, done.stderr
    # explain's own breaks are taken out of Dynamo's counters again: the script sees only its own
    assert done.stdout.splitlines()[-1] == "{'a break before explain': 2}"
    doc = json.loads((diag / "explain.json").read_text())
    skipped, plain = doc["records"]
    logged = [{"reason": "call_function BuiltinVariable(filter) [stub] {}", "count": 1}]
    assert (skipped["graph_count"], skipped["graph_break_count"], skipped["logged_breaks"]) == (0, -1, logged)
    assert plain["logged_breaks"] == logged
    report = parse_explain(diag / "explain.json")
    assert report is not None
    skipped_fn, plain_fn = report.functions
    # no graph, so explain counts no break: the one Dynamo logged counts, with its reason
    assert skipped_fn.graph_break_count == 1
    assert [b.reason for b in skipped_fn.breaks] == ["call_function BuiltinVariable(filter) [stub] {}"]
    # explain saw the break: its count and reasons stand
    assert plain_fn.graph_break_count == 1 and plain_fn.breaks[0].headline == "stub break"
    assert report.graph_break_count == 2


def test_runner_diag_dir_without_torch(tmp_path):
    script = tmp_path / "s.py"
    script.write_text(PASSTHROUGH)
    done = _run_runner(script, "exit", "4", env={"LAB_DIAG_DIR": str(tmp_path / "diag")})
    assert done.returncode == 4
    report = parse_explain(tmp_path / "diag" / "explain.json")
    assert report is not None and report.torch is None and report.functions == ()
    assert report.notes == ("the script never imported torch",)
    doc = json.loads((tmp_path / "diag" / "compile_times.json").read_text())
    assert (doc["available"], doc["note"]) == (False, "the script never imported torch")
    assert (tmp_path / "diag" / "explain.txt").read_text() == "No compiled function or module was called.\n"


HOOKED = """\
import os
import torch
import torch._dynamo

@torch.compile
def bare(x):
    return x + 1

@torch.compile(backend="inductor", mode="max-autotune")
def configured(x):
    return x * 2

@torch.compile(options={"trace.enabled": True})
def with_options(x):
    return x - 1

def plain(x):
    return -x

compiled = torch.compile(plain, backend="aot_eager", dynamic=False)
disabled = torch.compile(plain, disable=True)
assert disabled is plain
never = torch.compile(plain)
for _ in range(2):
    bare(1), configured(2), with_options(3), compiled(4)
for name, kwargs in torch.CALLS:
    print(name, kwargs["backend"], kwargs["mode"], kwargs["options"])
print("resets", len(torch._dynamo.RESETS))
if os.environ.get("FAIL"):
    raise SystemExit(int(os.environ["FAIL"]))
"""


def _hooked(tmp_path: Path, stub: Path, env: dict) -> tuple[subprocess.CompletedProcess, list[str]]:
    script = tmp_path / "hooked.py"
    script.write_text(HOOKED)
    done = _run_runner(script, env=env, pythonpath=stub)
    return done, done.stdout.splitlines()


def test_runner_hook_overrides_backend_and_mode(tmp_path, stub_torch):
    done, lines = _hooked(tmp_path, stub_torch, {"LAB_COMPILE_HOOK": "1", "LAB_BACKEND": "eager",
                                                  "LAB_MODE": "reduce-overhead"})
    assert done.returncode == 0, done.stderr
    assert lines[:4] == ["bare eager None None", "configured eager None None", "with_options eager None None",
                         "plain eager None None"]
    assert lines[-1] == "resets 0"          # no LAB_DIAG_DIR: nothing explained
    done, lines = _hooked(tmp_path, stub_torch, {"LAB_COMPILE_HOOK": "1", "LAB_MODE": "reduce-overhead"})
    assert done.returncode == 0, done.stderr
    assert lines[:4] == ["bare inductor reduce-overhead None", "configured inductor reduce-overhead None",
                         "with_options inductor reduce-overhead None", "plain aot_eager None None"]


def test_runner_without_hook_leaves_compile_alone(tmp_path, stub_torch):
    done, lines = _hooked(tmp_path, stub_torch, {"LAB_BACKEND": "eager", "LAB_MODE": "reduce-overhead"})
    assert done.returncode == 0, done.stderr
    assert lines[:4] == ["bare inductor None None", "configured inductor max-autotune None",
                         "with_options inductor None {'trace.enabled': True}", "plain aot_eager None None"]


def test_runner_diagnose_mode_with_stub(tmp_path, stub_torch):
    diag = tmp_path / "diag"
    done, lines = _hooked(tmp_path, stub_torch, {"LAB_DIAG_DIR": str(diag), "LAB_COMPILE_HOOK": "1",
                                                  "LAB_BACKEND": "eager", "FAIL": "5"})
    assert done.returncode == 5, done.stderr
    assert lines[-1] == "resets 4"          # one explain per compiled function called
    assert lines.count("bare eager None None") == 2     # explain's own run is not the compiled one
    doc = json.loads((diag / "explain.json").read_text())
    assert (doc["format"], doc["torch"]) == (EXPLAIN_FORMAT, "0.0+stub")
    assert doc["hook"] == {"enabled": True, "backend": "eager", "mode": None}
    records = {r["name"]: r for r in doc["records"]}
    assert [r["name"] for r in doc["records"]] == ["bare", "configured", "with_options", "plain", "plain"]
    assert records["configured"]["hook_changes"] == ["backend 'inductor' -> 'eager'",
                                                     "mode 'max-autotune' dropped (backend 'eager')"]
    first = doc["records"][0]
    assert (first["status"], first["graph_count"], first["graph_break_count"], first["ops_per_graph"]) == (
        "explained", 2, 1, [2, 1])
    assert first["breaks"][0]["user_stack"][0]["line"] == first["line"] + 1
    assert doc["records"][4]["status"] == "never_called"
    times = json.loads((diag / "compile_times.json").read_text())
    # explain's own compile ("explain_only") was taken back out; the metrics it reset were restored
    assert times["phases"] == [{"name": "_compile.compile_inner", "total_s": 0.75, "calls": 2},
                               {"name": "OutputGraph.call_user_compiler", "total_s": 0.125, "calls": 1}]
    text = (diag / "explain.txt").read_text()
    assert text.count("Graph Count: 2") == 4
    report = parse_explain(diag / "explain.json")
    assert report is not None and report.graph_break_count == 4


def test_runner_explain_failure_is_recorded(tmp_path, stub_torch):
    script = tmp_path / "bad.py"
    script.write_text("import torch\n\ndef f(x):\n    raise ValueError('no ' + str(x))\n\n"
                      "g = torch.compile(f)\ng(1)\n")
    done = _run_runner(script, env={"LAB_DIAG_DIR": str(tmp_path / "d")}, pythonpath=stub_torch)
    assert done.returncode == 1
    assert done.stderr.rstrip().endswith("ValueError: no 1")
    (fn,) = parse_explain(tmp_path / "d" / "explain.json").functions
    assert (fn.status, fn.error) == ("failed", "ValueError: no 1")


def test_runner_on_python_3_8(tmp_path, stub_torch):
    python = _python38()
    if python is None:
        pytest.skip("no Python 3.8 here")
    script = tmp_path / "hooked.py"
    script.write_text(HOOKED)
    done = _run_runner(script, env={"LAB_DIAG_DIR": str(tmp_path / "d"), "LAB_COMPILE_HOOK": "1",
                                    "LAB_BACKEND": "eager"}, pythonpath=stub_torch, python=python)
    assert done.returncode == 0, done.stderr
    report = parse_explain(tmp_path / "d" / "explain.json")
    assert report is not None and report.python is not None and report.python.startswith("3.8.")
    assert len(report.functions) == 5


def _python38() -> str | None:
    """A Python 3.8 that really starts (a pyenv shim may exist without one behind it)."""
    candidates = [str(p) for p in sorted(Path.home().glob(".pyenv/versions/3.8*/bin/python3.8"))]
    candidates += [p for p in (shutil.which("python3.8"),) if p]
    for python in candidates:
        try:
            probe = subprocess.run([python, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True,
                                   text=True, timeout=30)
        except OSError:
            continue
        if probe.returncode == 0 and probe.stdout.strip() == "(3, 8)":
            return python
    return None


def test_explain_of_a_function_with_no_graph_counts_zero_breaks_not_minus_one():
    report = parse_explain(Path(__file__).resolve().parents[1] / "data" / "dynamo" / "torch2.10.0-arm64" /
                           "func-grad-no-graph.explain.json")
    (fn,) = report.functions
    assert fn.graph_count == 0 and fn.graph_break_count == 0
    assert report.graph_break_count == 0
