"""The ``deploy`` command line (also ``python -m deploy``).

    deploy compile MODEL [--target T] [-o OUT] [--shape NAME=1x3x224x224 ...]
    deploy run ARTIFACT [--inputs in.npz] [--outputs out.npz] [--check MODEL.onnx]
    deploy bench ARTIFACT [--compare ort [MODEL.onnx]] [--warmup N] [--runs N]
    deploy bench ARTIFACT --profile [--top N] [--dim NAME=N ...] [--json F]
    deploy check MODEL [--target T]
    deploy inspect ARTIFACT [--json] [--html OUT.html [--profile PROFILE.json]]
    deploy targets [show NAME]
    deploy tune MODEL --target T [--budget 10m] [--ray local|auto|ADDRESS [--workers N]]
    deploy keygen KEY.pem | sign ARTIFACT --key KEY.pem | verify ARTIFACT [--trusted-key K]

Exit code 0 on success. A user error prints one paragraph on stderr and exits non-zero, without
a traceback (``--debug`` or ``DEPLOY_DEBUG>=2`` shows it). ``run``, ``bench`` and ``inspect``
use the runtime only; they never import the compiler.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
import warnings
from pathlib import Path

import numpy as np

from . import __version__, config
from .cli_sign import add_commands as add_sign_commands
from .errors import DeployError, InputError, UsageError
from .progress import Progress, for_command
from .runtime.dtypes import storage_dtype
from .runtime.shapes import dim_text, input_shapes

EXIT_INTERNAL = 70  # EX_SOFTWARE: a deploy bug, not a user error


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``deploy`` console script; returns the exit code."""
    args = build_parser().parse_args(argv)
    debug = args.debug or config.debug_level() >= 2
    shown = warnings.showwarning
    if not debug:  # a warning is a line for the user, not the line of deploy that raised it
        warnings.showwarning = _show_warning
    try:
        return int(args.func(args) or 0)
    except DeployError as e:
        return _fail(str(e), e.exit_code, debug)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # output piped into `head` and the like: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as e:  # noqa: BLE001  (last resort: never a bare traceback)
        where = getattr(e, "where", "")
        if type(e).__name__ == "NeedsConstant":
            return _fail(f"{where + ': ' if where else ''}{e}. deploy compiles static graphs: "
                         "values that decide shapes must be constants or computable from the "
                         "input shapes (see --shape)", 1, debug)
        return _fail(f"internal error (a deploy bug): {type(e).__name__}: {e}. Rerun with "
                     "--debug for the traceback and please report it.", EXIT_INTERNAL, debug)
    finally:
        warnings.showwarning = shown


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    print(f"deploy: warning: {message}", file=file or sys.stderr)


def _fail(message: str, code: int, debug: bool) -> int:
    if debug:
        traceback.print_exc()
    print(f"deploy: error: {message}", file=sys.stderr)
    return code


# ---- argument parsing ----------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show tracebacks for errors")
    p = argparse.ArgumentParser(prog="deploy", description="Compile models to one artifact; "
                                "load and run it anywhere with the small runtime.")
    p.add_argument("--version", action="version", version=f"deploy {__version__}")
    p.add_argument("--debug", action="store_true", default=False, help="show tracebacks")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (_add_compile, _add_run, _add_bench, _add_check, _add_inspect, _add_targets,
                _add_tune, add_sign_commands):
        add(sub, common)
    return p


def _add_compile(sub, common) -> None:
    c = sub.add_parser("compile", parents=[common], help="compile a model to a .dpk artifact")
    c.add_argument("model", help="model file: .onnx (or a torch.export .pt2)")
    _target_arg(c)
    c.add_argument("-o", "--output", help="artifact path (default: MODEL's stem + .dpk, here)")
    c.add_argument("--shape", action="append", default=[], metavar="NAME=DIMS",
                   help="bind an input's shape, e.g. input=1x3x224x224 (repeatable)")
    _dim_arg(c)
    _dtype_args(c)
    c.add_argument("--max-error", type=float, metavar="E",
                   help="with --dtype: keep float32 in as few leading layers as needed for the "
                        "outputs' relative L2 error vs the float32 model (random inputs, "
                        "measured at compile time) to stay <= E, e.g. 1e-3; `deploy inspect` "
                        "lists them")
    c.add_argument("--check-precision", action=argparse.BooleanOptionalAction, default=None,
                   help="with --dtype: measure the error against the float32 model on random "
                        "inputs at compile time (default: when interpreting the model costs at "
                        "most 3e10 multiply-adds)")
    c.add_argument("--tune", choices=["none", "quick", "full"], default="none",
                   help="autotune kernels on this machine first (default: none, i.e. tuning "
                        "records if any, else the default schedules)")
    _tuning_args(c, budget_default=None)
    c.add_argument("--max-memory", metavar="SIZE",
                   help="refuse the model if its planned memory (weights, arena, outputs; "
                        "symbolic dims at their range's upper end) exceeds SIZE, e.g. 2GB, "
                        "512MB (binary units)")
    c.add_argument("--dump-dir", default=config.dump_dir(),
                   help="write every intermediate (graph per pass, C source) here "
                        "(default: $DEPLOY_DUMP_DIR)")
    _progress_args(c)
    c.set_defaults(func=cmd_compile)


def _add_run(sub, common) -> None:
    r = sub.add_parser("run", parents=[common], help="run an artifact once and summarize outputs")
    r.add_argument("artifact")
    r.add_argument("--inputs", help=".npz with one array per input name (default: random)")
    r.add_argument("--outputs", help="write the outputs to this .npz (keys: output names)")
    r.add_argument("--check", metavar="MODEL.onnx", help="compare with ONNX Runtime on MODEL")
    r.add_argument("--rtol", type=float, default=None,
                   help="relative tolerance (default 1e-3; 1e-2 for fp16/bf16 artifacts)")
    r.add_argument("--atol", type=float, default=None,
                   help="absolute tolerance (default 1e-4; for fp16/bf16 artifacts 1e-2 of the "
                        "output's largest magnitude)")
    r.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    _size_arg(r)
    r.set_defaults(func=cmd_run)


