"""Kernels -> GPU functions (Triton or CUDA C) -> binaries, and the artifact's launch plan.

Each tensor-IR kernel (a step of the model's plan) is rendered by one code generator (a
``Codegen``: Triton or CUDA C, chosen per kernel) into an ordered list of launches, one per
(fused) stage. A launch names its function, grid, threads, dynamic shared memory, the binary's
parameter count and where each pointer argument lives: ``{"in": k}`` / ``{"out": k}`` (the step's
k-th input / output value) or ``{"temp": offset}`` (the kernel's temporaries, placed in one
scratch region of the device arena that every kernel reuses, since kernels run in order; split-K
GEMMs keep their fp32 partial sums there too, between their two launches); ``{"size": p}`` passes
a symbolic size. The runtime launches every kind alike.

Members written: per code generator its source (``gpu/kernels.py``: Triton, runnable on its own;
``gpu/kernels.cu``: CUDA C), and per function ``gpu/<fn>.cubin`` + ``gpu/<fn>.ptx`` (NVIDIA; PTX
lets newer GPUs JIT it) or ``gpu/<fn>.hsaco`` (AMD). The manifest's ``binaries`` lists them with
arch, kind and size.
"""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
from pathlib import Path
from typing import Protocol

from ..graph_ir.sym import Sym, context, size_max, smax
from ..progress import Progress
from ..tensor_ir.attention import AttentionStage
from ..tensor_ir.cost import kernel_cost
from ..tensor_ir.kernel import Kernel, kernel_sizes
from .device_code import Binary, GpuFunction
from .triton.render import contraction_of
from .triton.sizes import SizeParams, size_json


class Codegen(Protocol):
    """One GPU code generator, as the GPU build uses it."""
    name: str
    source_member: str  # the artifact member holding its source
    suffix: str  # the source's file suffix (dumps)

    def prepare(self, k: Kernel, constants: dict | None) -> Kernel: ...
    def render(self, k: Kernel, tuned: dict | None) -> list[GpuFunction]: ...
    def module(self, functions: list[GpuFunction]) -> str: ...
    def compile(self, functions: list[GpuFunction], source: str, tgt) -> dict[str, Binary]: ...
    def compiles(self, tgt) -> Compiles: ...
    def version(self) -> str: ...


class Compiles(Protocol):
    """One build's compiles of one code generator: functions ``add``ed as they are rendered
    (compiling may start then), ``finish`` -> name -> Binary, ``close`` in any case."""

    def add(self, f: GpuFunction) -> None: ...
    def finish(self) -> dict[str, Binary]: ...
    def close(self) -> None: ...


ALIGN = 256  # device allocations and temporaries (cudaMalloc's alignment)


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def build_gpu(kernels: list[Kernel], tgt, codegen_of, sizes: SizeParams,
              dump: Path | None = None, aot: bool = True, tuned: dict[str, dict] | None = None,
              constants: dict[str, dict] | None = None, progress: Progress | None = None
              ) -> tuple[dict[str, bytes], list[dict], dict]:
    """Returns (artifact members, per-kernel info for the manifest, manifest additions).
    ``codegen_of(kernel)``: the ``Codegen`` that renders it (code generators name symbolic
    sizes through the one table ``sizes``); ``tuned``: kernel name -> {stage:
    launch parameters} from the tuning database; ``constants``: kernel name -> {input buffer:
    value} (lets attention prove a mask causal); ``progress`` hears of kernels rendered and
    functions compiled. Each function new to the build goes to its code generator's
    ``compiles`` as soon as it is rendered: Triton compiles while the rest renders."""
    progress = progress or Progress()
    compiles: dict[str, Compiles] = {}  # per code generator, started as it renders
    try:
        return _build(kernels, tgt, codegen_of, sizes, dump, aot, tuned, constants, progress,
                      compiles)
    finally:
        for c in compiles.values():
            c.close()


