"""torch.compile on AArch64 starts two GNU OpenMP runtimes (seed 000, pytorch#166087).

Inductor's compiled kernel links the system libgomp.so.1, while libtorch_cpu.so
uses the libgomp-<hash>.so bundled in the wheel: both get initialised in one
process. The lab sees it in the dynamic loader's log (LD_DEBUG=libs,files).

N is the scenario variable `N`: the original report used 8192; the scenario
defaults to a size that keeps an emulated run within a few minutes.
"""

import os

import torch

N = int(os.environ.get("N", "8192"))
BACKEND = os.environ.get("LAB_BACKEND", "inductor")
MODE = os.environ.get("LAB_MODE") or None  # inductor only: eager and aot_eager take no mode


def fused_elemwise_reduce(x):
    for _ in range(5):
        x = (x.sin() * 1.1 + x.cos() * 0.9 + x * x - 0.3).relu_()
    return x.sum(dim=1)


compiled = torch.compile(fused_elemwise_reduce, backend=BACKEND, mode=MODE, fullgraph=True)
x = torch.randn((N, N), dtype=torch.float32)
y = compiled(x)
for _ in range(5):
    y = compiled(x)
print(f"N={N} backend={BACKEND} checksum={float(y.sum()):.4f}")
