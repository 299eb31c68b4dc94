"""``--gpu-codegen auto``: each kernel in Triton or CUDA C, whichever was measured faster.

``deploy tune --gpu-codegen auto`` first tunes the Triton kernels, then times every kernel that
CUDA C can render both ways on the GPU (the tuned Triton configuration against the CUDA C
template, whole kernel, L2 flushed before each run) and records the winner in the tuning
database under the features with ``backend: auto``. A compile reads those records: CUDA C where
it won by more than ``MARGIN``, Triton everywhere else (and wherever nothing was measured), so
auto is never slower than Triton alone by more than the measurement's noise.
"""
from __future__ import annotations

import dataclasses
import time

from ..tensor_ir.kernel import Kernel, size_bucket, size_env, specialize
from ..tensor_ir.tuning_db import TuningRecord, with_bucket
from .gpu_backend import GpuBackend
from .triton.codegen import TritonCodegen
from .triton.sizes import SizeParams

MARGIN = 0.03  # CUDA C must be this much faster (relative) to replace a Triton kernel


class AutoGpuBackend(GpuBackend):
    name = "auto"

    def features(self) -> dict:
        """Triton's records configure the Triton kernels."""
        return dict(super().features(), backend="triton")

    def choice_features(self, k: Kernel) -> dict:
        return with_bucket(dict(super().features(), backend="auto"), size_bucket(k))

    def chosen(self, k: Kernel, db) -> dict | None:
        rec = db.lookup(k.structural_hash(), self.choice_features(k)) if db is not None else None
        return None if rec is None else rec[0]

    def codegen_chooser(self, plan, db, sizes: SizeParams):
        triton = TritonCodegen(self.target, sizes, self.allow_tf32, self.spares)
        cuda = None

        def pick(k: Kernel):
            nonlocal cuda
            choice = self.chosen(k, db)
            if choice is None or choice.get("codegen") != "cuda":
                return triton
            if cuda is None:
                from .cuda.codegen import CudaCodegen
                cuda = CudaCodegen(self.target, sizes, self.allow_tf32)
            return cuda if cuda.supports(k) is None else triton

        return pick

    def tune(self, plan, level: str, db, budget_s: float, log=print):
        from .triton.backend import TritonBackend
        start = time.time()
        report = TritonBackend(self.target, self.options).tune(plan, level, db, budget_s, log)
        left = budget_s - (time.time() - start)
        report.codegen = choose_codegens(self, plan.kernels, db, left, log)
        return report


def choose_codegens(backend: AutoGpuBackend, kernels: list[Kernel], db, budget_s: float,
                    log=print) -> dict[str, int]:
    """Time Triton against CUDA C per distinct kernel; records go into ``db``. Returns how many
    kernels each code generator won."""
    from .cuda.codegen import CudaCodegen
    tgt, sizes = backend.target, SizeParams()
    triton = TritonCodegen(tgt, sizes, backend.allow_tf32)
    cuda = CudaCodegen(tgt, sizes, backend.allow_tf32)
    pairs, seen = [], set()
    for k in kernels:
        key = (k.structural_hash(), str(backend.choice_features(k)))
        if key in seen or backend.chosen(k, db) is not None or cuda.supports(k) is not None:
            continue
        seen.add(key)
        pairs.append((k, *_both(k, len(pairs), triton, cuda, backend.tuned_for(k, db))))
    won = {"triton": 0, "cuda": 0}
    if not pairs or budget_s <= 0:
        log(f"tune: no kernel left to compare in CUDA C ({len(pairs)} pending, budget spent)"
            if pairs else "tune: every kernel has a Triton / CUDA C choice already")
        return won
    measure = backend.options.get("measure") or _device_measure(tgt)
    t_times = measure([t for _, t, _ in pairs])
    c_times = measure([c for _, _, c in pairs],
                      compile=lambda fns: cuda.compile(fns, cuda.module(fns), tgt))
    for (k, _, _), t, c in zip(pairs, t_times, c_times):
        pick = "cuda" if c < t * (1 - MARGIN) else "triton"
        won[pick] += 1
        params = {"0": {"codegen": pick, "triton_us": round(t * 1e6, 2),
                        "cuda_us": round(c * 1e6, 2)}}
        db.add(TuningRecord(k.structural_hash(), backend.choice_features(k), params, min(t, c), t))
        log(f"tune: {k.note[:50]}: Triton {t * 1e6:.1f} us, CUDA C {c * 1e6:.1f} us -> {pick}")
    return won


def _both(k: Kernel, n: int, triton, cuda, tuned):
    """The kernel (at its size bucket) as a Triton candidate and a CUDA C candidate, whole."""
    from .triton.tune import Candidate
    sized = specialize(k, size_env(k)) if size_bucket(k) else k
    out = []
    for tag, codegen, params in (("t", triton, tuned), ("c", cuda, None)):
        kern = codegen.prepare(sized, None)
        fns = [_renamed(f, f"cmp{n}{tag}_{f.name}") for f in codegen.render(kern, params)]
        out.append(Candidate(sized, kern, -1, None, fns[0], fns[1:]))
    return out


def _renamed(fn, name: str):
    return dataclasses.replace(fn, name=name, source=fn.source.replace(fn.name, name))


def _device_measure(tgt):
    from .triton.tune import DeviceMeasurer
    m = DeviceMeasurer(tgt)
    m.open()
    return m
