"""CUDA C as a GPU code generator of the GPU build (backends/gpu_build.py: ``Codegen``)."""
from __future__ import annotations

from ...tensor_ir.kernel import Kernel
from ..device_code import Binary, GpuFunction
from ..triton.fuse import _merge
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
        (the CUDA C templates have no fused attention)."""
        return fuse_stages_plain(k)

    def render(self, k: Kernel, tuned: dict | None) -> list[GpuFunction]:
        return self.renderer.kernel(k, tuned)

    def module(self, functions: list[GpuFunction]) -> str:
        return CudaRenderer.module(functions)

    def compile(self, functions: list[GpuFunction], source: str, tgt) -> dict[str, Binary]:
        return compile_cuda(functions, source, tgt)

    def version(self) -> str:
        major, minor = nvrtc_version()
        return f"nvrtc {major}.{minor}"


def fuse_stages_plain(kernel: Kernel) -> Kernel:
    """``triton.fuse.fuse_stages`` without its last step (fused attention)."""
    stages = list(kernel.stages)
    k = 0
    while k + 1 < len(stages):
        merged = _merge(kernel, stages, k)
        if merged is None:
            k += 1
            continue
        stages[k:k + 2] = [merged]
        k = max(k - 1, 0)
    used = {s.out for s in stages} | {x.buf for s in stages for x in _loads(s)}
    temps = [t for t in kernel.temps if t.name in used]
    return Kernel(kernel.name, kernel.inputs, kernel.outputs, temps, stages, kernel.note,
                  kernel.aliases)


def _loads(stage):
    from ...tensor_ir.expr import Load, walk
    return [x for e in (stage.body, *(stage.store_index or ())) for x in walk(e)
            if isinstance(x, Load)]
