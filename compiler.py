"""The compile driver: an ordered list of named stages from model to artifact.

import -> optimize (graph passes) -> lower (one Kernel per node or fused group) -> schedule ->
render (C source) -> build (shared library) -> package (.dpk). Every intermediate can be dumped
with ``dump_dir`` (graph text per pass, kernel C source).
"""
from __future__ import annotations

import json
import os
import platform
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import __version__, config
from .backends.base import Backend, get_backend
from .backends.distributed import tune_plan
from .errors import (
    DeployError,
    NotImplementedYetError,
    TargetError,
    UnsupportedOpsError,
    UsageError,
)
from .graph_ir import sym
from .graph_ir.graph import Graph, Node, Value
from .graph_ir.interpreter import interpret
from .graph_ir.ops import Kind, movement, signal
from .graph_ir.passes import precision, precision_guard, run_pipeline
from .graph_ir.passes.fp8 import calibrate
from .graph_ir.passes.winograd import bf16_dot_products
from .graph_ir.printer import print_graph
from .graph_ir.sym import Sym, dim_json, free_symbols
from .graph_ir.verify import check_symbol_order
from .limits import check_max_memory
from .progress import as_progress
from .runtime.artifact import array_bytes, write_artifact
from .targets import Target, load_target
from .tensor_ir.constants import inline_scalars
from .tensor_ir.epilogue import fuse_epilogues
from .tensor_ir.fuse import lower_fused
from .tensor_ir.lower import LOWERINGS, lower_node
from .tensor_ir.memory import MemoryPlan, inplace_pairs, plan_memory
from .tensor_ir.plan import Plan
from .tensor_ir.tuning_db import TuningDB
from .variants import expand_shape_specs, merge_variants

VIEW_OPS = {movement.Reshape, signal.BitCast}  # same bytes, another shape or dtype


@dataclass
class Artifact:
    """A compiled model in memory; ``save`` writes the ``.dpk`` file."""

    manifest: dict
    members: dict[str, bytes]
    graph: Graph | None = None
    timings: dict[str, float] = field(default_factory=dict)

    def save(self, path) -> Path:
        return write_artifact(path, self.manifest, self.members)

    def load(self, path=None):
        """Save (to ``path`` or a temporary file) and load with the runtime."""
        from .runtime import load
        if path is None:
            import tempfile
            path = Path(tempfile.mkdtemp(prefix="deploy-")) / "model.dpk"
        return load(self.save(path))


def _is_torch(model) -> bool:
    """A torch object (ExportedProgram, nn.Module) or a .pt2 path, told apart without torch."""
    if isinstance(model, (str, os.PathLike)):
        return str(model).endswith(".pt2")
    return any(c.__module__.split(".")[0] == "torch" for c in type(model).__mro__)


def import_model(model, shapes=None, constant_inputs=None, example_inputs=None,
                 dynamic_shapes=None, bind=None) -> tuple[Graph, dict]:
    """Any supported model form -> graph IR; ``bind``: symbol -> size for dims that stay
    fixed."""
    if _is_torch(model):
        from .frontends.torch import import_torch  # optional dependency: torch only here
        return import_torch(model, shapes=shapes, example_inputs=example_inputs,
                            dynamic_shapes=dynamic_shapes)
    from .frontends.onnx import import_onnx
    source = str(model) if isinstance(model, (str, os.PathLike)) else "model"
    return import_onnx(model, shapes=shapes, constant_inputs=constant_inputs, source=source,
                       bind=bind)


CHECK_SIZE = 2  # the size of every symbol in the --dtype error check


def _graph_symbols(graph: Graph) -> set[str]:
    return {s for v in graph.inputs for d in v.shape for s in free_symbols(d)}


def _check_symbolic_backend(graph: Graph, backend: Backend) -> None:
    """A backend whose kernels take no symbolic sizes binds them (SymbolicError: the caller
    binds and compiles again)."""
    syms = _graph_symbols(graph)
    if syms and not backend.symbolic:
        raise sym.SymbolicError(f"the {backend.name} backend compiles fixed sizes", syms)


