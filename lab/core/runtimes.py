"""The runtime families a process must load only once (two GNU OpenMP runtimes is the classic).

One table, shared by the scenario schema (the names `expect.duplicate_runtime` accepts) and the
loader-log analysis (which file belongs to which family)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

__all__ = ["RUNTIME_FAMILIES", "RuntimeFamily"]


@dataclass(frozen=True, slots=True)
class RuntimeFamily:
    """A runtime that must exist once per process; `pattern` matches a file's basename."""

    name: str
    label: str
    pattern: re.Pattern[str]


def _family(name: str, label: str, stem: str) -> RuntimeFamily:
    """`stem`, an optional auditwheel/delvewheel-style ``-<hash>``, then ``.so`` and a version."""
    return RuntimeFamily(name, label, re.compile(rf"^{stem}(?:-[0-9A-Za-z]+)?\.so(?:\.\d+)*$"))


RUNTIME_FAMILIES: Mapping[str, RuntimeFamily] = MappingProxyType({
    fam.name: fam
    for fam in (
        _family("libgomp", "GNU OpenMP", "libgomp"),
        _family("libiomp5", "Intel OpenMP", "libiomp5"),
        _family("libomp", "LLVM OpenMP", "libomp"),
        _family("libcuda", "CUDA driver", "libcuda"),
        _family("cudart", "CUDA", "libcudart"),
        _family("cublas", "cuBLAS", "libcublas"),
        _family("cublasLt", "cuBLASLt", "libcublasLt"),
        _family("cudnn", "cuDNN", "libcudnn"),
        _family("nccl", "NCCL", "libnccl"),
        _family("libstdcxx", "GNU C++", r"libstdc\+\+"),
    )
})

# The families of a CUDA stack: a run that loaded them names each file in its evidence.
CUDA_FAMILIES = ("libcuda", "cudart", "cublas", "cublasLt", "cudnn", "nccl")