def _build(kernels, tgt, codegen_of, sizes, dump, aot, tuned, constants, progress, compiles):
    plans, unique, info, scratch = {}, {}, [], 0
    used: dict[str, Codegen] = {}
    rendered: dict[tuple, list] = {}  # a model's repeated blocks render once
    warp = tgt.warp_size or 32
    for n, k in enumerate(kernels):
        progress.count("render", n, len(kernels))
        codegen = used.setdefault(codegen_of(k).name, codegen_of(k))
        fused = codegen.prepare(k, (constants or {}).get(k.name))
        mine = (tuned or {}).get(k.name)
        key = (codegen.name, fused.structural_hash(), repr(mine))
        if key not in rendered:
            before = len(unique)
            rendered[key] = _variants(fused, codegen, mine, unique)
            if aot:  # each new function compiles while the rest renders
                if codegen.name not in compiles:
                    compiles[codegen.name] = codegen.compiles(tgt)
                for f in list(unique.values())[before:]:
                    compiles[codegen.name].add(f)
        variants = rendered[key]
        temps, temp_bytes = _temp_layout(fused, [fns for _, fns in variants])
        plan = {"launches": [_launch(f, fused, temps, warp) for f in variants[0][1]],
                "temp_bytes": size_json(temp_bytes)}
        if len(variants) > 1:  # the runtime picks one per set of sizes (choose_variant)
            plan["symbols"] = sorted(kernel_sizes(fused))
            plan["variants"] = [{"at": point, "launches": [_launch(f, fused, temps, warp)
                                                          for f in fns]}
                                for point, fns in variants]
        plans[k.name] = plan
        scratch = size_max(scratch, temp_bytes)
        info.append({"symbol": k.name, "note": k.note, "hash": k.structural_hash(),
                     "tuned": k.name in (tuned or {}), "codegen": codegen.name,
                     "schedule": [_describe(f) for f in variants[0][1]],
                     "cost": kernel_cost(k, (constants or {}).get(k.name)).json(),
                     **({"variants": [p for p, _ in variants]} if len(variants) > 1 else {})})
    progress.count("render", len(kernels), len(kernels))
    members, binaries, versions = {}, [], {}
    built, to_build = 0, len(unique) if aot else 0
    for codegen in used.values():
        functions = [f for f in unique.values() if f.codegen == codegen.name]
        source = codegen.module(functions)
        if dump:
            (dump / f"kernels_{codegen.name}{codegen.suffix}").write_text(source)
        members[codegen.source_member] = source.encode()
        versions[codegen.name] = codegen.version()
        if aot and functions:
            progress.count("build", built, to_build, unit="functions")
            compiled = compiles[codegen.name].finish()
            built += len(functions)
            progress.count("build", built, to_build, unit="functions")
            _attach(plans, compiled)
            binaries += _binary_members(compiled, tgt, members)
    gpu = {"api": "cuda" if tgt.vendor == "nvidia" else "hip", "arch": tgt.arch,
           **versions, "aot": bool(aot and unique), "kernels": plans,
           "sources": {c.name: c.source_member for c in used.values()},
           "scratch_bytes": size_json(scratch), "sizes": sizes.json()}
    if "triton" in used:
        gpu["source"] = used["triton"].source_member
    return members, info, {"gpu": gpu, "binaries": binaries}


def _variants(fused: Kernel, codegen: Codegen, tuned: dict | None, unique: dict) -> list:
    """(size point or None, functions) per size class of ``fused``; one when every class
    runs the same functions."""
    variants = []
    for point in variant_points(fused):
        named = fused if not variants else dataclasses.replace(
            fused, name=f"{fused.name}_v{len(variants)}")
        with _hints(point):
            fns = [_shared(f, unique) for f in codegen.render(named, tuned)]
        variants.append((point, fns))  # equal ones share their functions (_shared)
    if len({_names(fns) for _, fns in variants}) == 1:
        variants = variants[:1]
    return variants


def _binary_members(compiled: dict[str, Binary], tgt, members: dict) -> list[dict]:
    out = []
    for name, b in compiled.items():
        for kind, data in b.images.items():
            member = f"gpu/{name}.{kind}"
            members[member] = data
            out.append({"name": member, "function": name, "arch": tgt.arch, "kind": kind,
                        "bytes": len(data)})
    return out


# ---- size classes ----------------------------------------------------------------------------

VARIANT_POINTS = (1, 8, 32, 128)  # sizes each symbol of a kernel takes in its size classes
# a kernel over one symbol (a convnet's batch, which multiplies large pixel counts) gets two: the
# tiles chosen at 8 and 128 rarely differ from those at 32 enough to pay for their compiles
ONE_SYMBOL_POINTS = (1, 32)
MAX_VARIANT_SYMBOLS = 2  # more symbols: every symbol at the same point (a diagonal)


def variant_points(k: Kernel) -> list:
    """The size points a kernel's configurations are chosen at: for a symbolic kernel with a
    GEMM or attention stage (tiles, split-K and block counts fitted to the sizes), every
    combination of ``VARIANT_POINTS`` over its symbols (``{"batch": 1, "seq": 128}``, ...), or
    ``ONE_SYMBOL_POINTS`` for a kernel over one symbol;
    [None] (the compile's hints) for the others, whose one configuration suits every size."""
    syms = sorted(kernel_sizes(k))
    if not syms or not any(isinstance(st, AttentionStage) or contraction_of(st) is not None
                           for st in k.stages):
        return [None]
    if len(syms) == 1:
        return [{syms[0]: p} for p in ONE_SYMBOL_POINTS]
    if len(syms) > MAX_VARIANT_SYMBOLS:
        return [dict.fromkeys(syms, p) for p in VARIANT_POINTS]
    return [dict(zip(syms, combo)) for combo in itertools.product(VARIANT_POINTS, repeat=len(syms))]