def compile(model, target: str | Target = "host", shapes: dict | None = None,
            dump_dir: str | None = None, constant_inputs: dict | None = None,
            tune: str = "none", example_inputs=None, dynamic_shapes=None,
            tuning_db: str | None = None, budget=None, **options) -> Artifact:
    """Compile ``model`` (path to .onnx/.pt2, onnx.ModelProto, ExportedProgram, or an nn.Module
    with ``example_inputs`` and optional ``dynamic_shapes``, exported for the caller). ``shapes``
    binds input shapes; a list of several shape dicts compiles one artifact with a variant per
    entry (see ``variants.py``). Dims it leaves unbound stay symbolic: the artifact runs at
    every size. ``dims={"seq": (1, 512), "batch": 8}`` declares a symbol's range or binds it
    (docs/shapes.md). Silent unless asked: ``progress`` (a ``deploy.progress.Progress``, or a
    function taking each ``Event``) receives the stages and kernel counts, ``log`` (a function
    taking a line) the tuner's lines. ``ray="local"|"auto"|ADDRESS`` tunes on a Ray cluster
    (``tune_workers``, ``tune_cores``, ``tune_reference``: docs/tuning.md)."""
    variants = expand_shape_specs(shapes)
    if variants is not None:
        if load_target(target).kind != "cpu":
            raise NotImplementedYetError("shape variants are supported for CPU targets only")
        arts = [compile(model, target, s, dump_dir, constant_inputs, tune, example_inputs,
                        dynamic_shapes, tuning_db, budget, **options) for s in variants]
        manifest, members = merge_variants(arts)
        return Artifact(manifest, members, arts[0].graph, arts[0].timings)
    ranges, bound = parse_dims(options.pop("dims", None))
    reasons: dict[str, str] = {}
    while True:  # a symbol some part needs as a number is bound for the whole artifact
        ctx = sym.SymContext(ranges=dict(ranges))
        try:
            with sym.using(ctx):
                art = _compile_once(model, target, shapes, dump_dir, constant_inputs, tune,
                                    example_inputs, dynamic_shapes, tuning_db, budget,
                                    dict(options, bind=dict(bound)))
        except sym.SymbolicError as e:
            new = [s for s in e.symbols if s not in bound]
            if not new:
                raise
            for s in new:  # (at least the low end the shapes inferred: a window must fit)
                bound[s] = _bound_value(s, {**ranges, **ctx.ranges})
                reasons[s] = str(e)
            continue
        if reasons:
            art.manifest["provenance"]["bound_symbols"] = {
                s: {"value": bound[s], "reason": r} for s, r in reasons.items()}
            _warn_bound(bound, reasons)
        return art


def parse_dims(dims) -> tuple[dict, dict]:
    """``dims``: symbol -> size (binds it), (low, high) or "low..high" (a range; high None or
    omitted: unbounded). Returns (ranges, bindings)."""
    ranges, bound = {}, {}
    for name, spec in (dims or {}).items():
        if isinstance(spec, str) and ".." in spec:
            lo, _, hi = spec.partition("..")
            spec = (int(lo or 1), int(hi) if hi else None)
        if isinstance(spec, (tuple, list)):
            lo, hi = int(spec[0]), None if spec[1] is None else int(spec[1])
            if lo < 1 or (hi is not None and hi < lo):
                raise UsageError(f"dims {name}={spec}: expected 1 <= low <= high")
            ranges[name] = (lo, hi)
        else:
            try:
                bound[name] = int(spec)
            except (TypeError, ValueError):
                raise UsageError(f"dims {name}={spec!r}: expected a size (8) or a range "
                                 "(1..512)") from None
    return ranges, bound


