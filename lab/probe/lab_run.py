"""Run a scenario's script inside the container as `python SCRIPT ARGS` would, optionally hooking torch.compile.

Usage: ``python /lab/tools/lab_run.py SCRIPT [ARGS...]``.  The script runs as the ``__main__``
module, as ``runpy.run_path(SCRIPT, run_name="__main__")`` would run it but with ``__main__`` left
to the script afterwards, with ``sys.argv = [SCRIPT, *ARGS]`` and ``sys.path[0]`` set to the
script's folder; its exceptions propagate (Python prints the traceback and exits 1) and its
``SystemExit`` codes pass through.  With neither variable below set, nothing
else happens: torch is not even imported by the runner.

``LAB_COMPILE_HOOK=1``
    Every ``torch.compile`` call (``torch.compile(f, ...)``, bare ``@torch.compile``,
    ``@torch.compile(...)``, ``nn.Module.compile()``) gets ``backend=$LAB_BACKEND`` when that is
    set, and ``mode=$LAB_MODE`` when that is set and the backend is Inductor.  A mode or options
    that the script passed are dropped when the backend is switched away from Inductor, since the
    other backends reject them; options are dropped when ``$LAB_MODE`` is applied (torch refuses
    both at once).

``LAB_DIAG_DIR=<dir>``
    Diagnose mode.  On the first call of each compiled function or module the runner runs
    ``torch._dynamo.explain(original)(*args, **kwargs)``, records what it says, and then calls the
    compiled object as usual (explain resets Dynamo).  The runner puts back the CPU/CUDA random
    state and Dynamo's compile-time metrics afterwards, so that explain's own run leaves no trace
    there; other side effects of running the function one extra time (in-place updates, printing)
    remain.  When the script ends (normally, by an exception or by ``sys.exit``) and again at exit,
    it writes ``explain.json``, ``explain.txt`` and ``compile_times.json`` into the folder.

torch is patched right after ``import torch`` finishes (through a meta-path hook), so that a
script that sets environment variables before importing torch sees them honoured.  This file
uses the standard library only and runs on Python 3.8 and later, with torch 2.1 and later.
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import functools
import importlib.machinery
import io
import json
import os
import platform
import runpy
import sys
import time
import traceback
import types
import weakref
import zipfile

EXPLAIN_FORMAT = "torch-repro-lab/explain/1"
COMPILE_TIMES_FORMAT = "torch-repro-lab/compile-times/1"
MESSAGE_LIMIT = 4000            # characters kept of an exception message or a break reason
USAGE = "usage: python lab_run.py SCRIPT [ARGS...]\n"

_is_compiling = None            # set when torch is patched; Dynamo folds it to True while tracing
_RUNNER_MODULES = []            # this file's module, once the script has taken over __main__


class _State:
    """What the runner knows: its settings and, in diagnose mode, the records so far."""

    def __init__(self, environ):
        self.hook = environ.get("LAB_COMPILE_HOOK") == "1"
        self.backend = environ.get("LAB_BACKEND") or None
        self.mode = environ.get("LAB_MODE") or None
        self.diag_dir = environ.get("LAB_DIAG_DIR") or None
        self.trace_dir = environ.get("TORCH_TRACE") or None
        self.records = []           # one dict per torch.compile call, in call order
        self.texts = []             # str(ExplainOutput), with a heading, for explain.txt
        self.unsupported = []       # features this torch lacks
        self.notes = []             # anything else worth knowing
        self.in_explain = False
        self.torch = None

    @property
    def active(self):
        return self.hook or self.diag_dir is not None

    def note_unsupported(self, text):
        if text not in self.unsupported:
            self.unsupported.append(text)

    def note(self, text):
        if text not in self.notes:
            self.notes.append(text)


# --- patching torch -----------------------------------------------------------------------------


class _TorchImportHook:
    """A meta-path finder that lets `import torch` run, then patches the module it made."""

    def __init__(self, on_import):
        self.on_import = on_import
        self.busy = False

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "torch" or self.busy:
            return None
        import importlib.util

        self.busy = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self.busy = False
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        loader = getattr(spec, "loader", None)
        exec_module = getattr(loader, "exec_module", None)
        if exec_module is None:
            return spec
        on_import = self.on_import

        def exec_then_patch(module):
            exec_module(module)
            on_import(module)

        with contextlib.suppress(AttributeError, TypeError):
            loader.exec_module = exec_then_patch
        return spec


def _install(state):
    if "torch" in sys.modules:
        _patch_torch_safely(state, sys.modules["torch"])
    else:
        sys.meta_path.insert(0, _TorchImportHook(functools.partial(_patch_torch_safely, state)))


def _patch_torch_safely(state, torch):
    try:
        _patch_torch(state, torch)
    except Exception as exc:          # the script must still run, unpatched
        state.note(f"could not patch torch.compile: {_error(exc)['type']}: {_error(exc)['message']}")


def _patch_torch(state, torch):
    global _is_compiling
    state.torch = torch
    original = getattr(torch, "compile", None)
    if original is None:
        state.note_unsupported("torch.compile: missing in this torch; nothing was hooked")
        return
    compiler = getattr(torch, "compiler", None)
    _is_compiling = getattr(compiler, "is_compiling", None) or _dynamo_is_compiling

    @functools.wraps(original)
    def compile(*args, **kwargs):
        return _compile(state, original, args, kwargs)

    torch.compile = compile


def _dynamo_is_compiling():
    import torch._dynamo

    return torch._dynamo.is_compiling()


def _compile(state, original, args, kwargs):
    args = list(args)
    kwargs = dict(kwargs)
    model = args.pop(0) if args else kwargs.pop("model", None)
    changes = _override(state, kwargs) if state.hook else []
    if model is None:
        def decorator(fn):
            if fn is None:
                raise RuntimeError("Model can't be None")
            return _compile_model(state, original, fn, args, kwargs, changes)
        return decorator
    return _compile_model(state, original, model, args, kwargs, changes)


def _compile_model(state, original, model, args, kwargs, changes):
    compiled = original(model, *args, **kwargs)
    if state.diag_dir is None or kwargs.get("disable") or compiled is model:
        return compiled
    try:
        return _watch(state, model, compiled, kwargs, changes)
    except Exception as exc:           # never let the diagnosis break the script
        state.note(f"could not watch a torch.compile call: {_error(exc)['message']}")
        return compiled


def _override(state, kwargs):
    """Apply $LAB_BACKEND and $LAB_MODE to one call's keyword arguments; say what changed."""
    changes = []
    if state.backend is not None and kwargs.get("backend") != state.backend:
        changes.append(f"backend {_short(kwargs.get('backend', 'default'))} -> {state.backend!r}")
        kwargs["backend"] = state.backend
    inductor = kwargs.get("backend") in (None, "inductor")
    if not inductor:
        for name in ("mode", "options"):
            if kwargs.get(name) is not None and state.backend is not None:
                changes.append(f"{name} {_short(kwargs.pop(name))} dropped (backend {kwargs['backend']!r})")
    elif state.mode is not None:
        if kwargs.get("mode") != state.mode:
            changes.append(f"mode {_short(kwargs.get('mode'))} -> {state.mode!r}")
            kwargs["mode"] = state.mode
        if kwargs.get("options") is not None:
            changes.append(f"options {_short(kwargs.pop('options'))} dropped (mode {state.mode!r})")
    return changes