@contextlib.contextmanager
def _hints(point: dict | None):
    """The compile's hints with each symbol of ``point`` at its size there (within its range)."""
    ctx = context()
    saved = dict(ctx.hints)
    for s, size in (point or {}).items():
        lo, hi = ctx.ranges.get(s, (1, None))
        ctx.hints[s] = max(lo, size if hi is None else min(hi, size))
    try:
        yield
    finally:
        ctx.hints.clear()
        ctx.hints.update(saved)


def _names(fns: list[GpuFunction]) -> tuple:
    """What a variant runs: its functions' code and launch shapes (names aside)."""
    return tuple((f.source.replace(f.name, "_"), f.num_warps, f.num_stages,
                  tuple(sorted(f.constexprs.items())), tuple(str(g) for g in f.grid))
                 for f in fns)


def _shared(f: GpuFunction, unique: dict) -> GpuFunction:
    """The first function with the same code (all but its name) stands for every later one:
    repeated blocks of a model compile once."""
    key = (f.codegen, f.source.replace(f.name, "_"), tuple(f.signature.items()),
           tuple(sorted(f.constexprs.items())), f.num_warps, f.num_stages)
    first = unique.setdefault(key, f)
    return f if first is f else dataclasses.replace(f, name=first.name, source=first.source)


def _temp_layout(k: Kernel, variants: list[list[GpuFunction]] = ()
                 ) -> tuple[dict[str, int], int]:
    """Offsets in the scratch region of the kernel's temporaries, then of its functions'
    workspaces (split-K partial sums), each size-class variant's from the same place (one
    variant runs per launch); the region's size."""
    offsets, at = {}, 0
    for t in k.temps:
        offsets[t.name] = at
        at += _align(smax(t.numel, 1) * t.dtype.itemsize)
    end = at
    for fns in variants or [[]]:
        mine = at
        spaces = [kv for f in fns for kv in f.workspace.items()]
        for i, (name, nbytes) in enumerate(spaces):
            offsets[name] = mine  # aligned: every offset before the last end is
            last = i == len(spaces) - 1
            mine += nbytes if last and isinstance(nbytes, Sym) else _align(nbytes)
        end = size_max(end, mine)  # (flat sums: a max over many variants would nest)
    return offsets, end


def _launch(f: GpuFunction, k: Kernel, temps: dict[str, int], warp: int) -> dict:
    ins = {b.name: i for i, b in enumerate(k.inputs)}
    outs = {b.name: i for i, b in enumerate(k.outputs)}

    def where(buf: str) -> dict:
        if buf in ins:
            return {"in": ins[buf]}
        if buf in outs:
            return {"out": outs[buf]}
        return {"temp": size_json(temps[buf])}

    return {"fn": f.name, "template": f.template, "grid": [size_json(g) for g in f.grid],
            "block": [warp * f.num_warps, 1, 1], "num_warps": f.num_warps, "shared": f.shared,
            "params": len(f.args) + len(f.sizes) + 2,
            "args": [where(a) for a in f.args] + [{"size": p} for p in f.sizes],
            "types": [f.signature[p] for p in f.signature if f.signature[p] != "constexpr"],
            "constexprs": f.constexprs, "global_scratch": 0, "global_scratch_align": 1,
            **({"pdl": True} if f.pdl else {})}


def _attach(plans: dict, compiled: dict[str, Binary]) -> None:
    """Fill in what only the compile knows: shared memory, warps (threads), the ABI, binaries
    (of the launches whose functions ``compiled`` holds: one code generator's at a time)."""
    for plan in plans.values():
        for launch in [*plan["launches"], *(x for v in plan.get("variants", ())
                                              for x in v["launches"])]:
            b = compiled.get(launch["fn"])
            if b is None:
                continue
            warp = 64 if "hsaco" in b.images else 32
            launch.update(shared=b.shared, num_warps=b.num_warps, block=[warp * b.num_warps, 1, 1],
                          params=b.params, global_scratch=b.global_scratch,
                          global_scratch_align=b.global_scratch_align,
                          binaries={kind: f"gpu/{launch['fn']}.{kind}" for kind in b.images})


def _describe(f: GpuFunction) -> dict:
    out = {"stage": f.stage, "fn": f.name, "template": f.template,
           "grid": [g if isinstance(g, int) else str(g) for g in f.grid],
           "num_warps": f.num_warps, "num_stages": f.num_stages, **f.constexprs}
    out.update({k: str(v) if isinstance(v, Sym) else v for k, v in f.meta.items()})
    return out
