"""The Triton backend: every GPU kernel rendered to Triton, compiled ahead of time."""
from __future__ import annotations

from ..gpu_backend import GpuBackend
from .codegen import TritonCodegen


class TritonBackend(GpuBackend):
    name = "triton"

    def tune(self, plan, level: str, db, budget_s: float, log=print):
        from .tune import tune_gpu_kernels  # measured on this machine's GPU
        return tune_gpu_kernels(plan.kernels, self.target, level, db, budget_s, self.allow_tf32,
                                self.options.get("measure"), log=log)

    def tuning_job(self, plan, level: str, db):
        from ..distributed.gpu import launch_job  # deploy tune --ray: GPU workers measure
        return launch_job(plan.kernels, self.target, level, db, self.allow_tf32)

    def codegen_chooser(self, plan, db, sizes):
        codegen = TritonCodegen(self.target, sizes, self.allow_tf32, self.spares)
        return lambda k: codegen