def _bound_value(name: str, ranges: dict) -> int:
    """The size a symbol is bound to when it cannot stay symbolic: its range's low end (1
    with no range)."""
    return ranges.get(name, (1, None))[0]


def _warn_bound(bound: dict, reasons: dict) -> None:
    text = "; ".join(f"{s}={bound[s]} ({r})" for s, r in reasons.items())
    warnings.warn(f"symbolic size(s) bound for the whole artifact: {text}. Other sizes are "
                  "refused at run time; pass --shape or --dim NAME=N to choose the size",
                  RuntimeWarning, stacklevel=3)


def _compile_once(model, target, shapes, dump_dir, constant_inputs, tune, example_inputs,
                  dynamic_shapes, tuning_db, budget, options) -> Artifact:
    timings: dict[str, float] = {}
    clock = time.perf_counter()
    progress = as_progress(options.get("progress"))  # silent unless the caller gives one

    def lap(stage: str, then: str | None = None) -> None:
        """``stage`` ended (its time is recorded and reported); ``then`` begins."""
        nonlocal clock
        now = time.perf_counter()
        timings[stage] = round(now - clock, 4)
        clock = now
        progress.end(stage, timings[stage])
        if then:
            progress.begin(then)

    progress.begin("import")
    tgt = load_target(target)
    _check_supported(tgt, tune)
    backend = get_backend(tgt, options)
    backend.options["progress"] = progress  # builds report kernels rendered and built
    half, tf32 = _precision_settings(tgt, backend, options)
    backend.options["allow_tf32"] = tf32
    graph, report = import_model(model, shapes, constant_inputs, example_inputs, dynamic_shapes,
                                 options.get("bind"))
    _check_symbolic_backend(graph, backend)
    backend.begin(graph)  # (GPU: compile workers start while the passes run)
    try:
        reference = graph  # the model's own precision, for the --dtype error check
        bound = _max_error(options.get("max_error"), half)
        if _graph_symbols(graph) and half is not None and \
                (backend.runs_here or bound or half is precision.FP8):
            # checked at small fixed sizes (a GPU's symbolic artifact is not emulated: no second
            # import, which took 5 of a symbolic BERT's 33 s)
            fixed = {s: max(sym.context().ranges.get(s, (1, None))[0], CHECK_SIZE)
                     for s in _graph_symbols(graph)}
            reference, _ = import_model(model, shapes, constant_inputs, example_inputs,
                                        dynamic_shapes, {**options.get("bind", {}), **fixed})
        lap("import", "optimize")
        dump = Path(dump_dir) if dump_dir else None
        if dump:
            dump.mkdir(parents=True, exist_ok=True)
            (dump / "00-import.txt").write_text(print_graph(graph))
        calibration = _calibration(reference, half, options.get("calibrate"), lambda shapes:
                                   import_model(model, shapes, constant_inputs, example_inputs,
                                                dynamic_shapes, options.get("bind"))[0])
        guard = precision_guard.choose(reference, half, bound, tgt,
                                       calibration=calibration) if bound else None
        graph, pass_stats = run_pipeline(graph, tgt, dump,
                                         {"dtype": half, "keep_fp32": guard.keep if guard else (),
                                          "calibration": calibration})
        lap("optimize", "lower")
        backend.check_graph(graph)
        plan = _plan(graph)
        memory = _plan_memory(graph, plan)
        backend.prepare(plan)
        check_max_memory(options.get("max_memory"), memory, plan, graph)  # before any build
        tuning = tune not in ("none", None)
        lap("lower", "tune" if tuning else "render+build")
        db = TuningDB(tuning_db or config.tuning_db_path())
        if tuning:
            try:
                tuned = tune_plan(backend, plan, tune, db,  # here or on Ray
                                  _budget_seconds(budget),
                                  log=progress.tuner_log(options.get("log")))
            finally:  # interrupted too (Ctrl-C): the records measured so far, written atomically
                db.save()
            timings["tune_gain"] = round(tuned.gain(), 3)
            lap("tune", "render+build")
        built = backend.build(plan, dump, db)
        lap("render+build", "package")
        manifest = _manifest(graph, plan, tgt, report, pass_stats, built.kernels, timings, model)
        manifest.update(built.manifest)  # a library and its entry, or a GPU launch plan
        members = built.members
        manifest["memory"] = {"arena_bytes": memory.arena_bytes,
                              "intermediate_bytes": memory.intermediate_bytes,
                              "inplace": {str(k): v for k, v in sorted(memory.inplace.items())},
                              "offsets": {str(k): v for k, v in sorted(memory.offsets.items())}}
        if memory.deferred:  # symbolic sizes: the runtime places these per distinct size
            manifest["memory"]["deferred"] = [[v, dim_json(n), a, b]
                                              for v, n, a, b in memory.deferred]
            manifest["memory"]["shared"] = {str(k): v for k, v in sorted(memory.shared.items())}
        for vid, arr in plan.constants.items():
            members[f"weights/{vid}.npy"] = array_bytes(arr)
        lap("package")
        art = Artifact(manifest, members, graph, timings)
        if half is not None or backend.kind == "gpu":
            progress.begin("check")
            check = options.get("check_precision")
            manifest["precision"] = _precision_record(art, reference, backend, half, tf32,
                                                      True if check is None and bound else check,
                                                      guard, bound)
            lap("check")
        manifest["compile_seconds"] = timings
        return art
    finally:
        backend.end()


