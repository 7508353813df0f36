"""torch.vmap called inside a torch.compile'd function (torch.compile FAQ).

The FAQ ("Calling torch.func transform inside of a function handled with
torch.compile") says `torch.vmap(torch.sum)(x)` inside a compiled function
"doesn't work yet" and suggests torch._dynamo.allow_in_graph as a workaround.
Compiled without fullgraph, Dynamo would silently fall back to eager at a graph
break, so this script uses fullgraph=True: a function transform that Dynamo
cannot trace becomes an exception instead of a hidden graph break.

Backend: `eager` by default. Whether vmap can be captured is decided by Dynamo
while it traces the bytecode, before any backend runs, and under QEMU inductor
would only add minutes of C++ compilation. `lab run --backend inductor` checks
that a torch which traces it also compiles it.
"""

import os

import torch

BACKEND = os.environ.get("LAB_BACKEND", "eager")
MODE = os.environ.get("LAB_MODE") or None


def compile_kwargs():
    kwargs = {"backend": BACKEND, "fullgraph": True}
    if BACKEND == "inductor" and MODE:
        kwargs["mode"] = MODE
    return kwargs


def f(x):
    return torch.vmap(torch.sum)(x)


def main():
    print(f"torch {torch.__version__} backend={BACKEND} mode={MODE}", flush=True)
    torch.manual_seed(0)
    x = torch.randn(2, 3)
    expected = x.sum(dim=1)

    # Control: the same function without torch.compile works.
    assert torch.allclose(f(x), expected), "torch.vmap(torch.sum) is wrong in eager mode"
    print("control ok: torch.vmap(torch.sum)(x) == x.sum(1) without torch.compile", flush=True)

    compiled = torch.compile(f, **compile_kwargs())
    out = compiled(x)  # <-- fails where the FAQ is right
    ok = torch.allclose(out, expected, atol=1e-5)
    print(f"compiled (fullgraph=True) returned; matches x.sum(1): {ok}", flush=True)
    if not ok:
        raise AssertionError("the compiled vmap gave a wrong result")
    print("SUCCESS: torch.vmap inside torch.compile(fullgraph=True) works on this torch", flush=True)


if __name__ == "__main__":
    main()
