"""What GPU backends share: checks, weight layout, tuning records and the GPU build.

A GPU backend is a way of choosing a ``Codegen`` per kernel (Triton, CUDA C, or the faster of
the two by measurement); everything else (launch plan, scratch, size classes, binaries) is the
GPU build's (gpu_build.py) and the runtime runs every kind alike.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import NotImplementedYetError
from ..graph_ir.ops import Kind
from ..graph_ir.types import DType
from ..tensor_ir.kernel import size_bucket
from ..tensor_ir.tuning_db import with_bucket
from .base import Backend, Built
from .gpu_build import build_gpu
from .gpu_weights import transpose_weights
from .triton.qgemm import pack_kernel as pack_qgemm
from .triton.sizes import SizeParams


class GpuBackend(Backend):
    kind = "gpu"
    tf32 = True
    runs_here = False  # the --dtype check emulates the GPU's arithmetic
    triton = True  # renders (some) kernels to Triton: compile workers are worth starting early
    spares = None  # Triton compile workers started by ``begin``

    def begin(self, graph) -> None:
        """A model with at least PARALLEL_MIN contractions will compile at least as many
        Triton functions in worker processes: start them now, so that they import triton
        while the graph passes, lowering and rendering run (about 0.7 s of each worker's
        start off the build's critical path)."""
        if not self.triton or not self.options.get("aot", True) or self.spares is not None:
            return
        from .triton.toolchain import PARALLEL_MIN, Spares
        if sum(n.op.kind is Kind.CONTRACTION for n in graph.nodes) >= PARALLEL_MIN:
            self.spares = Spares()

    def end(self) -> None:
        if self.spares is not None:
            self.spares.close()
            self.spares = None

    @property
    def allow_tf32(self) -> bool:
        return bool(self.options.get("allow_tf32"))

    def features(self) -> dict:
        """The record key's features: the target's (arch, warp size ...; never its name) and
        the fp32 GEMM mode, which changes the code of every fp32 GEMM."""
        return dict(self.target.features(), backend=self.name,
                    fp32_gemm="tf32" if self.allow_tf32 else "ieee")

    @property
    def fp8(self) -> bool:
        """Float8 e4m3 tensor cores: NVIDIA sm_89 (Ada) and newer."""
        arch = str(getattr(self.target, "arch", "") or "")
        return self.target.vendor == "nvidia" and arch.startswith("sm_") and \
            arch[3:].isdigit() and int(arch[3:]) >= 89

    def check_graph(self, graph) -> None:
        """The float8 family, float4e2m1 and the 4- and 2-bit integers run on CPU targets only
        (yet), except float8e4m3fn (``--dtype fp8``) on NVIDIA sm_89 and newer: every node
        that still computes on them after optimization, at once. (Constant ones, such as
        DequantizeLinear of int4 weights, are folded away and do not count.)"""
        ok = {DType.float8e4m3fn} if self.fp8 else set()
        bad = [f"'{n.name}' ({n.op.name}): {v.type}" for n in graph.nodes
               for v in (*n.inputs, *n.outputs)
               if v is not None and v.type.dtype.is_narrow and v.type.dtype not in ok]
        bad += [f"input '{v.name}': {v.type}" for v in graph.inputs if v.type.dtype.is_narrow]
        if bad:
            raise NotImplementedYetError(
                f"target {self.target.name}: GPU code has no float8/float4/int4/int2 element "
                f"types yet (CPU targets have them); {len(bad)} value(s) use them:\n  - "
                + "\n  - ".join(dict.fromkeys(bad)))

    def prepare(self, plan) -> None:
        """int8 contractions get their weights packed for tensor cores (triton/qgemm.py).
        Constant GEMM operands with unaligned rows are stored transposed (gpu_weights.py); the
        copy takes the input's place in its step, and a constant no step reads any more is
        dropped."""
        made: dict[tuple[int, str], int] = {}
        int8 = False
        for n, (k, step) in enumerate(zip(plan.kernels, plan.kernel_steps())):
            packed = pack_qgemm(k, step, plan)
            if packed is not k:
                plan.kernels[n], int8 = packed, True
                continue
            consts = {b.name: pos for pos, b in enumerate(k.inputs)
                      if pos < len(step["inputs"]) and step["inputs"][pos] in plan.constants}
            new_k, moved = transpose_weights(k, set(consts))
            for name, buf in moved:
                src = step["inputs"][consts[name]]
                if (src, buf.dtype.name) not in made:
                    swapped = np.ascontiguousarray(np.swapaxes(plan.constants[src], -1, -2))
                    made[(src, buf.dtype.name)] = plan.new_constant(swapped, buf)
                step["inputs"][consts[name]] = made[(src, buf.dtype.name)]
            plan.kernels[n] = new_k
        if made or int8:
            plan.drop_unused_constants()

    def tuned_for(self, k, db) -> dict | None:
        """The tuning record's launch parameters of kernel ``k`` (stage -> parameters)."""
        if db is None:
            return None
        return db.lookup(k.structural_hash(), with_bucket(self.features(), size_bucket(k)))

    def tuned_records(self, plan, db) -> dict[str, dict]:
        return {k.name: rec for k in plan.kernels if (rec := self.tuned_for(k, db)) is not None}

    def codegen_chooser(self, plan, db, sizes: SizeParams):
        """kernel -> the Codegen rendering it."""
        raise NotImplementedError

    def build(self, plan, dump: Path | None, db) -> Built:
        if plan.host_ops:
            raise NotImplementedYetError(
                f"target {self.target.name}: host ops ({', '.join(sorted(set(plan.host_ops)))}) "
                "have data-dependent output shapes and do not run on GPU targets yet; compile "
                "for a CPU target")
        sizes = SizeParams()
        members, kernels, extra = build_gpu(
            plan.kernels, self.target, self.codegen_chooser(plan, db, sizes), sizes, dump,
            aot=self.options.get("aot", True), tuned=self.tuned_records(plan, db),
            constants=plan.kernel_constants(), progress=self.options.get("progress"))
        extra["gpu"]["codegen"] = self.name
        return Built(members, kernels, {**extra, "library": None, "entry": None})