def lower_only(model, target: str | Target = "host", shapes: dict | None = None) -> Plan:
    """Import, optimize and lower to kernels without building C (``deploy check``); raises the
    same errors as ``compile`` would up to that point."""
    tgt = load_target(target)
    graph, _ = import_model(model, shapes)
    graph, _ = run_pipeline(graph, tgt, None)
    return _plan(graph)


def _check_supported(tgt: Target, tune: str) -> None:
    """Refuse, with a clear message, what this build of deploy cannot do yet."""
    if tune not in ("none", "quick", "full", None):
        raise DeployError(f"tune={tune!r}: expected one of none, quick, full")
    host = {"amd64": "x86_64", "arm64": "aarch64"}.get(platform.machine().lower(),
                                                       platform.machine().lower())
    arch = tgt.triple.split("-")[0] if tgt.triple else host
    if arch != host and not os.environ.get("CC"):
        raise TargetError(f"target {tgt.name} generates {tgt.triple} code but this machine is "
                          f"{host}: set CC to a cross compiler (e.g. CC={tgt.triple}-gcc), or "
                          "use --target host")


def _precision_settings(tgt: Target, backend: Backend, options: dict):
    """(half dtype or None, tf32) from the options ``dtype``, ``precision`` (fp32 | tf32) and
    ``allow_tf32`` (the older spelling of ``precision="tf32"``)."""
    half = precision.half_dtype(options.get("dtype"))
    given = options.get("precision")
    mode = str(given or ("tf32" if options.get("allow_tf32") else "fp32")).strip().lower()
    if mode not in ("fp32", "tf32"):
        raise UsageError(f"precision={given!r}: expected fp32 (IEEE float32 GEMMs, the default) "
                         "or tf32 (float32 GEMMs on TF32 tensor cores, GPU targets)")
    if given and "allow_tf32" in options and bool(options["allow_tf32"]) != (mode == "tf32"):
        raise UsageError(f"precision={given!r} and allow_tf32={options['allow_tf32']!r} "
                         "disagree; give one of them")
    if half is precision.FP8 and backend.kind == "gpu" and not getattr(backend, "fp8", False):
        raise UsageError(f"dtype fp8: target {tgt.name} has no float8 tensor cores (NVIDIA "
                         "sm_89 and newer have them: --target h100); use dtype fp16 here")
    if mode == "tf32" and not backend.tf32:
        raise UsageError(f"precision tf32: target {tgt.name} (backend {backend.name}) has no "
                         "TF32 mode; it applies to GPU targets. Use fp32 here")
    return half, mode == "tf32"


