"""Hard-codes a backend that does not exist: only the lab's runner (ablation.via: hook) can fix it."""
import torch


def f(x):
    return torch.sin(x) + 1


g = torch.compile(f, backend="not_a_backend")
print("compiled ok", float(g(torch.ones(3)).sum()))
