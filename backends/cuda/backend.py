"""The CUDA C backend: every GPU kernel rendered to CUDA C and compiled with NVRTC (no GPU,
no nvcc, no triton needed to compile)."""
from __future__ import annotations

from ...errors import NotImplementedYetError
from ..gpu_backend import GpuBackend
from .codegen import CudaCodegen


class CudaBackend(GpuBackend):
    name = "cuda"
    triton = False

    def codegen_chooser(self, plan, db, sizes):
        codegen = CudaCodegen(self.target, sizes, self.allow_tf32)

        def pick(k):
            reason = codegen.supports(codegen.prepare(k, None))
            if reason is not None:
                raise NotImplementedYetError(f"--gpu-codegen cuda: kernel {k.name} "
                                             f"({k.note[:60]}): {reason}")
            return codegen

        return pick
