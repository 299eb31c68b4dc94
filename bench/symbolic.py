"""Symbolic shapes: one artifact per model, compiled with no shape flags, run at every size.

    python -m deploy.bench.symbolic [bert_base gpt2_small resnet50] [--tiny] [--runs 10]
        [--sizes default|full|"batch=1,2 seq=1,7 image_batch=1,3"] [--max-tokens 2048]
        [--timing "text=1x128,8x128 image=1,8" | --timing none] [--json out.json]

For each model: export it with ONNX dynamic axes (bench.models, ``dynamic=True``: text inputs
``[batch, seq]``, images ``[batch, 3, H, W]``; the graph inputs' dims are printed, and the ops
that compute sizes are counted), compile it ONCE for ``host`` with no ``shapes`` (its symbols
stay symbolic), save it and load it with ``deploy.load``. At every size of the sweep, run it on
fresh seeded random inputs (bench.models.random_inputs with the sizes put into the specs) and
compare with ONNX Runtime (CPU EP, default session options) at that size:
err = max |ours - ORT| / (max - min of ORT), PASS when <= 1e-3. A size the artifact refuses
(``deploy.InputError``) is ``refused`` and fails; any other exception is ``error`` and fails.
Sizes past the model's position table, or text sizes past ``--max-tokens`` batch*seq (ORT's
time grows with it), are ``skipped``.

At the ``--timing`` sizes it also compiles a static artifact (``shapes={input: that shape}``),
checks it against ORT the same way, and times the two in the same process in alternating
runs (``alternate_ms``: medians of ``--runs`` runs after warm-up; the minimums are in the
JSON): run time symbolic/static (target <= 1.10) and compile seconds symbolic/static (target
<= 1.2; the symbolic compile is timed once per model). Prints markdown tables; ``--json``
writes every row. Exit status 1 when any check fails (sweep or static)."""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import tempfile
import time
import warnings
from collections import Counter
from pathlib import Path

import numpy as np

from . import models

MODELS = ["bert_base", "gpt2_small", "resnet50"]
TOLERANCE = 1e-3
SEED = 1
PRESETS = {  # name -> (text batches, text seqs, image batches)
    "default": ((1, 2, 8), (1, 7, 128, 512), (1, 2, 3, 8)),
    "full": ((1, 2, 4, 8), (1, 7, 16, 64, 128, 512), (1, 2, 3, 8)),
    "tiny": ((1, 2, 8), (1, 7, 16, 64), (1, 2, 3, 8)),
}
TIMING = {"default": "text=1x128,8x128 image=1,8", "tiny": "text=1x16,8x16 image=1,8"}
SHAPE_OPS = ("Shape", "Size", "Gather", "Concat", "Reshape", "Expand", "Range",
             "ConstantOfShape", "Where", "Slice", "Unsqueeze", "Squeeze", "Tile", "CumSum")


@dataclasses.dataclass
class Sizes:
    """The sweep: text batch x seq (capped at ``max_tokens`` = batch*seq; 0: no cap), image batch."""

    batch: tuple[int, ...]
    seq: tuple[int, ...]
    image_batch: tuple[int, ...]
    max_tokens: int = 0


# ----------------------------------------------------------------------------- options

def parse_sizes(text: str, tiny: bool, max_tokens: int | None) -> Sizes:
    """``default``, ``full``, or ``batch=1,2 seq=1,7 image_batch=1,3`` (keys left out keep the
    default preset's values)."""
    preset = "tiny" if tiny and text == "default" else text
    if preset in PRESETS:
        b, s, i = PRESETS[preset]
        cap = 2048 if preset == "default" else 0
        return Sizes(b, s, i, cap if max_tokens is None else max_tokens)
    base = parse_sizes("default", tiny, max_tokens)
    fields = {}
    for item in text.replace(";", " ").split():
        key, _, values = item.partition("=")
        if key not in ("batch", "seq", "image_batch") or not values:
            raise ValueError(f"--sizes {item!r}: expected batch=.., seq=.. or image_batch=..")
        fields[key] = tuple(int(v) for v in values.split(","))
    return dataclasses.replace(base, **fields)


