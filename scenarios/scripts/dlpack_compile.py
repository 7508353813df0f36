"""torch.compile(fullgraph=True, dynamic=True) fails on torch.utils.dlpack (seed 002).

Dynamo cannot trace the builtin `torch._C._to_dlpack`, so a model that round-trips
a tensor through DLPack fails to compile with fullgraph=True. The device comes
from the scenario variable DEVICE (cuda in the seed; the bug is in Dynamo, so it
reproduces on cpu as well).
"""

import os

import torch
import torch.nn as nn

DEVICE = os.environ.get("DEVICE", "cuda")
BACKEND = os.environ.get("LAB_BACKEND", "inductor")
MODE = os.environ.get("LAB_MODE") or None  # inductor only: eager and aot_eager take no mode


class MyModel(nn.Module):
    def forward(self, x):
        if x.dtype == torch.bool:
            # bool path: go through uint8 + dlpack roundtrip and back to bool
            x_uint8 = x.to(torch.uint8)
            dlpack = torch.utils.dlpack.to_dlpack(x_uint8)
            converted = torch.utils.dlpack.from_dlpack(dlpack)
            return converted.bool()
        # non-bool path: direct dlpack roundtrip
        dlpack = torch.utils.dlpack.to_dlpack(x)
        return torch.utils.dlpack.from_dlpack(dlpack)


def my_model_function():
    return MyModel()


def GetInput():
    # bool tensor, shape [2], to exercise the bool branch
    return torch.rand(2).bool()


def main():
    if DEVICE == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("CUDA is not available, but this repro expects device='cuda'.")
    device = torch.device(DEVICE)

    # ---------- 1. Eager: works ----------
    model_eager = my_model_function().to(device).eval()
    inp = GetInput().to(device)
    with torch.no_grad():
        out_eager = model_eager(inp)
    print("=== Eager Output ===")
    print("out_eager:", out_eager, out_eager.shape, out_eager.dtype, out_eager.device)

    # ---------- 2. torch.compile ----------
    from torch._inductor import config as inductor_config

    old_max_autotune = inductor_config.max_autotune
    inductor_config.max_autotune = True  # emulate 'max-autotune' mode
    try:
        compiled_model = torch.compile(model_eager, backend=BACKEND, mode=MODE, fullgraph=True, dynamic=True)
        with torch.no_grad():
            out_compiled = compiled_model(inp)  # <-- fails here
        print("\n=== compiled Output ===")
        print("out_compiled:", out_compiled, out_compiled.shape, out_compiled.dtype, out_compiled.device)
        same = torch.equal(out_eager, out_compiled)
        print("\n=== eager vs compiled elementwise equal ===", bool(same))
    finally:
        inductor_config.max_autotune = old_max_autotune


if __name__ == "__main__":
    main()