# --- diagnose mode ------------------------------------------------------------------------------


def _watch(state, model, compiled, kwargs, changes):
    record = _new_record(state, model, kwargs, changes)
    module_class = _optimized_module_class()
    if module_class is not None and isinstance(compiled, module_class):
        return _watch_module(state, record, model, compiled)
    if not callable(compiled):
        return compiled
    return _watch_function(state, record, model, compiled)


def _watch_function(state, record, model, compiled):
    """A wrapper that explains `model` on the first call, then always calls the compiled function."""
    done = []

    @functools.wraps(compiled)
    def first_call_explained(*args, **kwargs):
        if not done and not _is_compiling() and not state.in_explain:
            done.append(True)
            _explain(state, record, model, args, kwargs)
        return compiled(*args, **kwargs)

    _skip_frame(first_call_explained)
    return first_call_explained


def _watch_module(state, record, model, compiled):
    """Swap the OptimizedModule's own `forward` until its first call, then put torch's back.

    The module keeps its class and attributes; only the instance attribute `forward`, which
    torch set to Dynamo's wrapper, is replaced for the first call.
    """
    forward = compiled.__dict__.get("forward")
    if forward is None:
        state.note(f"{record['name']}: the compiled module has no forward of its own; not explained")
        return compiled
    module_ref = weakref.ref(compiled)

    @functools.wraps(forward)
    def first_forward(*args, **kwargs):
        if not _is_compiling() and not state.in_explain:
            module = module_ref()
            if module is not None and module.__dict__.get("forward") is first_forward:
                module.__dict__["forward"] = forward
            _explain(state, record, model, args, kwargs)
        return forward(*args, **kwargs)

    _skip_frame(first_forward)
    compiled.__dict__["forward"] = first_forward
    return compiled