def _add_bench(sub, common) -> None:
    b = sub.add_parser("bench", parents=[common], help="latency percentiles (optionally vs ORT)")
    b.add_argument("artifact", nargs="?")
    b.add_argument("--compare", nargs="+", metavar="ort [MODEL.onnx]",
                   help="also time ONNX Runtime on MODEL (default: the model it was compiled from)")
    b.add_argument("--inputs", help=".npz with one array per input name (default: random)")
    b.add_argument("--warmup", type=int, default=10, help="untimed runs first (default 10)")
    b.add_argument("--runs", type=int, default=None,
                   help="timed runs (default 100; with --profile, timed calls per kernel, "
                        "default 20)")
    b.add_argument("--json", nargs="?", const=True, default=None, metavar="F",
                   help="print the results as JSON; with a file name F, write them there and "
                        "print the usual text")
    b.add_argument("--profile", action="store_true",
                   help="time every kernel on its own (GPU: between CUDA events, on the GPU; "
                        "CPU: one kernel call at a time) and show each one's time, share, "
                        "TFLOP/s, GB/s and %% of its floor max(FLOPs/peak, bytes/bandwidth), "
                        "and the whole model's floors (docs/benchmarks.md)")
    b.add_argument("--top", type=int, default=20,
                   help="with --profile: the slowest N kernels in the table (default 20)")
    b.add_argument("--flush-l2", action="store_true",
                   help="with --profile, GPU: overwrite 256 MB before each timed launch (else "
                        "launches share L2 as in the graph)")
    b.add_argument("--in-graph", action="store_true",
                   help="with --profile, GPU: each kernel's time is what it adds to a replay of "
                        "the CUDA graph (its end minus the latest end before it, from CUPTI "
                        "through torch's profiler; needs torch with CUDA); they sum to the "
                        "replay")
    b.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    _size_arg(b)
    _progress_args(b)
    b.set_defaults(func=cmd_bench)


def _add_check(sub, common) -> None:
    c = sub.add_parser("check", parents=[common], help="list every op and whether it is supported")
    c.add_argument("model")
    _target_arg(c)
    c.add_argument("--shape", action="append", default=[], metavar="NAME=DIMS",
                   help="bind an input's shape, as for compile")
    _dim_arg(c)
    c.add_argument("--all-nodes", action="store_true", help="list every node, not every op type")
    c.set_defaults(func=cmd_check)


def _add_inspect(sub, common) -> None:
    i = sub.add_parser("inspect", parents=[common], help="describe an artifact")
    i.add_argument("artifact")
    i.add_argument("--json", action="store_true", help="machine-readable JSON")
    i.add_argument("--html", metavar="OUT.html",
                   help="write a self-contained page drawing the fused graph in step order, "
                        "each kernel with its op, note, template, output bytes and time")
    i.add_argument("--profile", metavar="PROFILE.json",
                   help="with --html: kernel times of a GPU artifact, the JSON `python -m "
                        "deploy.bench.gpu_profile ARTIFACT --json F` writes")
    i.add_argument("--runs", type=int, default=3,
                   help="with --html, CPU artifacts of fixed sizes: time each kernel here over "
                        "this many calls (default 3; 0: no times)")
    i.set_defaults(func=cmd_inspect)


def _add_targets(sub, common) -> None:
    t = sub.add_parser("targets", parents=[common], help="list or describe target descriptions")
    t.add_argument("--json", action="store_true", help="machine-readable JSON")
    tsub = t.add_subparsers(dest="action", metavar="show NAME")
    show = tsub.add_parser("show", parents=[common], help="describe one target (name or YAML path)")
    show.add_argument("name")
    show.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                      help="machine-readable JSON")
    t.set_defaults(func=cmd_targets, action=None)


def _add_tune(sub, common) -> None:
    t = sub.add_parser("tune", parents=[common],
                       help="measure kernel schedules here and fill the tuning database")
    t.add_argument("model")
    _target_arg(t)
    t.add_argument("--level", choices=["quick", "full"], default="full",
                   help="quick: a short list per kernel; full: evolutionary search (default)")
    t.add_argument("--shape", action="append", default=[], metavar="NAME=DIMS",
                   help="bind an input's shape, as for compile")
    _dim_arg(t)
    t.add_argument("-o", "--output", help="also write the tuned artifact here")
    _dtype_args(t)
    t.add_argument("--in-graph", action="store_true",
                   help="GPU: then choose each kernel's configuration among its default and "
                        "its fastest alone by the time it adds inside the model's CUDA graph "
                        "(builds and profiles the model --rounds + 1 times; fixed shapes; "
                        "needs torch with CUDA)")
    t.add_argument("--rounds", type=int, default=4,
                   help="with --in-graph: configurations tried per kernel (default 4: the "
                        "default and the three fastest alone)")
    _tuning_args(t, budget_default="10m")
    _ray_args(t)
    _progress_args(t)
    t.set_defaults(func=cmd_tune)


def _ray_args(p) -> None:
    p.add_argument("--ray", metavar="local|auto|ADDRESS",
                   help="tune on Ray workers: local (start Ray here), auto (the cluster `ray "
                        "start --head` made) or a cluster address (docs/tuning.md)")
    p.add_argument("--workers", type=int, dest="tune_workers", metavar="N",
                   help="--ray: measuring workers (default: one per core on CPU targets, one "
                        "per GPU on GPU targets)")
    p.add_argument("--cores", type=int, dest="tune_cores", metavar="N",
                   help="--ray, CPU targets: cores each worker pins itself to (default 1)")
    p.add_argument("--reference-db", dest="tune_reference", metavar="FILE",
                   help="another run's tuning database (a serial run's): the report counts "
                        "the kernels whose choice agrees with it")


def _tuning_args(p, budget_default: str | None) -> None:
    p.add_argument("--tuning-db", help="tuning records file (default: $DEPLOY_TUNING_DB or "
                                       "~/.cache/deploy/tuning.jsonl)")
    p.add_argument("--budget", default=budget_default,
                   help="tuning time budget, e.g. 90s, 10m, 1h" + (
                       f" (default {budget_default})" if budget_default else " (default 10m)"))


