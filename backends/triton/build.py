"""Kernels -> Triton functions -> binaries, and the GPU launch plan of the artifact.

Each tensor-IR kernel (a step of the model's plan) becomes an ordered list of launches, one per
(fused) stage. A launch names its function, grid, warps, dynamic shared memory, the binary's
parameter count and where each pointer argument lives: ``{"in": k}`` / ``{"out": k}`` (the
step's k-th input / output value) or ``{"temp": offset}`` (the kernel's temporaries, placed in
one scratch region of the device arena that every kernel reuses, since kernels run in order;
split-K GEMMs keep their fp32 partial sums there too, between their two launches).

Members written: ``gpu/kernels.py`` (the generated source; runnable on its own), and per function
``gpu/<fn>.cubin`` + ``gpu/<fn>.ptx`` (NVIDIA; PTX lets newer GPUs JIT it) or ``gpu/<fn>.hsaco``
(AMD). The manifest's ``binaries`` lists them with arch, kind and size.
"""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
from pathlib import Path

from ...errors import NotImplementedYetError
from ...graph_ir.sym import Sym, context, size_max, smax
from ...tensor_ir.expr import Load, R, Reduce, transform, walk
from ...tensor_ir.kernel import Buffer, Kernel, kernel_sizes
from .attention import AttentionStage
from .fuse import fuse_stages
from .render import TritonFunction, TritonRenderer, contraction_of
from .sizes import size_json
from .toolchain import Binary, compile_functions, triton_version

ALIGN = 256  # device allocations and temporaries (cudaMalloc's alignment)


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def build_gpu(kernels: list[Kernel], tgt, dump: Path | None = None, aot: bool = True,
              allow_tf32: bool = False, host_ops=(),
              tuned: dict[str, dict] | None = None, constants: dict[str, dict] | None = None
              ) -> tuple[dict[str, bytes], list[dict], dict]:
    """Returns (artifact members, per-kernel info for the manifest, manifest additions).
    ``tuned``: kernel name -> {stage: launch parameters} from the tuning database;
    ``constants``: kernel name -> {input buffer: value} (lets attention prove a mask causal)."""
    if host_ops:
        raise NotImplementedYetError(
            f"target {tgt.name}: host ops ({', '.join(sorted(set(host_ops)))}) have data-dependent "
            "output shapes and do not run on GPU targets yet; compile for a CPU target")
    renderer = TritonRenderer(tgt, allow_tf32=allow_tf32)
    plans, unique, info, scratch = {}, {}, [], 0
    warp = tgt.warp_size or 32
    for k in kernels:
        fused = fuse_stages(k, (constants or {}).get(k.name))
        variants = []  # (size point or None, functions): configurations for size classes
        for point in variant_points(fused):
            named = fused if not variants else dataclasses.replace(
                fused, name=f"{fused.name}_v{len(variants)}")
            with _hints(point):
                fns = [_shared(f, unique) for f in renderer.kernel(named,
                                                                   (tuned or {}).get(k.name))]
            variants.append((point, fns))  # equal ones share their functions (_shared)
        if len({_names(fns) for _, fns in variants}) == 1:
            variants = variants[:1]
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
                     "tuned": k.name in (tuned or {}),
                     "schedule": [_describe(f) for f in variants[0][1]],
                     **({"variants": [p for p, _ in variants]} if len(variants) > 1 else {})})
    functions = list(unique.values())
    source = TritonRenderer.module(functions)
    if dump:
        (dump / "kernels_triton.py").write_text(source)
    members = {"gpu/kernels.py": source.encode()}
    binaries: list[dict] = []
    if aot and functions:
        compiled = compile_functions(functions, source, tgt)
        _attach(plans, compiled)
        for name, b in compiled.items():
            for kind, data in b.images.items():
                member = f"gpu/{name}.{kind}"
                members[member] = data
                binaries.append({"name": member, "function": name, "arch": tgt.arch,
                                 "kind": kind, "bytes": len(data)})
    gpu = {"api": "cuda" if tgt.vendor == "nvidia" else "hip", "arch": tgt.arch,
           "triton": triton_version(), "aot": bool(aot and functions), "source": "gpu/kernels.py",
           "kernels": plans, "scratch_bytes": size_json(scratch),
           "sizes": renderer.sizes.json()}
    return members, info, {"gpu": gpu, "binaries": binaries}


# ---- size classes ----------------------------------------------------------------------------

VARIANT_POINTS = (1, 8, 32, 128)  # sizes each symbol of a kernel takes in its size classes
MAX_VARIANT_SYMBOLS = 2  # more symbols: every symbol at the same point (a diagonal)


def variant_points(k: Kernel) -> list:
    """The size points a kernel's configurations are chosen at: for a symbolic kernel with a
    GEMM or attention stage (tiles, split-K and block counts fitted to the sizes), every
    combination of ``VARIANT_POINTS`` over its symbols (``{"batch": 1, "seq": 128}``, ...);
    [None] (the compile's hints) for the others, whose one configuration suits every size."""
    syms = sorted(kernel_sizes(k))
    if not syms or not any(isinstance(st, AttentionStage) or contraction_of(st) is not None
                           for st in k.stages):
        return [None]
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


def _names(fns: list[TritonFunction]) -> tuple:
    """What a variant runs: its functions' code and launch shapes (names aside)."""
    return tuple((f.source.replace(f"def {f.name}(", "def _(", 1), f.num_warps, f.num_stages,
                  tuple(sorted(f.constexprs.items())), tuple(str(g) for g in f.grid))
                 for f in fns)


# ---- weight layout ---------------------------------------------------------------------------