def _skip_frame(function):
    """Tell Dynamo's frame hook to leave this wrapper's own frame alone (not the frames it calls).

    Without it, a wrapper called while a compiled frame's callback is active (from code that runs
    between graphs) would itself be compiled, which plain `python SCRIPT` never does.
    """
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    skip_code = getattr(eval_frame, "skip_code", None)
    if skip_code is None:
        try:
            from torch._C._dynamo.eval_frame import skip_code
        except Exception:
            return
    with contextlib.suppress(Exception):
        skip_code(function.__code__)


def _optimized_module_class():
    try:
        from torch._dynamo.eval_frame import OptimizedModule
    except Exception:
        return None
    return OptimizedModule


def _new_record(state, model, kwargs, changes):
    kind, name, code = _describe(model)
    record = {
        "index": len(state.records),
        "name": name,
        "kind": kind,
        "file": getattr(code, "co_filename", None),
        "line": getattr(code, "co_firstlineno", None),
        "compile_kwargs": {key: _short(value) for key, value in sorted(kwargs.items())},
        "hook_changes": changes,
        "status": "never_called",
        "graph_count": None,
        "graph_break_count": None,
        "op_count": None,
        "ops_per_graph": None,
        "breaks": [],
        "logged_breaks": None,
        "error": None,
        "explain_seconds": None,
    }
    state.records.append(record)
    return record


def _describe(model):
    """(kind, name, code object of the user code) for what torch.compile was given."""
    torch = sys.modules.get("torch")
    module_type = getattr(getattr(torch, "nn", None), "Module", None)
    if module_type is not None and isinstance(model, module_type):
        cls = type(model)
        return "module", cls.__qualname__, _code_of(getattr(cls, "forward", None))
    owner = getattr(model, "__self__", None)
    if module_type is not None and isinstance(owner, module_type):
        cls = type(owner)
        method = getattr(model, "__name__", "?")
        if method in ("_call_impl", "__call__", "_wrapped_call_impl"):
            return "module.compile", cls.__qualname__, _code_of(getattr(cls, "forward", None))
        return "method", f"{cls.__qualname__}.{method}", _code_of(model)
    name = getattr(model, "__qualname__", None) or getattr(model, "__name__", None)
    return "function", name or type(model).__qualname__, _code_of(model)


def _code_of(obj):
    for _ in range(20):                     # follow __wrapped__ / __func__ a little way
        code = getattr(obj, "__code__", None)
        if code is not None:
            return code
        nxt = getattr(obj, "__wrapped__", None) or getattr(obj, "__func__", None)
        if nxt is None:
            nxt = getattr(obj, "func", None)    # functools.partial
        if nxt is None or nxt is obj:
            return None
        obj = nxt
    return None


def _explain(state, record, target, args, kwargs):
    torch = state.torch
    try:
        import torch._dynamo as dynamo  # torch.compile has imported it already
    except Exception:
        dynamo = None
    explain = getattr(dynamo, "explain", None)
    if explain is None:
        state.note_unsupported("torch._dynamo.explain: missing in this torch")
        record["status"] = "unsupported"
        return
    metrics = _compile_metrics()
    saved_metrics = {key: list(value) for key, value in metrics.items()} if metrics is not None else None
    saved_rng = _save_rng(torch)
    counters = _dynamo_counters()
    saved_breaks = dict(counters.pop("graph_break", None) or {}) if counters is not None else {}
    state.in_explain = True
    started = time.perf_counter()
    try:
        output = explain(target)(*args, **kwargs)
        record.update(_from_explain_output(output))
        record["status"] = "explained"
        state.texts.append(_text_section(record, output))
    except Exception as exc:
        record["status"] = "failed"
        record["error"] = _error(exc)
        state.texts.append(_text_section(record, None))
        _reset_dynamo(dynamo)
    finally:
        state.in_explain = False
        record["explain_seconds"] = round(time.perf_counter() - started, 6)
        if counters is not None:
            record["logged_breaks"] = _logged_breaks(counters.pop("graph_break", None))
            if saved_breaks:
                counters["graph_break"].update(saved_breaks)
        _restore_rng(torch, saved_rng)
        if metrics is not None and saved_metrics is not None:
            metrics.clear()
            metrics.update(saved_metrics)


