"""vmap-inside-compile's script, first calling an API that torch 2.2 lacks.

`torch.compiler.is_compiling` appeared in torch 2.3.0, so on 2.2.x this script fails with
AttributeError before it reaches torch.compile: a failure, but not the scenario's signature
("torch.func.vmap capture is disabled", 2.3.x). From 2.4.0 the compiled vmap works.
"""

import torch

print(f"torch {torch.__version__}; compiling now: {torch.compiler.is_compiling()}", flush=True)


def f(x):
    return torch.vmap(torch.sum)(x)


x = torch.randn(2, 3)
out = torch.compile(f, backend="eager", fullgraph=True)(x)
assert torch.allclose(out, x.sum(1))
print("SUCCESS: the compiled vmap works", flush=True)
