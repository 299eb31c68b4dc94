"""The CUDA C backend: every GPU kernel rendered to CUDA C and compiled with NVRTC (no GPU and
no nvcc needed), launched by the same runtime as Triton's kernels."""
from __future__ import annotations

from ...errors import NotImplementedYetError
from ..gpu_backend import GpuBackend
from .codegen import CudaCodegen


class CudaBackend(GpuBackend):
    name = "cuda"
    tf32 = True

    def check_graph(self, graph) -> None:
        super().check_graph(graph)
        if self.target.vendor != "nvidia":
            raise NotImplementedYetError(f"target {self.target.name}: CUDA C runs on NVIDIA "
                                         f"GPUs, not {self.target.vendor}")

    def codegen_chooser(self, plan, db, sizes):
        codegen = CudaCodegen(self.target, sizes, self.allow_tf32)
        bad = [f"{k.name} ({k.note}): {why}" for k in plan.kernels
               if (why := codegen.supports(k)) is not None]
        if bad:
            raise NotImplementedYetError(
                f"--gpu-codegen cuda: {len(bad)} kernel(s) have no CUDA C template yet (use "
                "--gpu-codegen auto or triton):\n  - " + "\n  - ".join(bad))
        return lambda k: codegen

    def tune(self, plan, level: str, db, budget_s: float, log=print):
        raise NotImplementedYetError("the CUDA C kernels have no tuning space yet; "
                                     "`deploy tune --gpu-codegen auto` measures them against "
                                     "Triton's and keeps the faster per kernel")