def parse_timing(text: str) -> dict[str, list[tuple[int, ...]]]:
    """``text=1x128,8x128 image=1,8`` -> {"text": [(1, 128), (8, 128)], "image": [(1,), (8,)]};
    ``none``: no timing."""
    out: dict[str, list[tuple[int, ...]]] = {"text": [], "image": []}
    if text == "none":
        return out
    for item in text.split():
        key, _, values = item.partition("=")
        if key not in out:
            raise ValueError(f"--timing {item!r}: expected text=BxS,.. or image=B,..")
        out[key] = [tuple(int(d) for d in v.split("x")) for v in values.split(",") if v]
    return out


# ----------------------------------------------------------------------------- graph facts

def shape_computations(model) -> dict:
    """What a compiler must fold to keep sizes symbolic. ``computing``: op counts of the nodes
    that compute from sizes alone (from a Shape/Size node on, every input a size or a constant);
    ``consumers``: nodes that take such a computed value beside tensor data (Reshape's shape,
    Expand's shape, a Where on a mask...); ``reshape_wildcards``: Reshapes whose constant target
    shape holds -1 or 0 (the size is implied); ``histogram``: whole-graph counts of SHAPE_OPS."""
    import onnx
    from onnx import numpy_helper
    proto = onnx.load(str(model), load_external_data=False) if not hasattr(model, "graph") else model
    consts = {t.name: t for t in proto.graph.initializer}
    const, sized = set(consts) | {""}, set()
    computing, consumers, wildcards = Counter(), Counter(), 0
    for node in proto.graph.node:
        ins = list(node.input)
        if node.op_type == "Constant" or (ins and all(i in const for i in ins)):
            const.update(node.output)
            if node.op_type == "Constant":
                consts.update({o: next((a.t for a in node.attribute if a.name == "value"), None)
                               for o in node.output})
        elif node.op_type in ("Shape", "Size") or (
                any(i in sized for i in ins) and all(i in sized or i in const for i in ins)):
            sized.update(node.output)
            computing[node.op_type] += 1
        elif any(i in sized for i in ins):
            consumers[node.op_type] += 1
        if node.op_type == "Reshape" and len(ins) > 1 and consts.get(ins[1]) is not None:
            target = numpy_helper.to_array(consts[ins[1]])
            wildcards += bool(((target == -1) | (target == 0)).any())
    hist = models.op_histogram(proto)
    return {"computing": dict(computing.most_common()), "consumers": dict(consumers.most_common()),
            "reshape_wildcards": wildcards,
            "histogram": {op: hist[op] for op in SHAPE_OPS if hist[op]}}


def max_positions(name: str, tiny: bool) -> int | None:
    """Longest sequence the text model's position table holds (None for images)."""
    cfg = models.RECIPES[models.recipe_name(name)].config(tiny)
    for attr in ("max_position_embeddings", "n_positions"):
        if hasattr(cfg, attr):
            return int(getattr(cfg, attr))
    return None


def is_text(specs: list[models.InputSpec]) -> bool:
    return any(s.kind != "image" for s in specs)


# ----------------------------------------------------------------------------- sizes + checks

def sized_specs(specs: list[models.InputSpec], size: dict[str, int]) -> list[models.InputSpec]:
    """The specs with their dynamic dims (bench.models.dynamic_axes) set to ``size``."""
    out = []
    for s in specs:
        shape = list(s.shape)
        for k, n in models.dynamic_axes(s).items():
            shape[k] = size[n]
        out.append(dataclasses.replace(s, shape=tuple(shape)))
    return out


def sweep(specs, sizes: Sizes, max_pos: int | None) -> list[tuple[dict, str]]:
    """Every size of the sweep for this model, with a reason to skip it ("" to run it)."""
    if not is_text(specs):
        return [({"batch": b}, "") for b in sizes.image_batch]
    out = []
    for b in sizes.batch:
        for s in sizes.seq:
            why = ""
            if max_pos is not None and s > max_pos:
                why = f"seq > {max_pos} positions"
            elif sizes.max_tokens and b * s > sizes.max_tokens:
                why = f"batch*seq > {sizes.max_tokens} (--max-tokens)"
            out.append(({"batch": b, "seq": s}, why))
    return out


def feed(specs, size: dict[str, int]) -> dict[str, np.ndarray]:
    """Fresh random inputs at ``size``, seeded by the size (the same at every run)."""
    rng = np.random.default_rng([SEED, *size.values()])
    return models.random_inputs(sized_specs(specs, size), rng)