def _progress_args(p) -> None:
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no progress line on stderr (there is none when stderr is not a "
                        "terminal either); stdout is the same")
    p.add_argument("--log-json", action="store_true",
                   help="progress as JSON lines on stderr, one object per event: event "
                        "(start, end, progress, log), stage, step, done, total, seconds, "
                        "elapsed (docs/debugging.md)")


def _progress(args, tick: bool = True) -> Progress:
    """The reporter ``--quiet`` / ``--log-json`` and stderr ask for (deploy/progress.py)."""
    return for_command(quiet=args.quiet, log_json=args.log_json, tick=tick)


def _dtype_args(p) -> None:
    p.add_argument("--dtype", choices=["fp32", "fp16", "bf16", "fp8"], type=str.lower,
                   help="compute dtype: fp16/bf16 store weights and activations in half precision "
                        "(softmax, normalizations, sums, exp/log stay fp32; inputs and outputs "
                        "keep the model's dtypes); fp8: fp16 with the GEMMs over constant "
                        "weights in float8 e4m3 (h100; CPU targets emulate it); default: the "
                        "model's own")
    p.add_argument("--calibrate", metavar="INPUTS.npz",
                   help="with --dtype fp8: the inputs (np.savez, one array per input name) the "
                        "activations' fp8 ranges are measured on; default: seeded random inputs")
    p.add_argument("--precision", choices=["fp32", "tf32"], type=str.lower, default=None,
                   help="float32 GEMMs on GPU targets: fp32 (IEEE, default) or tf32 (TF32 "
                        "tensor cores)")


def _target_arg(p) -> None:
    p.add_argument("-t", "--target", default="host",
                   help="target name (see `deploy targets`) or path to a YAML file (default: host)")
    p.add_argument("--gpu-codegen", choices=["triton", "cuda", "auto"], type=str.lower,
                   default=None,
                   help="GPU targets: generate Triton or CUDA C kernels, or per kernel the "
                        "faster of the two as measured by `deploy tune` (auto; Triton where "
                        "nothing was measured). Default: the target's `backend`")


def _dim_arg(p) -> None:
    p.add_argument("--dim", action="append", default=[], metavar="NAME=LO..HI|NAME=N",
                   help="a symbolic dim's range (seq=1..512: bounds tiling choices and memory; "
                        "other sizes are refused) or its fixed size (batch=8); repeatable. "
                        "Dims with neither stay symbolic: any size runs")


def _size_arg(p) -> None:
    p.add_argument("--dim", action="append", default=[], metavar="NAME=N",
                   help="the size of a symbolic dim for the random inputs (default 1), e.g. "
                        "--dim batch=8 --dim seq=128; repeatable")
    p.add_argument("--threads", type=int, metavar="N",
                   help="CPU artifacts: threads per run (default $DEPLOY_NUM_THREADS, else "
                        "every core)")


def parse_dims(specs: list[str]) -> dict[str, object]:
    """``["seq=1..512", "batch=8"]`` -> ``{"seq": "1..512", "batch": 8}``."""
    out: dict[str, object] = {}
    for spec in specs:
        name, sep, value = spec.partition("=")
        lo, dots, hi = value.partition("..")
        ok = sep and name and (lo.strip().isdigit() and (not dots or not hi or hi.strip().isdigit()))
        if not ok:
            raise UsageError(f"--dim {spec!r}: expected NAME=N (a fixed size) or NAME=LO..HI (a "
                             "range, HI may be omitted), e.g. --dim seq=1..512")
        out[name.strip()] = value.strip() if dots else int(lo)
    return out


def parse_shapes(specs: list[str]) -> dict[str, tuple[int, ...]] | list[dict]:
    """``["x=1x3x224x224", "y=4,8"]`` -> ``{"x": (1, 3, 224, 224), "y": (4, 8)}``. A name given
    several times asks for shape variants: one dict per occurrence (``x=1x16 x=8x16`` -> two)."""
    occurrences: dict[str, list[tuple[int, ...]]] = {}
    for spec in specs:
        name, sep, dims = spec.partition("=")
        parts = [d for d in dims.replace(",", "x").split("x") if d.strip()] if dims else []
        if not sep or not name or not all(d.strip().isdigit() for d in parts):
            raise UsageError(f"--shape {spec!r}: expected NAME=DIMS with DIMS like 1x3x224x224 "
                             "(non-negative integers separated by 'x' or ',')")
        occurrences.setdefault(name, []).append(tuple(int(d) for d in parts))
    counts = {len(v) for v in occurrences.values()} - {1}
    if len(counts) > 1:
        raise UsageError("--shape: inputs given several times must all be given the same number "
                         f"of times (one per variant); got { {k: len(v) for k, v in occurrences.items()} }")
    n = counts.pop() if counts else 1
    variants = [{k: v[min(i, len(v) - 1)] for k, v in occurrences.items()} for i in range(n)]
    return variants[0] if n == 1 else variants


# ---- compile / check / tune -----------------------------------------------------------------

def cmd_compile(args) -> int:
    out = Path(args.output or Path(args.model).with_suffix(".dpk").name)
    _compile_and_report(args, args.tune, out)
    if args.dump_dir:
        print(f"  intermediates dumped to {args.dump_dir}")
    return 0


def cmd_tune(args) -> int:
    out = Path(args.output) if args.output else None
    if not args.in_graph:
        _compile_and_report(args, args.level, out)
    else:
        _tune_in_graph(args, out)
    print(f"  tuning records: {args.tuning_db or config.tuning_db_path()} (later compiles for "
          "targets with the same features use them)")
    return 0