# Interpreter multiply-adds beyond which --dtype's check is skipped: on 2 cores the five
# benchmark models at batch 1 check in 0.3-4.3 s, ResNet-50 at batch 8 (2.6e10) in 7 s.
PRECISION_CHECK_LIMIT = 3e10


def _calibration(reference: Graph, half, given, reimport) -> dict[str, float] | None:
    """fp8: the range of every GEMM input, from ``given`` (a ``.npz`` path or a dict of arrays
    by input name: the user's data; a symbolic model is imported again at their shapes through
    ``reimport``) or seeded random inputs; None for other dtypes."""
    if half is not precision.FP8:
        if given is not None:
            raise UsageError("calibrate: only dtype fp8 takes calibration inputs")
        return None
    if given is None:
        return calibrate(reference, precision.check_inputs(reference, seed=0))
    feed = _arrays(given)
    names = [v.name for v in reference.inputs]
    missing = [n for n in names if n not in feed]
    if missing:
        raise UsageError(f"calibrate: no array for input(s) {', '.join(missing)} (the model's "
                         f"inputs: {', '.join(names)})")
    if _graph_symbols(reference) or any(tuple(feed[v.name].shape) != tuple(v.shape)
                                        for v in reference.inputs):
        reference = reimport({n: tuple(feed[n].shape) for n in names})
    return calibrate(reference, feed)


def _arrays(given) -> dict[str, np.ndarray]:
    if isinstance(given, dict):
        return {k: np.asarray(v) for k, v in given.items()}
    try:
        with np.load(given, allow_pickle=False) as z:
            if hasattr(z, "files"):
                return {k: z[k] for k in z.files}
    except (OSError, ValueError) as e:
        raise UsageError(f"calibrate: cannot read {given} ({e}); expected an .npz archive "
                         "(np.savez) with one array per input name") from None
    raise UsageError(f"calibrate: {given} is one .npy array; expected an .npz archive "
                     "(np.savez) with one array per input name")


def _max_error(value, half) -> float | None:
    """``max_error`` checked: a positive number, and only with a half-precision ``dtype``."""
    if value is None:
        return None
    try:
        bound = float(value)
    except (TypeError, ValueError):
        bound = -1.0
    if not bound > 0 or isinstance(value, bool):
        raise UsageError(f"max_error={value!r}: expected a positive relative L2 error, e.g. "
                         "1e-3")
    if half is None:
        raise UsageError("max_error needs dtype fp16, bf16 or fp8 (it chooses the layers that "
                         "keep a wider type in a reduced-precision build)")
    return bound