def rel_error(ours: list[np.ndarray], ref: list[np.ndarray]) -> float:
    """max |ours - ref| / (max - min of ref), worst output; inf on a shape or count mismatch,
    nan when either side is not finite."""
    if len(ours) != len(ref) or any(a.shape != b.shape for a, b in zip(ours, ref)):
        return math.inf
    worst = 0.0
    for a, b in zip(ours, ref):
        b = b.astype(np.float64)
        spread = float(b.max() - b.min()) if b.size else 0.0
        d = float(np.abs(a.astype(np.float64) - b).max()) if b.size else 0.0
        err = d / max(spread, 1e-30) if d else 0.0
        if not (np.isfinite(a).all() and np.isfinite(b).all()):
            err = math.nan
        worst = err if math.isnan(err) or err > worst else worst
    return worst


def check(run, ort_sess, inputs: dict) -> dict:
    """Run ``run(inputs)`` and ORT on the same inputs; the row's status, err and seconds."""
    import deploy
    t = time.perf_counter()
    try:
        ours = run(inputs)
    except deploy.InputError as e:
        return {"status": "refused", "err": None, "detail": _first_line(e)}
    except Exception as e:  # noqa: BLE001 - reported per size, the sweep goes on
        return {"status": "error", "err": None, "detail": f"{type(e).__name__}: {_first_line(e)}"}
    ours_s = time.perf_counter() - t
    t = time.perf_counter()
    ref = ort_sess.run(None, inputs)
    ort_s = time.perf_counter() - t
    err = rel_error(ours, ref)
    status = "PASS" if err <= TOLERANCE else "FAIL"  # nan compares False: FAIL
    detail = "" if status == "PASS" else ("shape mismatch: " + ", ".join(
        f"{a.shape} vs {b.shape}" for a, b in zip(ours, ref)) if math.isinf(err) else "")
    return {"status": status, "err": err, "detail": detail,  # first calls at this size:
            "first_run_ms": round(1e3 * ours_s, 2), "ort_first_run_ms": round(1e3 * ort_s, 2)}


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:200] if text else type(e).__name__


# ----------------------------------------------------------------------------- compile + time

def compile_load(path: Path, out_dir: Path, label: str, shapes: dict | None = None) -> dict:
    """deploy.compile for host (``shapes`` or none), save, deploy.load: module, seconds, warnings,
    the artifact's input specs and bound symbols; on failure ``error`` instead of a module."""
    import deploy
    start = time.perf_counter()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            kwargs = {} if shapes is None else {"shapes": shapes}
            art = deploy.compile(str(path), target="host", **kwargs)
        seconds = time.perf_counter() - start
        mod = deploy.load(str(art.save(out_dir / f"{label}.dpk")))
    except Exception as e:  # noqa: BLE001 - reported, the benchmark goes on
        return {"module": None, "error": f"{type(e).__name__}: {_first_line(e)}"}
    bound = art.manifest.get("provenance", {}).get("bound_symbols", {})
    return {"module": mod, "compile_s": round(seconds, 3), "error": None,
            "warnings": [_first_line(w.message) for w in caught],
            "input_specs": [str(s) for s in mod.input_specs],
            "bound_symbols": {s: b.get("value") for s, b in bound.items()}}


def alternate_ms(fns, runs: int, warmup: int = 2) -> list[list[float]]:
    """Milliseconds of ``runs`` calls of each of ``fns``, one call of each in turn (so drift and
    a neighbour's load fall on all alike), after ``warmup`` untimed calls of each."""
    for fn in fns:
        for _ in range(warmup):
            fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(runs):
        for fn, ts in zip(fns, times):
            t0 = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t0) * 1e3)
    return times


def time_pair(sym_mod, static_mod, inputs: dict, runs: int) -> dict:
    """Median and min ms of the symbolic and the static module on ``inputs``, alternating
    runs in this process; the symbolic ones None when it refuses the size."""
    import deploy
    fns = [lambda: static_mod.run(inputs)]
    try:
        if sym_mod is not None:
            sym_mod.run(inputs)
            fns.append(lambda: sym_mod.run(inputs))
    except deploy.InputError:
        pass
    times = alternate_ms(fns, runs) + [None]
    out = {}
    for label, ts in (("static", times[0]), ("sym", times[1])):
        out[f"{label}_ms"] = _round(float(np.median(ts))) if ts else None
        out[f"{label}_min_ms"] = _round(min(ts)) if ts else None
    return out