def _tune_in_graph(args, out: Path | None) -> None:
    """``deploy tune --in-graph``: the tuner's isolated times screen, the model's graph picks
    (graph_tune.py)."""
    import importlib.util
    import tempfile

    from .backends.triton.tune import DeviceMeasurer, gpu_features
    from .compiler import compile as deploy_compile
    from .graph_tune import Ranking, measure_in_graph, refine
    from .targets import load_target
    from .tensor_ir.tuning_db import TuningDB
    tgt = load_target(args.target)
    if tgt.kind != "gpu" or tgt.vendor != "nvidia" or getattr(args, "ray", None) or \
            getattr(args, "gpu_codegen", None) in ("cuda", "auto"):
        raise UsageError("--in-graph measures inside a CUDA graph: NVIDIA GPU targets, Triton "
                         f"kernels, tuned here (target {tgt.name!r})")
    if args.rounds < 2:
        raise UsageError(f"--rounds {args.rounds}: at least 2 (the default and one other)")
    if importlib.util.find_spec("torch") is None:  # before the tuning it would follow
        raise UsageError("--in-graph reads each kernel's time in the graph through torch's "
                         "profiler (CUPTI): install torch with CUDA")
    ranking = Ranking(DeviceMeasurer(tgt))
    art = _compile_and_report(args, args.level, None, measure=ranking)
    if art.manifest.get("symbols"):
        raise UsageError("--in-graph profiles one build: bind every symbolic dim (--shape, or "
                         "--dim NAME=N); the isolated records are saved")
    db = TuningDB(args.tuning_db or config.tuning_db_path())
    options = _compile_options(args)
    with tempfile.TemporaryDirectory(prefix="deploy-tune-") as tmp, warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="--dtype", category=RuntimeWarning)

        def build(db_path: str) -> str:
            a = deploy_compile(args.model, target=args.target, tuning_db=db_path, **options)
            return str(a.save(Path(tmp) / "round.dpk"))
        report = refine(db, gpu_features(tgt, options.get("precision") == "tf32"),
                        ranking.choices(), build, measure_in_graph, args.rounds)
    db.save()
    print("\n".join(report.lines()))
    if out:
        a = deploy_compile(args.model, target=args.target, tuning_db=str(db.path), **options)
        print(f"  tuned artifact: {a.save(out)}")


def _compile_options(args) -> dict:
    """``deploy.compile``'s options from a command's arguments (beyond model and target)."""
    options = {k: v for k in ("dtype", "precision", "gpu_codegen", "max_memory", "ray",
                              "tune_workers", "tune_cores", "tune_reference")
               if (v := getattr(args, k, None))}
    if getattr(args, "max_error", None) is not None:
        options["max_error"] = args.max_error
    if getattr(args, "calibrate", None):
        options["calibrate"] = args.calibrate
    if getattr(args, "check_precision", None) is not None:
        options["check_precision"] = args.check_precision
    options["shapes"] = parse_shapes(args.shape) or None
    options["dims"] = parse_dims(args.dim) or None
    return options


def _compile_and_report(args, tune: str, out: Path | None, **extra):
    from .compiler import compile as deploy_compile
    t0 = time.perf_counter()
    with warnings.catch_warnings(), _progress(args) as progress:
        # the --dtype error check's warning is printed below
        warnings.filterwarnings("ignore", message="--dtype", category=RuntimeWarning)
        art = deploy_compile(args.model, target=args.target,
                             dump_dir=getattr(args, "dump_dir", None), tune=tune,
                             tuning_db=args.tuning_db, budget=args.budget, progress=progress,
                             log=print, **_compile_options(args), **extra)
        path = _save(art, out, progress) if out else None
    m = art.manifest
    secs = m.get("compile_seconds", {})
    stages = ", ".join(f"{k} {v:.2f}s" for k, v in _stages(secs))
    where = f" -> {path} ({_fmt_bytes(path.stat().st_size)}, " if path else " ("
    print(f"compiled {args.model} for {m['target']['name']}{where}{m['kernel_count']} kernels, "
          f"{time.perf_counter() - t0:.2f}s: {stages})")
    for kind in ("inputs", "outputs"):
        print(f"  {kind}: " + ", ".join(_spec_str(s) for s in m[kind]))
    if "tune_gain" in secs:
        print(f"  tuned kernels ({tune}): {secs['tune_gain']:.2f}x the default schedules' speed")
    if "precision" in m:
        print("  precision: " + _precision_str(m["precision"]))
    return art


def _save(art, out: Path, progress: Progress) -> Path:
    """Write the artifact (seconds for a large model's weights), reported as stage ``save``."""
    t0 = time.perf_counter()
    progress.begin("save")
    path = art.save(out)
    progress.end("save", round(time.perf_counter() - t0, 4))
    return path


def _guard_str(g: dict, dtype: str) -> str:
    """The --max-error guard's choice: which layers kept float32, the rest in ``dtype``."""
    wider = "fp16" if "fp16_layers" in g else "fp32"
    kept = g.get(f"{wider}_layers", [])
    label = {"fp16": "float16", "fp32": "float32"}[wider]
    head = (f"max error {g['max_error']:g}: {len(kept)} of {g['layers']} layers {label}, the "
            f"rest {dtype} (emulated error {g['error']:.2g}"
            + ("" if g.get("met", True) else f", over the bound even with every layer {label}")
            + ")")
    return head + "".join(f"\n    {wider}: {name}" for name in kept)


def _precision_str(p: dict) -> str:
    """``fp16, rel L2 vs fp32: y 3.1e-04`` (with a warning per output over the tolerance)."""
    parts = [p.get("dtype", "fp32")]
    if "fp32_gemm" in p:
        parts.append(f"fp32 GEMMs {p['fp32_gemm']}")
    if p.get("rel_l2"):
        errs = ", ".join(f"{k} {v:.2g}" for k, v in p["rel_l2"].items())
        parts.append(f"rel L2 error vs fp32 on random inputs ({p.get('check')}): {errs}")
    elif str(p.get("check", "")).startswith(("skipped", "failed")):
        parts.append(f"error check {p['check']}")
    if p.get("contractions"):  # how many run in which type
        parts.append("contractions: " + ", ".join(f"{n} {k}"
                                                   for k, n in sorted(p["contractions"].items())))
    text = ", ".join(parts)
    if p.get("guard"):
        text += "\n  " + _guard_str(p["guard"], p.get("dtype", "half"))
    for name in p.get("over", []):
        text += (f"\n  WARNING: output '{name}' is off by {p['rel_l2'][name]:.2g} relative L2 "
                 f"(> {p.get('tolerance', 1e-2):g}): check it on your data, or compile without "
                 "--dtype")
    return text