def _precision_record(art: Artifact, reference: Graph, backend: Backend, half, tf32: bool,
                      check: bool | None, guard=None, bound: float | None = None) -> dict:
    """The manifest's ``precision``: the compute dtype, the fp32 GEMM mode on GPUs, the
    ``--max-error`` guard's choice and, for --dtype, the relative L2 error of every output
    against the float32 model on seeded random inputs (run through the artifact on CPU targets,
    emulated for GPU targets; the tolerance is the guard's bound when there is one). ``check``:
    None checks when interpreting costs at most PRECISION_CHECK_LIMIT multiply-adds, True
    always, False never."""
    rec: dict = {"dtype": "fp32" if half is None else
                 {"float16": "fp16", "float8e4m3fn": "fp8"}.get(half.name, "bf16")}
    if half is precision.FP8:  # the GEMMs that run in fp8 (the rest: fp16)
        rec["fp8_gemms"] = sum(1 for n in _members(art.graph) if n.op.kind is Kind.CONTRACTION
                               and n.inputs[0].dtype is precision.FP8)
    if backend.tf32:
        rec["fp32_gemm"] = "tf32" if tf32 else "ieee"
    if half is None:
        return rec
    rec["contractions"] = _contraction_types(art.graph)
    if guard is not None:
        rec["guard"] = guard.record(bound)
        if not guard.error <= bound:
            warnings.warn(f"--max-error {bound:g}: even with every layer in float32 the "
                          f"emulated error is {guard.error:.3g}; the artifact keeps every layer "
                          "in float32", RuntimeWarning, stacklevel=3)
    if check is not False and not backend.runs_here and _graph_symbols(art.graph):
        rec["check"] = ("skipped: symbolic sizes are not emulated; check on the device with "
                        "`deploy run --check`")
        return rec
    cost = precision.interpreter_cost(reference)
    if check is False or (check is None and cost > PRECISION_CHECK_LIMIT):
        rec["check"] = (f"skipped: interpreting costs ~{cost:.2g} multiply-adds (limit "
                        f"{PRECISION_CHECK_LIMIT:.0e}; check_precision=True forces it)"
                        if check is None else "skipped: check_precision=False")
        return rec
    inputs = precision.check_inputs(reference, seed=0)
    try:
        ref = interpret(reference, inputs)
        ours = (art.load().run(inputs) if backend.runs_here
                else precision.emulate(art.graph, inputs))
    except Exception as e:  # noqa: BLE001  (a diagnostic: it never fails the compile)
        rec["check"] = f"failed: {type(e).__name__}: {e}"
        return rec
    tolerance = bound or (precision.FP8_TOLERANCE if half is precision.FP8 else None)
    rec.update(precision.compare(reference.output_names, ours, ref, tolerance), seed=0,
               check="artifact" if backend.runs_here else "emulated")
    for name in rec["over"]:
        warnings.warn(f"--dtype {rec['dtype']}: output '{name}' differs from the float32 model "
                      f"by relative L2 error {rec['rel_l2'][name]:.3g} (> {rec['tolerance']:g}) "
                      "on random inputs; compile without --dtype if that is too much",
                      RuntimeWarning, stacklevel=3)
    return rec


SHORT_DTYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float8e4m3fn": "fp8"}


def _contraction_types(graph: Graph) -> dict[str, int]:
    """How many contractions compute in which type: CPU bf16 dot products (``bf16 dot-product``),
    float32 Winograd convolutions (``fp32 winograd``) and those whose GEMMs are bf16 dot products
    (``bf16 winograd``), else
    their input's dtype (``fp32`` where a policy kept a layer wide: a depthwise convolution
    on a CPU with bf16 dot products, a layer the --max-error guard kept). An
    ``ExpandDepthwise`` counts as its two: the expansion (where it has one) in its input's
    type, the depthwise convolution in float32."""
    out: dict[str, int] = {}
    for n in _members(graph):
        if n.op.name == "ExpandDepthwise":
            if n.inputs[1] is not None:  # (the expansion's)
                key = SHORT_DTYPES.get(n.inputs[0].dtype.name, n.inputs[0].dtype.name)
                out[key] = out.get(key, 0) + 1
            key = "fp32"
        elif n.op.name == "PackedConv" and n.attrs["algo"] == "winograd":
            x = n.inputs[0]
            bf16 = bf16_dot_products(n.attrs["tile"], x.dtype, x.shape[-1])
            key = "bf16 winograd" if bf16 else "fp32 winograd"
        elif n.op.name in ("PackedConv", "PackedMatMul"):
            key = "bf16 dot-product"
        elif n.op.kind is Kind.CONTRACTION and n.inputs[0] is not None:
            key = SHORT_DTYPES.get(n.inputs[0].dtype.name, n.inputs[0].dtype.name)
        else:
            continue
        out[key] = out.get(key, 0) + 1
    return out


def _members(graph: Graph):
    for n in graph.nodes:
        yield from (n.attrs["body"].nodes if n.op.name == "Fused" else [n])


