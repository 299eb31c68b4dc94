"""The C backend: every kernel rendered to C (+ OpenMP), built into one shared library.

The library exports one function per kernel and, when the plan has no host ops, ``deploy_run``:
the whole launch plan in one C call (``runtime/module.py`` calls it). Constant GEMM weights are
packed into panels at compile time; attention kernels run as one templated stage where the
template takes them.
"""
from __future__ import annotations

import dataclasses
import os
import platform
import tempfile
from pathlib import Path

from ...progress import Progress
from ...targets.target import host_isa
from ...tensor_ir.attention import AttentionStage, fuse_attention
from ...tensor_ir.cost import kernel_cost
from ...tensor_ir.expr import Load, walk
from ...tensor_ir.kernel import size_bucket
from ...tensor_ir.pack import pack_weights
from ...tensor_ir.schedule import default_schedule, stage_work
from ...tensor_ir.tuning_db import with_bucket
from ..base import Backend, Built
from .attention import supported as attention_supported
from .qgemm import pack_kernel as pack_qgemm
from .render import CRenderer, kernel_symbols
from .toolchain import build_shared_library
from .tune import c_job, tune_kernels

ENTRY = "deploy_run"


class CBackend(Backend):
    name = "c"
    kind = "cpu"

    def features(self) -> dict:
        return target_features(self.target)

    def tune(self, plan, level: str, db, budget_s: float, log=print):
        tgt = self.target
        return tune_kernels(plan.kernels, level, self.features(), tuple(tgt.cc_flags), budget_s,
                            db, log=log, constants=plan.constant_inputs(),
                            vector_bits=tgt.vector_bits)

    def tuning_job(self, plan, level: str, db):
        tgt = self.target
        return c_job(plan.kernels, level, self.features(), tuple(tgt.cc_flags), db,
                     plan.constant_inputs(), tgt.vector_bits,
                     int(self.options.get("tune_cores") or 1))

    def build(self, plan, dump: Path | None, db) -> Built:
        members, kernels = _build(plan, self.target, dump, db, self.features(),
                                  self.options.get("progress") or Progress())
        plan.drop_unused_constants()
        return Built(members, kernels, {
            "library": "lib/model.so" if plan.kernels else None,
            "entry": ENTRY if plan.kernels and not plan.host_ops else None,
            "library_status": True})  # out-of-memory reports: deploy_run returns, deploy_failed


def target_features(tgt) -> dict:
    """The target's features; for ``native`` targets the ISA is read off this CPU, so records
    made here apply on any machine with the same vector features."""
    feats = tgt.features()
    if tgt.arch == "native":
        feats = dict(feats, arch=_host_isa_level(), isa=host_isa())
    return feats


def _host_isa_level() -> str:
    isa = set(host_isa())
    return "x86-64-v4" if "avx512f" in isa else "x86-64-v3" if "avx2" in isa else \
        platform.machine()


def _build(plan, tgt, dump: Path | None, db, feats: dict,
           progress: Progress) -> tuple[dict[str, bytes], list[dict]]:
    if not plan.kernels:
        return {}, []
    renderer = CRenderer(plan.symbols, tgt.vector_bits)
    sources, info = [], []
    constants = plan.kernel_constants()
    bodies: dict[str, str] = {}  # rendered body -> the kernel that has it (layers repeat)
    total = len(plan.kernels)
    for n, (k, step) in enumerate(zip(plan.kernels, plan.kernel_steps())):
        progress.count("render", n, total)
        h = k.structural_hash()
        cost = kernel_cost(k, constants.get(k.name))
        tuned = db.lookup(h, with_bucket(feats, size_bucket(k))) if db is not None else None
        k, tuned = _fuse_attention(k, tuned, constants.get(k.name))
        sched = default_schedule(k, tuned, tgt.vector_bits)
        k, sched = _pack_weights(k, sched, step, plan, tuned, tgt.vector_bits)
        packed = pack_qgemm(k, step, plan, tgt.int8_path(feats.get("isa", ())))
        if packed is not k:  # int8 weights packed for the target's path
            k, sched = packed, default_schedule(packed, None, tgt.vector_bits)
        src = renderer.kernel(k, sched)
        if kernel_symbols(k):
            step["dims"] = True  # the runtime passes the symbols' values after the buffers
        sources.append(_dedup(src, k.name, bodies))
        info.append({"symbol": k.name, "note": k.note, "hash": h, "tuned": tuned is not None,
                     "work": sum(stage_work(st) for st in k.stages),
                     "cost": cost.json(),
                     "schedule": [s.describe() for s in sched]})
    progress.count("render", total, total)
    if not plan.host_ops:
        sources.append(_entry_point(plan))
    jobs = os.cpu_count() or 1
    chunks = [renderer.module(sources[i::jobs]) for i in range(min(jobs, len(sources)))]
    if dump:
        (dump / "kernels.c").write_text(renderer.module(sources))
    progress.count("build", 0, total)  # one C compile per chunk, in parallel
    with tempfile.TemporaryDirectory(prefix="deploy-build-") as tmp:
        lib = build_shared_library(chunks, Path(tmp) / "model.so", tuple(tgt.cc_flags), jobs)
        progress.count("build", total, total)
        return {"lib/model.so": lib.read_bytes()}, info


