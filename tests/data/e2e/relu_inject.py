"""An Inductor-only compile failure, made on purpose with Inductor's own test switch.

`torch._inductor.config.cpp.inject_relu_bug_TESTING_ONLY = "compile_error"` makes the C++ code
Inductor generates for relu fail to compile (the switch the minifier's tests use). Dynamo and
AOTAutograd are untouched, so `eager` and `aot_eager` pass and `inductor` fails: the layer is
Inductor, and compiler_bisector narrows it to the relu lowering.
"""

import os

import torch
import torch._inductor.config

torch._inductor.config.cpp.inject_relu_bug_TESTING_ONLY = "compile_error"
BACKEND = os.environ.get("LAB_BACKEND", "inductor")


def f(x):
    return torch.relu(x) + 1


x = torch.randn(16)
print(f"torch {torch.__version__} backend={BACKEND}", flush=True)
out = torch.compile(f, backend=BACKEND)(x)
assert torch.allclose(out, f(x))
print("compiled ok", flush=True)