def _plan(graph: Graph) -> Plan:
    missing = [(n.name, n.op.name, None, "no tensor-IR lowering") for n in _members(graph)
               if n.op.kind is not Kind.HOST and n.op not in VIEW_OPS and n.op not in LOWERINGS]
    if missing:
        raise UnsupportedOpsError(missing, "graph")
    check_symbol_order(graph)  # sizes host ops tell are bound before the kernels using them
    ids: dict[Value, int] = {}

    def vid(v: Value) -> int:
        return ids.setdefault(v, len(ids))

    for v in graph.inputs:
        vid(v)
    steps, kernels, host_ops, used_consts = [], [], [], {}
    for node in graph.nodes:
        for v in node.inputs:
            if v is not None and v in graph.constants:
                used_consts[vid(v)] = graph.constants[v]
        ins = [None if v is None else vid(v) for v in node.inputs]
        outs = [vid(v) for v in node.outputs]
        if node.op in VIEW_OPS:
            steps.append({"kind": "view", "inputs": ins[:1], "outputs": outs, "node": node.name})
        elif node.op.kind is Kind.HOST:
            steps.append({"kind": "host", "op": node.op.name, "inputs": ins, "outputs": outs,
                          "attrs": _json_attrs(node), "node": node.name})
            host_ops.append(node.op.name)
        else:
            k = _lower(node, f"k{len(kernels)}", graph.constants)
            kernels.append(k)
            steps.append({"kind": "kernel", "symbol": k.name, "inputs": [i for i in ins if i is not None],
                          "outputs": outs, "node": node.name, "op": node.op.name})
    for v in graph.outputs:
        if v in graph.constants:
            used_consts[vid(v)] = graph.constants[v]
        vid(v)
    symbols = sorted({s for v in graph.inputs for d in v.shape for s in free_symbols(d)})
    runtime = sym.context().runtime  # sizes read off host ops' outputs, after the input symbols
    symbols += sorted({s for v in ids for d in v.shape for s in free_symbols(d)} & set(runtime))
    return Plan(ids, steps, kernels, used_consts, host_ops, symbols=symbols,
                output_ids=[ids[v] for v in graph.outputs])


def _plan_memory(graph: Graph, plan: Plan) -> MemoryPlan:
    # fresh buffers: sizes known after a host op ran; strings, sequences (objects) on the host
    runtime = set(sym.context().runtime)
    nbytes = {i: (v.type.sym_numel * v.dtype.itemsize if v.type.is_symbolic and not
                  runtime & {s for d in v.shape for s in free_symbols(d)}
                  and v.dtype.c_type is not None else None)
              for v, i in plan.ids.items()}
    outside = {plan.ids[v] for v in graph.inputs} | set(plan.constants) | \
        {plan.ids[v] for v in graph.outputs}
    kernel_steps = [s for s in plan.steps if s["kind"] == "kernel"]
    inplace = {step["outputs"][o]: step["inputs"][i] for step, k in zip(kernel_steps, plan.kernels)
               for o, i in inplace_pairs(k).items()}
    return plan_memory(plan.steps, nbytes, outside, inplace)


def _lower(node: Node, name: str, constants: dict):
    if node.op.name == "Fused":
        kernel = lower_fused(node, name, constants)
    else:
        consts = {k: constants[v] for k, v in enumerate(node.inputs)
                  if v is not None and v in constants}
        kernel = lower_node(node, name, consts)
    scalars = {f"in{k}": constants[v] for k, v in enumerate(node.inputs)
               if v is not None and v in constants}
    return fuse_epilogues(inline_scalars(kernel, scalars))


def _json_attrs(node: Node) -> dict:
    out = {}
    for k, v in node.attrs.items():
        if isinstance(v, np.ndarray):
            v = v.tolist()
        elif hasattr(v, "name") and hasattr(v, "np"):
            v = v.name
        out[k] = v
    return out