def _dedup(src: str, name: str, bodies: dict[str, str]) -> str:
    """A kernel whose code equals an earlier one's (the same layer repeated) calls it instead
    of being compiled again."""
    head, _, body = src.partition(f"void {name}(")
    first = bodies.setdefault(body, name)
    if first == name:
        return src
    return f"{head}void {first}(void* const* args);\nvoid {name}(void* const* args) {{ {first}(args); }}\n"


def _fuse_attention(k, tuned, constants):
    """The kernel with its attention runs as one templated stage (attention.py), where the
    template takes them (fp32); tuning records index the unfused stages, so an attention kernel
    drops them."""
    fused = fuse_attention(k, constants)
    stages = [s for s in fused.stages if isinstance(s, AttentionStage)]
    if not stages or not all(attention_supported(s) for s in stages):
        return k, tuned
    return fused, None


def _entry_point(plan) -> str:
    """``void deploy_run(void** v)``: the whole plan in one C call. ``v[id]`` points at value
    ``id`` (inputs, weights, arena slices, outputs); kernels run in order, views alias."""
    lines = [("/* the whole launch plan; v[i] is value i of the manifest, v[dims_slot] the "
             "symbolic sizes' values; returns 0, or the bytes of temporaries a kernel could not "
             "allocate (the plan stops there) */"),
             f"int64_t {ENTRY}(void** v) {{"]
    for step in plan.steps:
        if step["kind"] == "kernel":
            dims = (plan.dims_slot(),) if step.get("dims") else ()
            args = ", ".join(f"v[{i}]" for i in (*step["inputs"], *step["outputs"], *dims))
            lines.append(f"  {{ void* a[] = {{{args}}}; {step['symbol']}(a); }}")
            lines.append("  if (dp_failed) return deploy_failed();")
        elif step["kind"] == "view":
            lines.append(f"  v[{step['outputs'][0]}] = v[{step['inputs'][0]}];")
    decls = [f"void {s['symbol']}(void* const* args);" for s in plan.steps if s["kind"] == "kernel"]
    return "\n".join(decls + lines + ["  return 0;", "}"]) + "\n"


def _pack_weights(k, sched, step: dict, plan, tuned, vector_bits: int):
    """Constant GEMM weights re-laid out into panels (tensor_ir/pack.py); the packed arrays join
    the plan's constants and the step's inputs."""
    const_pos = {b.name: pos for pos, b in enumerate(k.inputs)
                 if step["inputs"][pos] in plan.constants}
    packed_k, packings = pack_weights(k, sched, set(const_pos))
    for p in packings:
        src_vid = step["inputs"][const_pos[p.source]]
        key = (src_vid, p.nr)
        if key not in plan.packed:
            plan.packed[key] = plan.new_constant(p.pack(plan.constants[src_vid]), p.packed)
        step["inputs"].append(plan.packed[key])
    if not packings:
        return k, sched
    # a weight read only through its packed copy is no longer passed to the kernel
    base = {view.name: name for view, name in packed_k.aliases}
    loaded = {base.get(x.buf, x.buf) for st in packed_k.stages
              for e in (st.body, *(st.store_index or ())) for x in walk(e) if isinstance(x, Load)}
    keep = [pos for pos, b in enumerate(packed_k.inputs) if b.name in loaded]
    step["inputs"] = [step["inputs"][pos] for pos in keep]
    packed_k = dataclasses.replace(packed_k, inputs=[packed_k.inputs[pos] for pos in keep])
    return packed_k, default_schedule(packed_k, tuned, vector_bits)