def _from_explain_output(output):
    ops = getattr(output, "ops_per_graph", None)
    return {
        "graph_count": _int(getattr(output, "graph_count", None)),
        "graph_break_count": _int(getattr(output, "graph_break_count", None)),
        "op_count": _int(getattr(output, "op_count", None)),
        "ops_per_graph": [len(graph_ops) for graph_ops in ops] if isinstance(ops, list) else None,
        "breaks": [_break(reason) for reason in getattr(output, "break_reasons", None) or []],
    }


def _break(reason):
    stack = getattr(reason, "user_stack", None) or []
    return {
        "reason": _clip(str(getattr(reason, "reason", reason))),
        "graph_break": bool(getattr(reason, "graph_break", True)),
        "user_stack": [_frame(frame) for frame in stack],
    }


def _frame(frame):
    try:
        source = frame.line
    except Exception:
        source = None
    return {
        "file": getattr(frame, "filename", None),
        "line": _int(getattr(frame, "lineno", None)),
        "name": getattr(frame, "name", None),
        "source": source.strip() if isinstance(source, str) and source.strip() else None,
    }


def _text_section(record, output):
    where = f"{record['file']}:{record['line']}" if record["file"] else "unknown location"
    head = f"=== [{record['index']}] {record['kind']} {record['name']} ({where}) ==="
    if output is None:
        error = record["error"] or {}
        return f"{head}\nexplain failed: {error.get('type')}: {error.get('message')}\n"
    try:
        body = str(output)
    except Exception as exc:
        body = f"(str(ExplainOutput) failed: {_error(exc)['message']})"
    return f"{head}\n{body.rstrip()}\n"


def _compile_metrics():
    utils = sys.modules.get("torch._dynamo.utils")
    metrics = getattr(utils, "compilation_time_metrics", None)
    return metrics if isinstance(metrics, dict) else None


def _dynamo_counters():
    """torch._dynamo.utils.counters (a defaultdict of Counters). Its "graph_break" entry counts
    every graph break Dynamo logged, including those explain cannot count: explain counts graphs
    minus one, so a break in a frame that made no graph (one skipped for a break in a loop, one
    with no op before the break) is not in its count."""
    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None)
    return counters if isinstance(counters, dict) and hasattr(counters, "default_factory") else None


def _logged_breaks(counted):
    """The graph breaks Dynamo logged during explain's run: [{reason, count}]."""
    try:
        return [{"reason": _clip(str(reason)), "count": int(count)} for reason, count in dict(counted or {}).items()]
    except Exception:
        return []


def _reset_dynamo(dynamo):
    with contextlib.suppress(Exception):
        dynamo.reset()


def _save_rng(torch):
    saved = {}
    try:
        saved["cpu"] = torch.random.get_rng_state()
        cuda = torch.cuda
        if cuda.is_available() and cuda.is_initialized():
            saved["cuda"] = cuda.get_rng_state_all()
    except Exception:
        pass
    return saved


def _restore_rng(torch, saved):
    try:
        if "cpu" in saved:
            torch.random.set_rng_state(saved["cpu"])
        if "cuda" in saved:
            torch.cuda.set_rng_state_all(saved["cuda"])
    except Exception:
        pass


# --- writing the results ------------------------------------------------------------------------


def _write_results(state):
    """Write explain.json, explain.txt and compile_times.json; never raise."""
    if state.diag_dir is None:
        return
    try:
        os.makedirs(state.diag_dir, exist_ok=True)
        _atomic_write(os.path.join(state.diag_dir, "explain.json"), _json(_explain_document(state)))
        _atomic_write(os.path.join(state.diag_dir, "explain.txt"), _explain_text(state))
        _atomic_write(os.path.join(state.diag_dir, "compile_times.json"), _json(_compile_times_document()))
    except Exception as exc:
        with contextlib.suppress(Exception):
            sys.stderr.write(f"lab_run: could not write the diagnostics to {state.diag_dir}: {exc!r}\n")


def _explain_document(state):
    _check_features(state)
    torch = sys.modules.get("torch")
    return {
        "format": EXPLAIN_FORMAT,
        "torch": getattr(torch, "__version__", None) if torch is not None else None,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "argv": list(sys.argv),
        "hook": {"enabled": state.hook, "backend": state.backend, "mode": state.mode},
        "records": state.records,
        "unsupported": state.unsupported,
        "notes": state.notes,
    }


def _check_features(state):
    torch = sys.modules.get("torch")
    if torch is None:
        state.note("the script never imported torch")
        return
    internal = sys.modules.get("torch._logging._internal")
    if state.trace_dir and internal is not None and not hasattr(internal, "trace_structured"):
        state.note_unsupported("TORCH_TRACE: structured trace logging is missing in this torch")