def timing_row(path: Path, specs, size: dict, sym: dict, ort_sess, out_dir: Path,
               runs: int) -> dict:
    """Static compile at ``size``, its ORT check, and both artifacts timed at that size."""
    sized = sized_specs(specs, size)
    static = compile_load(path, out_dir, "static-" + "x".join(map(str, size.values())),
                          {s.name: s.shape for s in sized})
    row = {"size": size, "sym_compile_s": sym.get("compile_s")}
    if static["module"] is None:
        return {**row, "static_status": "error", "detail": static["error"]}
    inputs = feed(specs, size)
    got = check(static["module"].run, ort_sess, inputs)
    row.update(static_compile_s=static["compile_s"], static_status=got["status"],
               static_err=got["err"], detail=got["detail"])
    if got["status"] in ("PASS", "FAIL"):
        row.update(time_pair(sym["module"], static["module"], inputs, runs))
        sym_ms, static_ms = row["sym_ms"], row["static_ms"]
        row.update(run_ratio=_round(sym_ms / static_ms if sym_ms else None),
                   run_ratio_min=_round(row["sym_min_ms"] / row["static_min_ms"]
                                        if sym_ms else None),
                   sym_refused=sym_ms is None)
    if sym.get("compile_s"):
        row["compile_ratio"] = round(sym["compile_s"] / static["compile_s"], 3)
    static["module"].close()
    return row


def _round(x, digits: int = 3):
    return None if x is None else round(x, digits)


# ----------------------------------------------------------------------------- one model

def bench_model(name: str, tiny: bool, sizes: Sizes, timing: dict, runs: int,
                out_dir: Path) -> dict:
    """Export (dynamic), compile once, sweep, time; everything the tables and JSON need."""
    import onnxruntime as ort
    path = models.model_path(name, tiny=tiny, dynamic=True)
    specs = models.input_specs(path)
    text = is_text(specs)
    res = {"model": name, "tiny": tiny, "onnx": str(path),
           "graph_inputs": models.graph_input_dims(path), "shape_ops": shape_computations(path)}
    _print_header(res)
    import deploy.compiler  # noqa: F401 - imported before the clock starts, like the static ones
    sym = compile_load(path, out_dir, name)
    res.update({k: v for k, v in sym.items() if k != "module"})
    print("  symbolic compile: " + (f"{sym['compile_s']:.2f} s, inputs {sym['input_specs']}, "
                                     f"bound {sym['bound_symbols'] or 'none'}"
                                     if sym["module"] else f"FAILED {sym['error']}"))
    for w in sym.get("warnings", []):
        print(f"  warning: {w}")
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    res["sizes"] = []
    for size, why in sweep(specs, sizes, max_positions(name, tiny) if text else None):
        if why:
            row = {"status": "skipped", "err": None, "detail": why}
        elif sym["module"] is None:
            row = {"status": "error", "err": None, "detail": "symbolic compile failed"}
        else:
            row = check(sym["module"].run, sess, feed(specs, size))
        res["sizes"].append({"size": size, **row})
        print(f"  {_size_text(size)}: {row['status']} {_err_text(row['err'])} {row['detail']}")
    res["timing"] = []
    for dims in timing["text" if text else "image"]:
        row = timing_row(path, specs, dict(zip(("batch", "seq"), dims)), sym, sess, out_dir, runs)
        res["timing"].append(row)
        print(f"  timing {_size_text(row['size'])}: symbolic {_cell(row.get('sym_ms'))} ms, "
              f"static {_cell(row.get('static_ms'))} ms (static compile "
              f"{_cell(row.get('static_compile_s'))} s, check {row['static_status']})")
    if sym["module"] is not None:
        sym["module"].close()
    return res


