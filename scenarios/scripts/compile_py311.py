"""torch.compile on Python 3.11: refused by torch 2.0.x, supported from torch 2.1.0."""

import sys

import torch

print("torch", torch.__version__, "python", sys.version.split()[0], flush=True)


def f(x):
    return torch.sin(x) + 1


compiled = torch.compile(f, backend="eager")
print("compiled:", compiled(torch.ones(3)).tolist())