def _budget_seconds(budget) -> float:
    """'10m', '90s', '1h' or a number of seconds."""
    if budget is None:
        return 600.0
    text = str(budget).strip().lower()
    scale = {"s": 1, "m": 60, "h": 3600}.get(text[-1:], None)
    try:
        return float(text[:-1]) * scale if scale else float(text)
    except ValueError:
        raise DeployError(f"--budget {budget!r}: expected e.g. 90s, 10m or 1h") from None


def _spec(v: Value, name: str | None = None) -> dict:
    return {"name": name or v.name, "dtype": v.dtype.np.name, "shape": _shape_json(v.shape)}


def _shape_json(shape) -> list:
    return [dim_json(d) if isinstance(d, Sym) else d for d in shape]


def _manifest(graph, plan, tgt, report, pass_stats, kernels, timings, model) -> dict:
    ids = plan.ids
    return {
        "deploy_version": __version__,
        "target": tgt.to_dict(),
        "inputs": [_spec(v) for v in graph.inputs],
        "outputs": [_spec(v, n) for v, n in zip(graph.outputs, graph.output_names)],
        "input_ids": [ids[v] for v in graph.inputs],
        "output_ids": [ids[v] for v in graph.outputs],
        "values": {**{str(i): {"dtype": v.dtype.np.name, "shape": _shape_json(v.shape)}
                      for v, i in ids.items()},
                   **{str(i): {"dtype": b.dtype.np.name, "shape": _shape_json(b.shape)}
                      for i, b in plan.extra_values.items()}},
        "constants": {str(i): f"weights/{i}.npy" for i in plan.constants},
        "steps": plan.steps,
        **_symbol_manifest(plan, report),
        "kernels": kernels,
        "kernel_count": len(kernels),
        "host_ops": sorted(set(plan.host_ops)),
        "passes": pass_stats,
        "provenance": {"source": str(model) if isinstance(model, (str, os.PathLike)) else
                       type(model).__name__, "opset": report.get("opset"),
                       "bound_dims": report.get("bound_dims", {}),
                       "op_histogram": graph.op_histogram()},
    }


def _symbol_manifest(plan: Plan, report: dict) -> dict:
    """The shape program's data: the symbols in kernel order, their pointer slot, declared
    ranges and the equalities the runtime checks."""
    if not plan.symbols:
        return {}
    ctx = sym.context()
    ranges = {s: ctx.ranges.get(s, (1, None)) for s in plan.symbols}
    seen, constraints = set(), []
    for a, b, where in ctx.equal:
        key = tuple(sorted((str(a), str(b))))
        if key in seen or a == b or _as_upper_bound(a, b, ranges) or _as_upper_bound(b, a, ranges):
            continue
        seen.add(key)
        constraints.append([dim_json(a), dim_json(b), where])
    return {"symbols": plan.symbols, "dims_slot": plan.dims_slot(),
            "dims": {s: list(r) for s, r in ranges.items()}, "constraints": constraints}


def _as_upper_bound(a, b, ranges: dict) -> bool:
    """``a == min(c, a)`` for a symbol ``a`` (a table of c rows sliced to ``a``) is the range
    bound ``a <= c``: recorded in ``ranges``, so the error reads as one."""
    if not (isinstance(a, Sym) and isinstance(b, Sym) and len(b.terms) == 1):
        return False
    (mono, coeff), = b.terms
    name = str(a)
    if coeff != 1 or len(mono) != 1 or not isinstance(mono[0], sym.Op) or name not in ranges:
        return False
    op = mono[0]
    if op.kind != "min" or a not in op.args:
        return False
    (c,) = [x for x in op.args if x != a] or [None]
    if not isinstance(c, int):
        return False
    lo, hi = ranges[name]
    ranges[name] = (lo, c if hi is None else min(hi, c))
    return True


def dumps(obj) -> str:
    return json.dumps(obj, indent=1)