ROW_ALIGN = 16  # bytes: vector loads, cp.async and TMA need rows aligned to this
MIN_RELAYOUT = 1 << 16  # elements: smaller weights are not worth a second layout


def transpose_weights(k: Kernel, constants: set[str]) -> tuple[Kernel, list[tuple[str, Buffer]]]:
    """Constant contraction operands whose rows are not 16-byte aligned but whose columns are
    (GPT-2's tied LM head: ``[768, 50257]`` fp16, rows of 100514 bytes) are read from a copy with
    the last two axes swapped: ``w[.., i, j]`` -> ``wt[.., j, i]``. The GEMM's tiles of it are then
    vector loads along K instead of 2-byte loads (measured on an H200, GPT-2 at batch 32 fp16:
    4096 x 50257 x 768 took 2.18 ms, 0.67 ms so; padding the rows instead gave 2.87). Returns the kernel and (input name, new buffer) per swapped input; the
    caller stores the transposed constant in the buffer's place."""
    aliased = {base for _, base in k.aliases} | {view.name for view, _ in k.aliases}
    swaps = {b.name: Buffer(b.name + "_t", (*b.shape[:-2], b.shape[-1], b.shape[-2]), b.dtype)
             for b in k.inputs if b.name in constants and b.name not in aliased
             and _misaligned_rows(b) and _contraction_only(k, b.name)}
    if not swaps:
        return k, []

    def fn(e):
        if isinstance(e, Load) and e.buf in swaps:
            return Load(swaps[e.buf].name, (*e.index[:-2], e.index[-1], e.index[-2]), e.dtype)
        return None

    stages = [dataclasses.replace(st, body=transform(st.body, fn)) for st in k.stages]
    inputs = [swaps.get(b.name, b) for b in k.inputs]
    return (dataclasses.replace(k, inputs=inputs, stages=stages),
            [(name, buf) for name, buf in swaps.items()])


def _misaligned_rows(b: Buffer) -> bool:
    if len(b.shape) < 2 or b.numel < MIN_RELAYOUT or not b.dtype.is_float:
        return False
    size = b.dtype.itemsize
    return (b.shape[-1] * size) % ROW_ALIGN != 0 and (b.shape[-2] * size) % ROW_ALIGN == 0


def _contraction_only(k: Kernel, name: str) -> bool:
    """Every load of ``name`` is inside a sum (a contraction operand), none in a store index."""
    for st in k.stages:
        if any(isinstance(x, Load) and x.buf == name for e in (st.store_index or ())
               for x in walk(e)):
            return False
        loads = {x for x in walk(st.body) if isinstance(x, Load) and x.buf == name}
        inside = {x for r in walk(st.body) if isinstance(r, Reduce) and r.op is R.SUM
                  for x in walk(r.body) if isinstance(x, Load) and x.buf == name}
        if loads != inside:
            return False
    return any(isinstance(x, Load) and x.buf == name for st in k.stages for x in walk(st.body))


def _shared(f: TritonFunction, unique: dict) -> TritonFunction:
    """The first function with the same code (all but its name) stands for every later one:
    repeated blocks of a model compile once."""
    key = (f.source.replace(f"def {f.name}(", "def _(", 1), tuple(f.signature.items()),
           tuple(sorted(f.constexprs.items())), f.num_warps, f.num_stages)
    first = unique.setdefault(key, f)
    return f if first is f else dataclasses.replace(f, name=first.name, source=first.source)


def _temp_layout(k: Kernel, variants: list[list[TritonFunction]] = ()
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


def _launch(f: TritonFunction, k: Kernel, temps: dict[str, int], warp: int) -> dict:
    ins = {b.name: i for i, b in enumerate(k.inputs)}
    outs = {b.name: i for i, b in enumerate(k.outputs)}

    def where(buf: str) -> dict:
        if buf in ins:
            return {"in": ins[buf]}
        if buf in outs:
            return {"out": outs[buf]}
        return {"temp": size_json(temps[buf])}

    return {"fn": f.name, "template": f.template, "grid": [size_json(g) for g in f.grid],
            "block": [warp * f.num_warps, 1, 1], "num_warps": f.num_warps, "shared": 0,
            "params": len(f.args) + len(f.sizes) + 2,
            "args": [where(a) for a in f.args] + [{"size": p} for p in f.sizes],
            "types": [f.signature[p] for p in f.signature if f.signature[p] != "constexpr"],
            "constexprs": f.constexprs, "global_scratch": 0, "global_scratch_align": 1}


def _attach(plans: dict, compiled: dict[str, Binary]) -> None:
    """Fill in what only the compile knows: shared memory, warps (threads), the ABI, binaries."""
    for plan in plans.values():
        for launch in [*plan["launches"], *(x for v in plan.get("variants", ())
                                              for x in v["launches"])]:
            b = compiled[launch["fn"]]
            warp = 64 if "hsaco" in b.images else 32
            launch.update(shared=b.shared, num_warps=b.num_warps, block=[warp * b.num_warps, 1, 1],
                          params=b.params, global_scratch=b.global_scratch,
                          global_scratch_align=b.global_scratch_align,
                          binaries={kind: f"gpu/{launch['fn']}.{kind}" for kind in b.images})


def _describe(f: TritonFunction) -> dict:
    out = {"stage": f.stage, "fn": f.name, "template": f.template,
           "grid": [g if isinstance(g, int) else str(g) for g in f.grid],
           "num_warps": f.num_warps, "num_stages": f.num_stages, **f.constexprs}
    out.update({k: str(v) if isinstance(v, Sym) else v for k, v in f.meta.items()})
    return out