def cmd_check(args) -> int:
    from .targets import load_target
    target = load_target(args.target)
    model, rows = _model_ops(args.model)
    _print_op_table(rows, args.all_nodes)
    bad = [r for r in rows if not r[3]]
    if bad:
        print(f"\n{len(bad)} of {len(rows)} nodes unsupported:")
        for name, op, opset, _ in bad:
            print(f"  - node '{name}': {op}" + (f" (opset {opset})" if opset is not None else ""))
        return 1
    problem = _lowering_problem(model, target, parse_shapes(args.shape))
    if problem:
        print(f"\nthe model imports, but: {problem}")
        return 1
    print(f"\nall {len(rows)} nodes supported for target {target.name}")
    return 0


def _model_ops(path: str) -> tuple[object, list[tuple]]:
    """The loaded model and its (node name, op, opset, supported) rows: ONNX or .pt2."""
    if path.endswith(".pt2"):
        try:
            from .frontends.torch import list_ops as torch_ops
        except ImportError:
            raise UsageError(f"{path}: reading torch.export programs needs torch "
                             "(pip install torch)") from None
        return path, torch_ops(path)
    from .frontends.onnx import list_ops, load_model
    proto, _ = load_model(path, expand=False)  # the ops as the user wrote them
    return proto, list_ops(proto)


def _print_op_table(rows, all_nodes: bool) -> None:
    if all_nodes:
        print(f"{'node':<32} {'op':<24} {'opset':>5}  status")
        for name, op, opset, ok in rows:
            print(f"{name:<32} {op:<24} {_opset(opset):>5}  "
                  f"{'supported' if ok else 'UNSUPPORTED'}")
        return
    groups: dict[tuple, int] = {}
    for _, op, opset, ok in rows:
        groups[(op, opset, ok)] = groups.get((op, opset, ok), 0) + 1
    print(f"{'op':<28} {'opset':>5} {'nodes':>6}  status")
    for (op, opset, ok), n in sorted(groups.items(), key=lambda kv: (kv[0][2], kv[0][0])):
        print(f"{op:<28} {_opset(opset):>5} {n:>6}  {'supported' if ok else 'UNSUPPORTED'}")


def _opset(opset) -> str:
    return "-" if opset is None else str(opset)


def _lowering_problem(proto, target, shapes) -> str | None:
    """Import and lower (no C build); the first problem compile would hit, or None."""
    from .compiler import lower_only
    try:
        lower_only(proto, target, shapes or None)
    except DeployError as e:
        return str(e)
    except Exception as e:  # noqa: BLE001  (NeedsConstant, or a bug in a lowering)
        where = getattr(e, "where", "")
        return f"{where + ': ' if where else ''}{type(e).__name__}: {e}"
    return None


# ---- run / bench ----------------------------------------------------------------------------

def cmd_run(args) -> int:
    from .runtime import load
    mod = load(args.artifact, threads=args.threads)
    inputs = _inputs(mod, args.inputs, args.seed, parse_dims(args.dim))
    t0 = time.perf_counter()
    outs = mod.run(inputs)
    ms = (time.perf_counter() - t0) * 1e3
    print(f"ran {args.artifact} (target {mod.manifest['target']['name']}) in {ms:.3f} ms")
    print("inputs:" + ("" if args.inputs else f" random (seed {args.seed})"))
    for spec in mod.input_specs:
        print(f"  {spec.name}: {_summary(inputs[spec.name])}")
    print("outputs:")
    for spec, arr in zip(mod.output_specs, outs):
        print(f"  {spec.name}: {_summary(arr)}")
    if args.outputs:
        np.savez(args.outputs, **{s.name: a for s, a in zip(mod.output_specs, outs)})
        print(f"outputs written to {args.outputs}")
    if args.check:
        return _check_against_ort(args.check, mod, inputs, outs, args.rtol, args.atol)
    return 0


def _inputs(mod, path: str | None, seed: int, sizes: dict | None = None) -> dict[str, np.ndarray]:
    if path:
        return _load_npz(path)
    rng = np.random.default_rng(seed)
    bad = [k for k, v in (sizes or {}).items() if not isinstance(v, int)]
    if bad:
        raise UsageError(f"--dim {bad[0]}: give one size (NAME=N) for the random inputs")
    shapes = input_shapes(mod.manifest, sizes or {})
    return {spec.name: _random(shape, np.dtype(spec.dtype), rng)
            for spec, shape in zip(mod.input_specs, shapes)}


