"""What every GPU code generator hands the GPU build: functions to compile, and binaries.

A ``GpuFunction`` is one generated kernel entry point (Triton or CUDA C) with what the launch plan
needs: its buffer arguments, size parameters, grid, threads and workspace. A ``Binary`` is one
compiled function: its images by kind and the metadata a launcher needs. The runtime never sees
these classes, only the launch plan built from them (backends/gpu_build.py).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field


@dataclass
class GpuFunction:
    """One generated function and how to launch it."""
    name: str
    source: str
    args: list[str]  # kernel buffer (storage) names, in parameter order
    signature: dict[str, str]  # parameter -> type ("*fp32", "i64", or "constexpr")
    constexprs: dict[str, int]
    grid: tuple  # ints, or sizes over the size parameters
    num_warps: int
    num_stages: int
    template: str
    stage: int
    meta: dict = field(default_factory=dict)
    workspace: dict[str, int] = field(default_factory=dict)  # scratch buffer -> bytes (split-K)
    sizes: list[str] = field(default_factory=list)  # size parameters, after the buffers
    codegen: str = "triton"  # which generator made it: "triton" or "cuda"
    shared: int = 0  # dynamic shared memory bytes the launch needs (CUDA C; Triton's is measured)
    pdl: bool = False  # waits for the grid before it first (griddepcontrol.wait): may launch early


@dataclass
class Binary:
    """One compiled function: its binaries by kind and its launch metadata."""
    images: dict[str, bytes]  # "cubin", "ptx", "hsaco"
    shared: int
    num_warps: int
    params: int  # kernel parameters in the binary (the function's own + trailing scratch)
    global_scratch: int = 0  # bytes per program (0: the pointer is NULL)
    global_scratch_align: int = 1
    profile_scratch: int = 0
    meta: dict = dataclasses.field(default_factory=dict)


class AtFinish:
    """A code generator's compiles, all at once when the build has rendered every function
    (what a ``Codegen.compiles`` returns where compiling cannot start earlier)."""

    def __init__(self, codegen, tgt) -> None:
        self.codegen, self.tgt = codegen, tgt
        self.functions: list[GpuFunction] = []

    def add(self, f: GpuFunction) -> None:
        self.functions.append(f)

    def finish(self) -> dict[str, Binary]:
        fns = self.functions
        return self.codegen.compile(fns, self.codegen.module(fns), self.tgt) if fns else {}

    def close(self) -> None:
        pass