def _print_header(res: dict) -> None:
    ops = res["shape_ops"]
    print(f"{res['model']}{' (tiny)' if res['tiny'] else ''}: {res['onnx']}")
    print("  graph inputs: " + ", ".join(f"{n} {d}" for n, d in res["graph_inputs"].items()))
    print("  shape ops (graph): " + (_counts(ops["histogram"]) or "none"))
    print("  size computations: " + (_counts(ops["computing"]) or "none")
          + "; consumers: " + (_counts(ops["consumers"]) or "none")
          + f"; Reshapes with -1/0: {ops['reshape_wildcards']}")


def _counts(c: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in c.items())


def _size_text(size: dict) -> str:
    return "x".join(str(v) for v in size.values())


def _err_text(err) -> str:
    return "-" if err is None else f"{err:.2e}"


# ----------------------------------------------------------------------------- report

def failures(results: list[dict]) -> int:
    """Sizes that failed the error check (FAIL, refused, error) plus failed static checks."""
    bad = sum(r["status"] in ("FAIL", "refused", "error") for m in results for r in m["sizes"])
    return bad + sum(t.get("static_status") != "PASS" for m in results for t in m["timing"])


def tables(results: list[dict]) -> str:
    """The sweep and the timing, as markdown."""
    lines = ["| model | batch | seq | status | err | detail |", "|---|---|---|---|---|---|"]
    for m in results:
        for r in m["sizes"]:
            lines.append(f"| {m['model']} | {r['size']['batch']} | {r['size'].get('seq', '-')} "
                         f"| {r['status']} | {_err_text(r['err'])} | {r['detail']} |")
    lines += ["", ("| model | size | symbolic ms | static ms | run sym/static | (min) "
                   "| compile s sym | compile s static | compile sym/static | static check |"),
              "|---|---|---|---|---|---|---|---|---|---|"]
    for m in results:
        for t in m["timing"]:
            static = f"{t['static_status']} {_err_text(t.get('static_err'))}"
            sym = "refused" if t.get("sym_refused") else "-"
            lines.append(
                f"| {m['model']} | {_size_text(t['size'])} | {_cell(t.get('sym_ms'), sym)} "
                f"| {_cell(t.get('static_ms'))} | {_cell(t.get('run_ratio'), sym)} "
                f"| {_cell(t.get('run_ratio_min'), sym)} "
                f"| {_cell(t.get('sym_compile_s'))} | {_cell(t.get('static_compile_s'))} "
                f"| {_cell(t.get('compile_ratio'))} | {static} |")
    return "\n".join(lines)


def _cell(x, missing: str = "-") -> str:
    return missing if x is None else f"{x:g}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m deploy.bench.symbolic", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("names", nargs="*", default=MODELS, help=f"default: {' '.join(MODELS)}")
    p.add_argument("--tiny", action="store_true", help="few layers, small widths (tests)")
    p.add_argument("--sizes", default="default",
                   help="default, full, or e.g. 'batch=1,2 seq=1,7 image_batch=1,3'")
    p.add_argument("--max-tokens", type=int, default=None,
                   help="skip text sizes with batch*seq above this (default preset: 2048; 0: none)")
    p.add_argument("--timing", default=None,
                   help=f"sizes to time against a static build (default '{TIMING['default']}', "
                        f"tiny '{TIMING['tiny']}'; 'none': no timing)")
    p.add_argument("--runs", type=int, default=10, help="timed runs per artifact and size")
    p.add_argument("--json", type=Path, default=None, help="also write every row here")
    a = p.parse_args(argv)
    try:
        sizes = parse_sizes(a.sizes, a.tiny, a.max_tokens)
        timing = parse_timing(a.timing or TIMING["tiny" if a.tiny else "default"])
        names = [models.recipe_name(n) for n in a.names]
    except (ValueError, KeyError) as e:
        print(e.args[0], file=sys.stderr)
        return 2
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="deploy-symbolic-") as tmp:
        results = [bench_model(n, a.tiny, sizes, timing, a.runs, Path(tmp)) for n in names]
    bad = failures(results)
    print()
    print(tables(results))
    print(f"\n{bad} failure(s); {time.perf_counter() - start:.0f} s")
    if a.json:
        a.json.write_text(json.dumps({"settings": {**vars(a), "json": str(a.json),
                                                   "sizes": dataclasses.asdict(sizes),
                                                   "timing": timing, "tolerance": TOLERANCE},
                                      "failures": bad, "models": results}, indent=1, default=str))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