def _explain_text(state):
    if not state.texts:
        return "No compiled function or module was called.\n"
    return "\n".join(state.texts)


def _compile_times_document():
    torch = sys.modules.get("torch")
    doc = {
        "format": COMPILE_TIMES_FORMAT,
        "torch": getattr(torch, "__version__", None) if torch is not None else None,
        "source": "torch._dynamo.utils.compile_times(repr='csv', aggregate=True)",
        "available": False,
        "phases": [],
        "note": None,
    }
    utils = sys.modules.get("torch._dynamo.utils")
    compile_times = getattr(utils, "compile_times", None)
    if compile_times is None:
        doc["note"] = ("the script never imported torch" if torch is None else
                       "Dynamo was never loaded: nothing was compiled" if utils is None else
                       "torch._dynamo.utils.compile_times: missing in this torch")
        return doc
    try:
        headers, values = compile_times(repr="csv", aggregate=True)
    except Exception as exc:
        doc["note"] = f"compile_times failed: {_error(exc)['type']}: {_error(exc)['message']}"
        return doc
    metrics = _compile_metrics() or {}
    doc["available"] = True
    doc["phases"] = [
        {"name": str(name), "total_s": _float(value),
         "calls": len(metrics[name]) if isinstance(metrics.get(name), list) else None}
        for name, value in zip(headers, values)  # noqa: B905 (Python 3.8)
    ]
    return doc


def _json(doc):
    return json.dumps(doc, indent=2, default=repr) + "\n"


def _atomic_write(path, text):
    """Write a sibling temporary file, then rename it over `path`: readers never see half a file."""
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8", errors="backslashreplace") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# --- small helpers ------------------------------------------------------------------------------


def _short(value, limit=200):
    try:
        text = repr(value)
    except Exception:
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _clip(text):
    return text if len(text) <= MESSAGE_LIMIT else text[: MESSAGE_LIMIT - 3] + "..."


def _int(value):
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float(value):
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _error(exc):
    cls = type(exc)
    name = cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    try:
        message = str(exc)
    except Exception:
        message = "<unprintable>"
    return {"type": name, "message": _clip(message)}


# --- entry point --------------------------------------------------------------------------------


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        sys.stderr.write(USAGE)
        raise SystemExit(2)
    script = argv[0]
    state = _State(os.environ)
    sys.argv = [script, *argv[1:]]
    _set_script_folder(script)
    if state.active:
        _install(state)
    if state.diag_dir is not None:
        atexit.register(_write_results, state)
    try:
        _run_main(script)
    finally:
        _write_results(state)


def _run_main(script):
    """Execute SCRIPT as the __main__ module, the way `python SCRIPT` does."""
    if os.path.isdir(script) or (os.path.isfile(script) and zipfile.is_zipfile(script)):
        runpy.run_path(script, run_name="__main__")      # a folder or zip with __main__.py
        return
    # Python >= 3.9 gives the main script an absolute __file__ (and code filename); so do we.
    path = os.path.abspath(script) if sys.version_info >= (3, 9) else script
    try:
        with io.open_code(path) as fh:
            source = fh.read()
    except OSError as exc:
        sys.stderr.write(f"{sys.executable}: can't open file {path!r}: [Errno {exc.errno}] {exc.strerror}\n")
        raise SystemExit(2) from None
    try:
        code = compile(source, path, "exec", dont_inherit=True)
    except SyntaxError as exc:      # Python reports these without a traceback header
        traceback.print_exception(type(exc), exc, None)
        raise SystemExit(1) from None
    module = types.ModuleType("__main__")
    module.__dict__.update(__file__=path, __cached__=None, __package__=None, __spec__=None,
                           __loader__=importlib.machinery.SourceFileLoader("__main__", path),
                           __builtins__=builtins)
    _RUNNER_MODULES.append(sys.modules.get("__main__"))   # keep this runner's own globals alive
    sys.modules["__main__"] = module
    exec(code, module.__dict__)


def _set_script_folder(script):
    """sys.path[0] becomes the script's folder, as `python SCRIPT` has it (nothing under -P)."""
    if getattr(sys.flags, "safe_path", False):
        return
    folder = os.path.dirname(os.path.realpath(script))
    if sys.path:
        sys.path[0] = folder
    else:
        sys.path.insert(0, folder)


if __name__ == "__main__":
    main()
