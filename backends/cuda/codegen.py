"""CUDA C as a GPU code generator of the GPU build (backends/gpu_build.py: ``Codegen``)."""
from __future__ import annotations

from ...tensor_ir.kernel import Kernel
from ..device_code import AtFinish, Binary, GpuFunction
from ..triton.fuse import fuse_stages
from ..triton.sizes import SizeParams
from .render import CudaRenderer
from .toolchain import compile_cuda, nvrtc_version


class CudaCodegen:
    name = "cuda"
    source_member = "gpu/kernels.cu"
    suffix = ".cu"

    def __init__(self, target, sizes: SizeParams, allow_tf32: bool = False) -> None:
        self.renderer = CudaRenderer(target, allow_tf32=allow_tf32)
        self.renderer.sizes = sizes

    def supports(self, k: Kernel) -> str | None:
        return self.renderer.supports(k)

    def prepare(self, k: Kernel, constants: dict | None) -> Kernel:
        """Stages folded into their readers, as for Triton, but attention left as plain stages
        (the CUDA C templates have no fused attention) and zero-padded copies kept (their GEMM
        was not measured reading the input in place)."""
        return fuse_stages(k, None, attention=False, pads=False)

    def render(self, k: Kernel, tuned: dict | None) -> list[GpuFunction]:
        return self.renderer.kernel(k, tuned)

    def module(self, functions: list[GpuFunction]) -> str:
        return CudaRenderer.module(functions)

    def compile(self, functions: list[GpuFunction], source: str, tgt) -> dict[str, Binary]:
        return compile_cuda(functions, source, tgt)

    def compiles(self, tgt) -> AtFinish:
        return AtFinish(self, tgt)

    def version(self) -> str:
        major, minor = nvrtc_version()
        return f"nvrtc {major}.{minor}"
