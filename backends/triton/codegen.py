"""Triton as a GPU code generator of the GPU build (backends/gpu_build.py: ``Codegen``)."""
from __future__ import annotations

from ...tensor_ir.kernel import Kernel
from ..device_code import Binary, GpuFunction
from .fuse import fuse_stages
from .render import TritonRenderer
from .sizes import SizeParams
from .toolchain import Compiles, Spares, compile_functions, triton_version


class TritonCodegen:
    name = "triton"
    source_member = "gpu/kernels.py"
    suffix = ".py"

    def __init__(self, target, sizes: SizeParams, allow_tf32: bool = False,
                 spares: Spares | None = None) -> None:
        self.renderer = TritonRenderer(target, allow_tf32=allow_tf32)
        self.renderer.sizes = sizes
        self.spares = spares  # compile workers started early (GpuBackend.begin)

    def prepare(self, k: Kernel, constants: dict | None) -> Kernel:
        return fuse_stages(k, constants)

    def render(self, k: Kernel, tuned: dict | None) -> list[GpuFunction]:
        return self.renderer.kernel(k, tuned)

    def module(self, functions: list[GpuFunction]) -> str:
        return TritonRenderer.module(functions)

    def compile(self, functions: list[GpuFunction], source: str, tgt) -> dict[str, Binary]:
        return compile_functions(functions, source, tgt)

    def compiles(self, tgt) -> Compiles:
        """Compiles that start while the build renders (toolchain.Compiles)."""
        return Compiles(tgt, spares=self.spares)

    def version(self) -> str:
        return triton_version()