def _random(shape, dtype: np.dtype, rng) -> np.ndarray:
    if dtype == np.bool_:
        return rng.random(shape) > 0.5
    if np.issubdtype(dtype, np.integer):
        return rng.integers(0, 10, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def _load_npz(path: str) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as z:
            if not hasattr(z, "files"):
                raise InputError(f"{path}: expected an .npz archive (np.savez) with one array "
                                 "per input name, got a single .npy array")
            return {k: z[k] for k in z.files}
    except (OSError, ValueError) as e:
        raise InputError(f"{path}: cannot read inputs ({e}); expected an .npz archive "
                         "(np.savez) with one array per input name") from None


def _summary(a: np.ndarray) -> str:
    head = f"{a.dtype}[{', '.join(map(str, a.shape))}]"
    if a.size == 0 or a.dtype == object:
        return head
    if a.dtype == np.bool_:
        return f"{head}  true {int(a.sum())} of {a.size}"
    f = a.astype(np.float64)
    first = np.array2string(a.reshape(-1)[:4], precision=4, separator=", ")
    return (f"{head}  min {f.min():.4g}  max {f.max():.4g}  mean {f.mean():.4g}  "
            f"first {first}")


def _ort_session(model: str):
    try:
        import onnxruntime as ort
    except ImportError:
        raise DeployError("comparing with ONNX Runtime needs it: pip install onnxruntime") from None
    if not Path(model).exists():
        raise DeployError(f"{model}: no such model file to compare against")
    try:
        return ort, ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001  (ORT raises its own exception types)
        raise DeployError(f"ONNX Runtime cannot load {model}: {' '.join(str(e).split())}") from None


def _check_against_ort(model: str, mod, inputs, outs, rtol: float | None,
                       atol: float | None) -> int:
    ort, sess = _ort_session(model)
    try:
        ref = sess.run(None, inputs)
    except Exception as e:  # noqa: BLE001
        raise DeployError(f"ONNX Runtime failed on {model}: {' '.join(str(e).split())}") from None
    half = mod.manifest.get("precision", {}).get("dtype", "fp32") != "fp32"
    rtol = rtol if rtol is not None else HALF_RTOL if half else 1e-3
    rule = f"{atol:g}" if atol is not None else "1e-2 * max|ort|" if half else "1e-4"
    print(f"check against ONNX Runtime {ort.__version__} on {model} "
          f"(pass: |deploy - ort| <= {rule} + {rtol:g} * |ort|):")
    failed = 0
    for spec, a, b in zip(mod.output_specs, outs, ref):
        b = np.asarray(b)
        tol = atol if atol is not None else _half_atol(b) if half else 1e-4
        ok, line = compare(a, b, rtol, tol)
        failed += not ok
        print(f"  {spec.name}: {line}  {'PASS' if ok else 'FAIL'}")
    if len(ref) != len(outs):
        failed += 1
        print(f"  output count differs: deploy {len(outs)}, ONNX Runtime {len(ref)}  FAIL")
    print("PASS" if not failed else "FAIL")
    if failed:
        print(f"deploy: check failed: {failed} output(s) differ from ONNX Runtime beyond "
              "tolerance", file=sys.stderr)
    return 1 if failed else 0


HALF_RTOL = 1e-2  # fp16/bf16 artifacts: about ten half-precision ulps


def _half_atol(ref: np.ndarray) -> float:
    """1e-2 of the output's largest finite magnitude (half precision rounds relative to it)."""
    if ref.size == 0 or not np.issubdtype(ref.dtype, np.floating):
        return 1e-4
    finite = np.abs(ref[np.isfinite(ref)])
    return 1e-2 * float(finite.max()) if finite.size else 1e-4


def compare(a: np.ndarray, b: np.ndarray, rtol: float, atol: float) -> tuple[bool, str]:
    """Whether ``a`` matches reference ``b`` (numpy.allclose rule; ints/bools exactly)."""
    if a.shape != b.shape:
        return False, f"shape {list(a.shape)} vs ONNX Runtime {list(b.shape)}"
    if a.dtype != b.dtype:
        return False, f"dtype {a.dtype} vs ONNX Runtime {b.dtype}"
    if a.size == 0 or not np.issubdtype(a.dtype, np.number) or np.issubdtype(a.dtype, np.integer):
        n = int(np.count_nonzero(a != b))
        return n == 0, f"{n} of {a.size} elements differ (exact comparison)"
    x, y = a.astype(np.float64), b.astype(np.float64)
    nan_ok = np.array_equal(np.isnan(x), np.isnan(y))
    fin = np.isfinite(x) & np.isfinite(y)
    err = np.abs(x - y)[fin]
    ref = np.abs(y)[fin]
    max_abs = float(err.max()) if err.size else 0.0
    big = ref > atol
    max_rel = float((err[big] / ref[big]).max()) if big.any() else 0.0
    ok = nan_ok and bool(np.all(np.isclose(x, y, rtol=rtol, atol=atol, equal_nan=True)))
    return ok, f"max abs err {max_abs:.3g}  max rel err {max_rel:.3g}"


def cmd_bench(args) -> int:
    from .runtime import load
    if args.artifact is None:  # `deploy bench --json A.dpk`: --json took the artifact's name
        if not isinstance(args.json, str):
            raise UsageError("bench: name the artifact to time: deploy bench ARTIFACT")
        args.artifact, args.json = args.json, True
    if args.profile:
        return _bench_profile(args)
    if args.flush_l2 or args.in_graph:
        raise UsageError(f"{'--flush-l2' if args.flush_l2 else '--in-graph'} goes with "
                         "--profile (GPU artifacts)")
    args.runs = 100 if args.runs is None else args.runs
    with _progress(args, tick=False) as progress:  # no thread beside the timed calls
        progress.begin("load")
        t0 = time.perf_counter()
        mod = load(args.artifact, threads=args.threads)
        inputs = _inputs(mod, args.inputs, args.seed, parse_dims(args.dim))
        progress.end("load", round(time.perf_counter() - t0, 4))
        results = {"deploy": _time(lambda: mod.run(inputs), args.warmup, args.runs,
                                   progress, "deploy")}
        if args.compare:
            model = _compare_model(args.compare, mod)
            _, sess = _ort_session(model)
            results["ort"] = _time(lambda: sess.run(None, inputs), args.warmup, args.runs,
                                   progress, "ort")
    if "ort" in results:
        results["speedup_vs_ort"] = round(results["ort"]["median_ms"] /
                                          results["deploy"]["median_ms"], 3)
    if args.json is True:
        print(json.dumps(results, indent=1))
        return 0
    if args.json:
        _write_json(args.json, results)
    print(f"{args.artifact}: {args.runs} runs after {args.warmup} warm-up runs")
    for name in ("deploy", "ort"):
        if name in results:
            r = results[name]
            print(f"  {name:<7} median {r['median_ms']:.3f} ms  p90 {r['p90_ms']:.3f} ms  "
                  f"min {r['min_ms']:.3f} ms  mean {r['mean_ms']:.3f} ms")
    if "speedup_vs_ort" in results:
        s = results["speedup_vs_ort"]
        print(f"  ratio   ORT median / deploy median = {s:.2f} "
              f"({'deploy faster' if s >= 1 else 'ORT faster'})")
    return 0


def _bench_profile(args) -> int:
    """`deploy bench --profile`: per-kernel times against each kernel's floor (bench/floor.py;
    GPU artifacts through bench/gpu_profile.py, CPU ones through bench/cpu_profile.py)."""
    from .bench.floor import format_report, profile_artifact
    for flag, given in (("--compare", args.compare), ("--inputs", args.inputs)):
        if given:
            raise UsageError(f"{flag} does not go with --profile (which times each kernel on "
                             "its own, on random inputs)")
    runs = 20 if args.runs is None else args.runs
    if runs < 1 or args.top < 1:
        raise UsageError(f"--runs and --top must be >= 1, got {runs} and {args.top}")
    dims = parse_dims(args.dim)
    bad = [k for k, v in dims.items() if not isinstance(v, int)]
    if bad:
        raise UsageError(f"--dim {bad[0]}: give one size (NAME=N) to profile at")
    res = profile_artifact(args.artifact, dims, runs, threads=args.threads,
                           flush_l2=args.flush_l2, in_graph=args.in_graph)
    if args.json is True:
        print(json.dumps(res, indent=1))
        return 0
    if args.json:
        _write_json(args.json, res)
    print(format_report(res, args.top))
    return 0


def _write_json(path: str, data) -> None:
    try:
        Path(path).write_text(json.dumps(data, indent=1))
    except OSError as e:
        raise UsageError(f"--json {path}: cannot write it ({e.strerror or e})") from None


def _compare_model(compare: list[str], mod) -> str:
    if compare[0].lower() != "ort" or len(compare) > 2:
        raise UsageError(f"--compare {' '.join(compare)}: expected `--compare ort [MODEL.onnx]`")
    if len(compare) == 2:
        return compare[1]
    source = mod.manifest.get("provenance", {}).get("source", "")
    if source.endswith(".onnx") and Path(source).exists():
        return source
    raise UsageError("--compare ort: name the ONNX model to time (`--compare ort MODEL.onnx`); "
                     f"the artifact's source {source!r} is not an .onnx file here")


def _time(fn, warmup: int, runs: int, progress: Progress | None = None,
          stage: str = "deploy") -> dict:
    """Latency figures of ``fn`` (ms); ``progress`` hears of the runs (stage ``stage``, steps
    ``warmup`` and ``runs``), between the timed calls."""
    if runs < 1 or warmup < 0:
        raise UsageError(f"--runs must be >= 1 and --warmup >= 0, got {runs} and {warmup}")
    progress = progress or Progress()
    start = last = time.perf_counter()
    progress.begin(stage)

    def tick(step: str, done: int, total: int) -> None:  # at most 10 a second: little noise
        nonlocal last
        now = time.perf_counter()
        if done in (0, total) or now - last >= 0.1:
            progress.count(step, done, total, unit="runs")
            last = now

    for i in range(warmup):
        tick("warmup", i, warmup)
        fn()
    ts = []
    for i in range(runs):
        tick("runs", i, runs)
        t0 = time.perf_counter_ns()
        fn()
        ts.append((time.perf_counter_ns() - t0) / 1e6)
    tick("runs", runs, runs)
    progress.end(stage, round(time.perf_counter() - start, 4))
    t = np.array(ts)
    return {"median_ms": round(float(np.median(t)), 4),
            "p90_ms": round(float(np.percentile(t, 90)), 4),
            "min_ms": round(float(t.min()), 4), "mean_ms": round(float(t.mean()), 4),
            "runs": runs}


# ---- inspect / targets ----------------------------------------------------------------------

def cmd_inspect(args) -> int:
    from .runtime.artifact import read_artifact
    contents = read_artifact(args.artifact)
    report = inspect_report(args.artifact, contents)
    if args.html:
        from .html_report import write_html
        out, note = write_html(args.artifact, args.html, report, contents.manifest,
                               args.profile, args.runs)
        print(f"wrote {out} ({report['kernel_count']} kernels, "
              f"{len(contents.manifest.get('steps', []))} steps; {note})")
    elif args.profile:
        raise UsageError("--profile goes with --html (it adds kernel times to the page)")
    elif args.json:
        print(json.dumps(report, indent=1))
    else:
        _print_inspect(report)
    return 0


def inspect_report(path: str, contents) -> dict:
    """Everything `deploy inspect` shows, as plain data (the --json output)."""
    m, members = contents.manifest, contents.members
    steps = {s.get("symbol"): s for s in m.get("steps", []) if s.get("kind") == "kernel"}
    kernels = [{"symbol": k["symbol"], "node": steps.get(k["symbol"], {}).get("node"),
                "op": steps.get(k["symbol"], {}).get("op"), "hash": k.get("hash"),
                "note": k.get("note", ""), "tuned": bool(k.get("tuned", False)),
                "codegen": k.get("codegen"), "schedule": k.get("schedule", [])}
               for k in m.get("kernels", [])]
    weights = {n: len(b) for n, b in members.items() if n.startswith("weights/")}
    memory = _memory(m)
    return {
        "artifact": str(path), "bytes": Path(path).stat().st_size,
        "format_version": m.get("format_version"), "deploy_version": m.get("deploy_version"),
        "target": m.get("target", {}), "inputs": m.get("inputs", []),
        "outputs": m.get("outputs", []), "kernel_count": m.get("kernel_count", len(kernels)),
        "kernels": kernels, "host_ops": m.get("host_ops", []),
        "arena_bytes": memory["arena_bytes"], "memory": memory,
        "binaries": [{"name": n, "bytes": len(b)} for n, b in sorted(members.items())
                     if not n.startswith("weights/")],
        "weights": {"count": len(weights), "bytes": sum(weights.values())},
        "provenance": m.get("provenance", {}), "compile_seconds": m.get("compile_seconds", {}),
        "passes": m.get("passes", []), "precision": m.get("precision"),
        "symbols": m.get("dims", {}), "constraints": m.get("constraints", []),
        "gpu_codegen": m.get("gpu", {}).get("codegen"),
    }


def _int8_str(k: dict) -> str:
    """``  int8 avx2`` for a kernel that runs an integer contraction template, else ''."""
    names = [s.get("template", "") for s in k.get("schedule", [])]
    return "".join(f"  {n}" for n in names if n.startswith("int8"))


def _print_symbols(r: dict) -> None:
    """Symbolic dims with their ranges, and those bound for the whole artifact (and why)."""
    dims = r.get("symbols", {})
    if dims:
        print("symbols:  " + ", ".join(f"{k} in {lo}..{hi if hi is not None else ''}"
                                       for k, (lo, hi) in dims.items())
              + " (any size in range runs; kernels take them as arguments)")
    for s, b in r["provenance"].get("bound_symbols", {}).items():
        print(f"bound:    {s}={b['value']} for the whole artifact: {b['reason']}")


def _memory(m: dict) -> dict:
    """The artifact's memory plan; without one, the sum of intermediate tensor bytes."""
    values = m.get("values", {})
    planned = dict(m.get("memory", {}))
    planned.pop("offsets", None)
    outputs = set(m.get("output_ids", []))
    produced = {v for s in m.get("steps", []) if s.get("kind") != "view" for v in s["outputs"]}
    inter = sum(_nbytes(values[str(v)]) for v in produced - outputs if str(v) in values)
    planned.setdefault("intermediate_bytes", inter)
    planned.setdefault("arena_bytes", inter)
    planned.setdefault("planned", "memory" in m)
    return planned


def _nbytes(v: dict) -> int:
    n = 1
    for d in v["shape"]:
        n *= d if isinstance(d, int) else 1
    return n * storage_dtype(v["dtype"]).itemsize  # (float8 and others: ml_dtypes' names)


def _codegen_summary(r: dict) -> str:
    """`` (--gpu-codegen auto: 12 cuda, 40 triton)`` for GPU artifacts."""
    counts: dict[str, int] = {}
    for k in r["kernels"]:
        if k.get("codegen"):
            counts[k["codegen"]] = counts.get(k["codegen"], 0) + 1
    if not counts:
        return ""
    return (f" (--gpu-codegen {r.get('gpu_codegen') or 'triton'}: "
            + ", ".join(f"{n} {c}" for c, n in sorted(counts.items())) + ")")


def _print_inspect(r: dict) -> None:
    t = r["target"]
    print(f"artifact: {r['artifact']} ({_fmt_bytes(r['bytes'])}, format {r['format_version']}, "
          f"deploy {r['deploy_version']})")
    print(f"target:   {t.get('name')} ({t.get('kind')}, backend {t.get('backend')}, "
          f"arch {t.get('arch')})")
    for kind in ("inputs", "outputs"):
        print(f"{kind + ':':<9} " + ", ".join(_spec_str(s) for s in r[kind]))
    print(f"kernels:  kernel_count {r['kernel_count']}" + _codegen_summary(r))
    for k in r["kernels"]:
        print(f"  {k['symbol']:<6} {k['op'] or '?':<14} node '{k['node']}'  hash {k['hash']}"
              + (f"  {k['codegen']}" if k.get("codegen") else "") + _int8_str(k)
              + ("  tuned" if k["tuned"] else "") + (f"  ({k['note']})" if k["note"] else ""))
    print(f"host ops: {', '.join(r['host_ops']) or 'none (every op runs as generated code)'}")
    if r.get("precision"):
        print("precision: " + _precision_str(r["precision"]))
    mem = r["memory"]
    print(f"memory:   arena_bytes {r['arena_bytes']} ({_fmt_bytes(r['arena_bytes'])}), "
          f"intermediates {_fmt_bytes(mem['intermediate_bytes'])}, weights "
          f"{_fmt_bytes(r['weights']['bytes'])} in {r['weights']['count']} arrays")
    print("binaries: " + (", ".join(f"{b['name']} ({_fmt_bytes(b['bytes'])})"
                                    for b in r["binaries"]) or "none"))
    prov = r["provenance"]
    print(f"source:   {prov.get('source')} (opset {prov.get('opset')}), bound dims "
          f"{prov.get('bound_dims', {})}")
    _print_symbols(r)
    hist = prov.get("op_histogram", {})
    if hist:
        print("ops:      " + ", ".join(f"{op} x{n}" for op, n in hist.items()))
    print("compile:  " + ", ".join(f"{k} {v:.3f}s" for k, v in _stages(r["compile_seconds"]))
          + (f" (tuned: {r['compile_seconds']['tune_gain']:.2f}x the default schedules)"
             if "tune_gain" in r["compile_seconds"] else ""))
    for p in r["passes"]:
        extra = ", ".join(f"{k} {v}" for k, v in p.items()
                          if k not in ("pass", "nodes_before", "nodes_after", "seconds"))
        print(f"  pass {p.get('pass', '?'):<12} nodes {p.get('nodes_before')} -> "
              f"{p.get('nodes_after')}  {p.get('seconds', 0):.4f}s" + (f"  {extra}" if extra else ""))


STAGE_ORDER = ("import", "optimize", "lower", "tune", "render+build", "package", "check")
NOT_STAGES = {"tune_gain"}  # figures stored beside the stage times


def _stages(seconds: dict) -> list[tuple[str, float]]:
    """Compile stages in pipeline order (the manifest's JSON keys are sorted)."""
    rank = {k: i for i, k in enumerate(STAGE_ORDER)}
    return sorted(((k, v) for k, v in seconds.items() if k not in NOT_STAGES),
                  key=lambda kv: rank.get(kv[0], len(rank)))


def cmd_targets(args) -> int:
    from .targets import list_targets, load_target
    if args.action == "show":
        t = load_target(args.name)
        d = dict(t.to_dict(), source=t.source)
        if args.json:
            print(json.dumps(d, indent=1))
        else:
            width = max(map(len, d))
            for k, v in d.items():
                if v not in ("", 0, 0.0, [], {}):
                    print(f"{k:<{width}}  {v}")
        return 0
    targets = [load_target(n) for n in list_targets()]
    if args.json:
        print(json.dumps([t.to_dict() for t in targets], indent=1))
        return 0
    print(f"{'name':<15} {'kind':<4} {'backend':<7} {'arch':<10} description")
    for t in targets:
        print(f"{t.name:<15} {t.kind:<4} {t.backend:<7} {t.arch:<10} {t.description}")
    print("\n`deploy targets show NAME` describes one; --target also accepts a YAML file path.")
    return 0


# ---- formatting -----------------------------------------------------------------------------

def _spec_str(s: dict) -> str:
    return f"{s['name']}: {s['dtype']}[{', '.join(dim_text(d) for d in s['shape'])}]"


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"
