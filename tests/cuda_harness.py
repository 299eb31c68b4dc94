"""Build here, run on a GPU machine: checks of the CUDA C code generator (backends/cuda).

    python -m tests.cuda_harness build DIR [--only NAME,...]   # here: NVRTC, no GPU needed
    python3 -m tests.cuda_harness run DIR                        # on the GPU: no NVRTC, no triton

``build`` compiles each case with ``gpu_codegen="cuda"`` into ``DIR/<case>.dpk`` and stores its
inputs and reference outputs (ONNX Runtime, or numpy where ORT has no kernel) in
``DIR/<case>.npz``; timing cases (``PERF``) are compiled with Triton too and carry no data (their
inputs are drawn on the GPU machine from a seed). ``run`` loads each artifact with
``deploy.load`` (the CUDA driver API through ctypes), compares with the reference (relative L2
error; integer outputs exactly) and, for timing cases, compares the two code generators'
outputs and their CUDA-graph replay times (CUDA events, L2 flushed). It also tries to load the
``probe_*`` images (NVRTC's cubin and PTX) directly, to show which the installed driver takes.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

FP32_TOL = 1e-5  # relative L2 error, fp32
FP16_TOL = 2e-3  # relative L2 error, fp16 / bf16 outputs (or fp16 compiles of fp32 models)
MODELS = Path(__file__).resolve().parent.parent / "bench" / ".models"


@dataclass
class Case:
    name: str
    model: object  # onnx.ModelProto or a path
    feed: dict
    tol: float = FP32_TOL
    options: dict = field(default_factory=dict)  # compile options besides the code generator
    ref: list | None = None  # reference outputs; None: ONNX Runtime's


def _rng(seed: int = 0):
    return np.random.default_rng(seed)


def _rand(rng, *shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def _f32(x):
    return np.asarray(x, np.float32)


# ---- correctness cases -------------------------------------------------------------------------

def check_cases() -> list[Case]:
    """Small graphs covering every template and the scalar ops, then the tiny zoo models."""
    from onnx import TensorProto

    from tests.util import helper, make_model
    r = _rng(1)
    node = helper.make_node
    out: list[Case] = []

    def one(name, nodes, inputs, outputs, feed, inits=(), tol=FP32_TOL, ref=None, **options):
        out.append(Case(name, make_model(nodes, inputs, outputs, dict(inits)), feed, tol,
                        options, ref))

    f32, f16, i64 = np.float32, np.float16, np.int64
    x = _rand(r, 3, 5, 7)
    one("ew_chain", [node("Add", ["x", "b"], ["s"]), node("Sigmoid", ["s"], ["g"]),
                     node("Mul", ["g", "x"], ["y"]), node("Tanh", ["y"], ["z"])],
        [("x", f32, [3, 5, 7]), ("b", f32, [5, 1])], [("z", f32, [3, 5, 7])],
        {"x": x, "b": _rand(r, 5, 1)})
    a = r.integers(-50, 50, 40).astype(np.int32)
    b = r.choice([-7, -3, 2, 5], 40).astype(np.int32)
    one("int_divmod", [node("Div", ["a", "b"], ["q"]), node("Mod", ["a", "b"], ["m"])],
        [("a", np.int32, [40]), ("b", np.int32, [40])],
        [("q", np.int32, [40]), ("m", np.int32, [40])], {"a": a, "b": b})
    u = _rand(r, 1000)
    unary = ["Erf", "Exp", "Floor", "Round", "Sign", "Abs", "Neg", "Ceil", "Sin", "Cos", "Atan"]
    nodes = [node(op, ["u"], [f"o{k}"]) for k, op in enumerate(unary)]
    nodes += [node("Abs", ["u"], ["au"]), node("Log", ["au"], ["lg"]),
              node("Sqrt", ["au"], ["sq"]), node("Reciprocal", ["u"], ["rc"]),
              node("Pow", ["u", "two"], ["pw"]), node("Max", ["u", "nanv"], ["mx"])]
    names = [f"o{k}" for k in range(len(unary))] + ["lg", "sq", "rc", "pw", "mx"]
    nanv = u.copy()
    nanv[::7] = np.nan
    one("unary_ops", nodes, [("u", f32, [1000]), ("nanv", f32, [1000])],
        [(n, f32, [1000]) for n in names], {"u": u, "nanv": nanv},
        inits={"two": np.array(2.0, f32)})
    x = _rand(r, 4, 37, 6)
    one("reduce_axes", [node("ReduceSum", ["x", "axes"], ["s"], keepdims=0),
                        node("ReduceMax", ["x"], ["m"], axes=[0, 2], keepdims=1),
                        node("ArgMax", ["x"], ["i"], axis=1, keepdims=0)],
        [("x", f32, [4, 37, 6])],
        [("s", f32, [4, 6]), ("m", f32, [1, 37, 1]), ("i", i64, [4, 6])], {"x": x},
        inits={"axes": np.array([1], i64)})
    for name, shape in (("softmax_rows", [64, 1000]), ("softmax_long", [8, 5000])):
        one(name, [node("Softmax", ["x"], ["y"], axis=-1)], [("x", f32, shape)],
            [("y", f32, shape)], {"x": 3 * _rand(r, *shape)})
    xs = _rand(r, 64, 300).astype(f16)
    one("softmax_fp16", [node("Softmax", ["x"], ["y"], axis=-1)], [("x", f16, [64, 300])],
        [("y", f16, [64, 300])], {"x": xs}, tol=FP16_TOL, ref=[_softmax(_f32(xs))])
    one("layernorm", [node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1,
                           epsilon=1e-5)],
        [("x", f32, [128, 768])], [("y", f32, [128, 768])], {"x": _rand(r, 128, 768)},
        inits={"g": _rand(r, 768), "b": _rand(r, 768)})
    for name, (m, k, n), dt, tol in (("matmul_f32", (100, 70, 50), f32, FP32_TOL),
                                     ("matmul_f32_tiles", (300, 256, 200), f32, FP32_TOL),
                                     ("matmul_f16", (200, 96, 136), f16, FP16_TOL),
                                     ("matmul_f16_tiles", (512, 256, 384), f16, FP16_TOL)):
        xa, wb = _rand(r, m, k).astype(dt), (_rand(r, k, n) / 8).astype(dt)
        ref = None if dt == f32 else [(_f32(xa) @ _f32(wb)).astype(f16)]
        one(name, [node("MatMul", ["x", "w"], ["y"])], [("x", dt, [m, k])], [("y", dt, [m, n])],
            {"x": xa}, inits={"w": wb}, tol=tol, ref=ref)
    xa, xb = _rand(r, 4, 33, 40), _rand(r, 4, 40, 24)
    one("matmul_batched", [node("MatMul", ["a", "b"], ["y"])],
        [("a", f32, [4, 33, 40]), ("b", f32, [4, 40, 24])], [("y", f32, [4, 33, 24])],
        {"a": xa, "b": xb})
    xa, w, bias = _rand(r, 64, 128).astype(f16), _rand(r, 96, 128) / 8, _rand(r, 96)
    w, bias = w.astype(f16), bias.astype(f16)
    ref = np.maximum(_f32(xa) @ _f32(w).T + _f32(bias), 0).astype(f16)
    one("gemm_bias_relu_f16", [node("Gemm", ["x", "w", "c"], ["g"], transB=1),
                               node("Relu", ["g"], ["y"])],
        [("x", f16, [64, 128])], [("y", f16, [64, 96])], {"x": xa},
        inits={"w": w, "c": bias}, tol=FP16_TOL, ref=[ref])
    for name, dt, group, cin in (("conv_f32", f32, 1, 8), ("conv_f16", f16, 1, 8),
                                 ("conv_depthwise", f32, 16, 16)):
        xc = _rand(r, 2, cin, 17, 17).astype(dt)
        wc = (_rand(r, 16, cin // group, 3, 3) / 4).astype(dt)
        convs = [node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2], group=group),
                 node("Relu", ["c"], ["y"])]
        ref = None if dt == f32 else [_conv_relu_ref(xc, wc)]
        one(name, convs, [("x", dt, [2, cin, 17, 17])], [("y", dt, [2, 16, 9, 9])], {"x": xc},
            inits={"w": wc}, tol=FP32_TOL if dt == f32 else FP16_TOL, ref=ref)
    xp = _rand(r, 2, 8, 12, 12)
    one("pools", [node("MaxPool", ["x"], ["p"], kernel_shape=[3, 3], strides=[2, 2],
                       pads=[1, 1, 1, 1]), node("GlobalAveragePool", ["p"], ["y"])],
        [("x", f32, [2, 8, 12, 12])], [("p", f32, [2, 8, 6, 6]), ("y", f32, [2, 8, 1, 1])],
        {"x": xp})
    table, ids = _rand(r, 50, 16), r.integers(0, 50, (3, 7)).astype(i64)
    one("gather_rows", [node("Gather", ["t", "i"], ["y"], axis=0)],
        [("t", f32, [50, 16]), ("i", i64, [3, 7])], [("y", f32, [3, 7, 16])],
        {"t": table, "i": ids})
    data, idx, upd = _rand(r, 10, 6), r.integers(0, 10, (8, 6)).astype(i64), _rand(r, 8, 6)
    one("scatter_add", [node("ScatterElements", ["d", "i", "u"], ["y"], axis=0,
                             reduction="add")],
        [("d", f32, [10, 6]), ("i", i64, [8, 6]), ("u", f32, [8, 6])], [("y", f32, [10, 6])],
        {"d": data, "i": idx, "u": upd})
    one("cumsum", [node("CumSum", ["x", "ax"], ["y"])], [("x", f32, [5, 40])],
        [("y", f32, [5, 40])], {"x": _rand(r, 5, 40)}, inits={"ax": np.array(1, i64)})
    xt, yt = _rand(r, 3, 4, 5), _rand(r, 3, 2, 5)
    one("movement", [node("Transpose", ["x"], ["t"], perm=[2, 0, 1]),
                     node("Concat", ["x", "y"], ["c"], axis=1),
                     node("Slice", ["c", "st", "en", "axes"], ["s"])],
        [("x", f32, [3, 4, 5]), ("y", f32, [3, 2, 5])],
        [("t", f32, [5, 3, 4]), ("s", f32, [3, 3, 5])], {"x": xt, "y": yt},
        inits={"st": np.array([1], i64), "en": np.array([4], i64), "axes": np.array([1], i64)})
    xs, ws = _rand(r, 5, 64), _rand(r, 64, 48)
    one("symbolic_batch", [node("MatMul", ["x", "w"], ["m"]), node("Softmax", ["m"], ["y"])],
        [("x", f32, ["batch", 64])], [("y", f32, ["batch", 48])], {"x": xs}, inits={"w": ws})
    xb = _rand(r, 96, 64)
    wb = _rand(r, 64, 80) / 8
    bf = _bf16_round
    one("matmul_bf16", [node("Cast", ["x"], ["xb"], to=TensorProto.BFLOAT16),
                        node("Cast", ["w"], ["wb"], to=TensorProto.BFLOAT16),
                        node("MatMul", ["xb", "wb"], ["yb"]),
                        node("Cast", ["yb"], ["y"], to=TensorProto.FLOAT)],
        [("x", f32, [96, 64])], [("y", f32, [96, 80])], {"x": xb}, inits={"w": wb},
        tol=FP16_TOL, ref=[bf(bf(xb) @ bf(wb))])
    from tests.attention_graphs import attention_model, qkv
    for dt, (b, h, sq, sk, d) in ((f32, (2, 3, 20, 24, 16)), (f16, (2, 4, 64, 64, 64))):
        feed = qkv(b, h, sq, sk, d, dtype=dt)
        ref = None if dt == f32 else [_attention_f16(feed)]
        out.append(Case(f"attention_{np.dtype(dt).name}", attention_model(b, h, sq, sk, d,
                                                                          dtype=dt),
                        feed, FP32_TOL if dt == f32 else FP16_TOL, {}, ref))
    for case in [c for c in out if c.name in ("matmul_f16", "softmax_rows")]:
        out.append(Case(case.name + "_a100", case.model, case.feed, case.tol,
                        {"target": "a100"}, case.ref))  # sm_80 binaries: the PTX path on sm_90
    out += zoo_cases()
    return out


def zoo_cases() -> list[Case]:
    """The tiny exports in bench/.models (fp32; fp16 compiles of two), where present."""
    out = []
    for path in sorted(MODELS.glob("*-tiny-*.onnx")):
        meta = json.loads(path.with_suffix(".json").read_text())
        feed = _model_feed(meta)
        name = f"zoo_{meta['name']}{'_dyn' if meta.get('dynamic') else ''}"
        out.append(Case(name, str(path), feed))
        if meta["name"] in ("resnet50", "bert_base") and not meta.get("dynamic"):
            out.append(Case(name + "_fp16", str(path), feed, 1e-2, {"dtype": "fp16"}))
    return out


def _model_feed(meta: dict) -> dict:
    from deploy.bench.models import InputSpec, random_inputs
    specs = [InputSpec(s["name"], tuple(s["shape"]), s["dtype"], s["kind"], s["high"])
             for s in meta["inputs"]]
    return random_inputs(specs, _rng(5))


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)).astype(np.float16)


def _attention_f16(feed):
    """softmax(q k^T / sqrt(d)) v, rounded to fp16 after each ONNX node as the model does."""
    h = np.float16
    q, k, v = (_f32(feed[n]) for n in "qkv")
    s = (q @ k.swapaxes(-1, -2)).astype(h)
    s = (_f32(s) * _f32(np.array(1 / np.sqrt(q.shape[-1]), np.float32).astype(h))).astype(h)
    return (_f32(_softmax(_f32(s))) @ v).astype(h)


def _bf16_round(x):
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32)


def _conv_relu_ref(x, w):
    """stride 2, pad 1, 3x3, one group, fp32 math, fp16 result."""
    x, w = _f32(x), _f32(w)
    _, c, h, wd = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    oh, ow = (h + 2 - 3) // 2 + 1, (wd + 2 - 3) // 2 + 1
    cols = np.stack([xp[:, :, i:i + 2 * oh:2, j:j + 2 * ow:2] for i in range(3) for j in range(3)],
                    axis=2)  # n, c, 9, oh, ow
    y = np.einsum("ncpxy,ocp->noxy", cols, w.reshape(w.shape[0], c, 9))
    return np.maximum(y, 0).astype(np.float16)


# ---- timing cases ------------------------------------------------------------------------------

PERF = {  # name -> (nodes spec, inputs {name: shape, dtype}); inputs drawn on the GPU machine
    "perf_softmax_4096x1024": ("softmax", {"x": ([4096, 1024], "float32")}),
    "perf_layernorm_8192x1024": ("layernorm", {"x": ([8192, 1024], "float32")}),
    "perf_gelu_16M": ("gelu", {"x": ([4096, 4096], "float32")}),
    "perf_reducesum_mid_256x512x256": ("reduce_mid", {"x": ([256, 512, 256], "float32")}),
    "perf_matmul_f16_4096": ("matmul", {"a": ([4096, 4096], "float16"),
                                        "b": ([4096, 4096], "float16")}),
    "perf_matmul_f32_2048": ("matmul", {"a": ([2048, 2048], "float32"),
                                        "b": ([2048, 2048], "float32")}),
    "perf_matmul_f16_128x768x3072": ("matmul", {"a": ([128, 768], "float16"),
                                                "b": ([768, 3072], "float16")}),
    "perf_bmm_f16_96x512x64x512": ("matmul", {"a": ([96, 512, 64], "float16"),
                                              "b": ([96, 64, 512], "float16")}),
    "perf_conv3x3_f16_32x64x56x56": ("conv", {"x": ([32, 64, 56, 56], "float16")}),
    "perf_softmax_f16_8192x512": ("softmax", {"x": ([8192, 512], "float16")}),
}


def perf_model(kind: str, inputs: dict):
    from tests.util import helper, make_model
    node = helper.make_node
    specs = [(n, np.dtype(dt), shape) for n, (shape, dt) in inputs.items()]
    first = specs[0]
    if kind == "matmul":
        (_, dt, (*batch, m, _)), (_, _, (*_, n)) = specs
        return make_model([node("MatMul", ["a", "b"], ["y"])], specs,
                          [("y", dt, [*batch, m, n])])
    if kind == "conv":
        n, c, h, w = first[2]
        weight = (_rand(_rng(2), c, c, 3, 3) / 24).astype(first[1])
        return make_model([node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], specs,
                          [("y", first[1], [n, c, h, w])], {"w": weight})
    if kind == "softmax":
        return make_model([node("Softmax", ["x"], ["y"], axis=-1)], specs,
                          [("y", first[1], first[2])])
    if kind == "layernorm":
        d = first[2][-1]
        return make_model([node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1)], specs,
                          [("y", first[1], first[2])],
                          {"g": np.ones(d, np.float32), "b": np.zeros(d, np.float32)})
    if kind == "gelu":
        nodes = [node("Mul", ["x", "c"], ["s"]), node("Erf", ["s"], ["e"]),
                 node("Add", ["e", "one"], ["p"]), node("Mul", ["x", "p"], ["q"]),
                 node("Mul", ["q", "half"], ["y"])]
        consts = {"c": np.array(0.7071067, np.float32), "one": np.array(1.0, np.float32),
                  "half": np.array(0.5, np.float32)}
        return make_model(nodes, specs, [("y", first[1], first[2])], consts)
    if kind == "reduce_mid":
        a, _, c = first[2]
        return make_model([node("ReduceSum", ["x", "ax"], ["y"], keepdims=0)], specs,
                          [("y", first[1], [a, c])], {"ax": np.array([1], np.int64)})
    raise ValueError(kind)


def perf_feed(inputs: dict) -> dict:
    r = _rng(11)
    return {n: r.standard_normal(shape).astype(dt) for n, (shape, dt) in inputs.items()}


# ---- build (here) ------------------------------------------------------------------------------

def build(out: Path, only: set[str] | None = None, target: str = "h100") -> None:
    import deploy
    out.mkdir(parents=True, exist_ok=True)
    index = {"check": {}, "perf": {}, "failed": {}}
    for case in check_cases():
        if only and case.name not in only:
            continue
        t0 = time.time()
        try:
            options = {"target": target, **case.options}
            art = deploy.compile(case.model, gpu_codegen="cuda", **options)
            art.save(out / f"{case.name}.dpk")
            ref = case.ref if case.ref is not None else _ort(case.model, case.feed)
            np.savez(out / f"{case.name}.npz", **{f"in_{k}": v for k, v in case.feed.items()},
                     **{f"ref_{k}": np.asarray(v) for k, v in enumerate(ref)})
            index["check"][case.name] = {"tol": case.tol, "templates": _templates(art)}
            print(f"built {case.name} ({time.time() - t0:.1f} s): {_templates(art)}", flush=True)
        except Exception as e:  # noqa: BLE001  (report every case)
            index["failed"][case.name] = f"{type(e).__name__}: {e}"[:4000]
            print(f"FAILED {case.name}: {type(e).__name__}: {str(e)[:2000]}", flush=True)
    for name, (kind, inputs) in PERF.items():
        if only and name not in only:
            continue
        model = perf_model(kind, inputs)
        entry = {"inputs": {n: [s, d] for n, (s, d) in inputs.items()}}
        for codegen in ("cuda", "triton"):
            try:
                art = deploy.compile(model, target=target, gpu_codegen=codegen)
                art.save(out / f"{name}.{codegen}.dpk")
                entry[codegen] = _templates(art)
            except Exception as e:  # noqa: BLE001
                entry[codegen] = f"FAILED {type(e).__name__}: {e}"[:2000]
        index["perf"][name] = entry
        print(f"built {name}: {entry}", flush=True)
    (out / "index.json").write_text(json.dumps(index, indent=1))


def _templates(art) -> list[str]:
    return [s["template"] for k in art.manifest["kernels"] for s in k["schedule"]]


def _ort(model, feed):
    from tests.util import run_ort
    return run_ort(model, feed)


# ---- run (on the GPU machine) ------------------------------------------------------------------

def rel_l2(ours, ref) -> float:
    a, b = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    if a.shape != b.shape:
        return float("inf")
    if not np.issubdtype(np.asarray(ref).dtype, np.floating):
        return 0.0 if np.array_equal(a, b) else float("inf")
    same_nan = np.isnan(a) == np.isnan(b)
    if not same_nan.all():
        return float("nan")
    a, b = np.nan_to_num(a), np.nan_to_num(b)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


CASE_SECONDS = 60  # a case still running after this is reported hung (its process ends)


def run(d: Path) -> int:
    """Every case of ``d`` in a child process; a case that hangs or crashes it is reported and
    the next child goes on after it."""
    import subprocess
    items = _items(d)
    start, fails = 0, 0
    while start < len(items):
        proc = subprocess.Popen([sys.executable, "-m", "tests.cuda_harness", "child", str(d),
                                 "--start", str(start)], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        current = start
        for line in proc.stdout:
            if line.startswith("@case "):
                current = int(line.split()[1])
                continue
            fails += line.startswith("FAIL")
            print(line, end="", flush=True)
        if proc.wait() == 0:
            break
        print(f"FAIL {items[current][1]}: hung or crashed (exit {proc.returncode})", flush=True)
        fails += 1
        start = current + 1
    print(f"{fails} failure(s)")
    return 1 if fails else 0


def _items(d: Path) -> list[tuple[str, str]]:
    index = json.loads((d / "index.json").read_text())
    return ([("check", n) for n in index["check"]] + [("failed", n) for n in index["failed"]]
            + [("perf", n) for n in index["perf"]] + [("probe", "probe")])


def child(d: Path, start: int) -> None:
    import faulthandler
    index = json.loads((d / "index.json").read_text())
    for k, (kind, name) in enumerate(_items(d)):
        if k < start:
            continue
        print(f"@case {k}", flush=True)
        faulthandler.dump_traceback_later(CASE_SECONDS, exit=True)
        if kind == "check":
            _check(d, name, index["check"][name])
        elif kind == "failed":
            print(f"FAIL {name} (did not build): {index['failed'][name][:300]}")
        elif kind == "perf":
            _perf(d, name, index["perf"][name])
        else:
            _probe(d)
        faulthandler.cancel_dump_traceback_later()


def _check(d: Path, name: str, info: dict) -> None:
    import deploy
    try:
        data = np.load(d / f"{name}.npz")
        feed = {k[3:]: data[k] for k in data.files if k.startswith("in_")}
        refs = [data[f"ref_{k}"] for k in range(sum(k.startswith("ref_") for k in data.files))]
        mod = deploy.load(d / f"{name}.dpk")
        outs = mod.run(feed)
        errs = [rel_l2(o, r) for o, r in zip(outs, refs)]
        ok = len(outs) == len(refs) and all(e <= info["tol"] for e in errs)
        print(f"{'ok  ' if ok else 'FAIL'} {name}: rel L2 {max(errs):.2e} (tol {info['tol']:g})"
              f" {sorted(set(info['templates']))}", flush=True)
        if not ok:
            print(f"      per output: {[f'{e:.2e}' for e in errs]}", flush=True)
    except Exception as e:  # noqa: BLE001
        print(f"FAIL {name}: {type(e).__name__}: {str(e)[:1500]}", flush=True)
        traceback.print_exc(limit=3)


def _perf(d: Path, name: str, info: dict) -> None:
    import deploy
    from deploy.bench.gpu import _replay_ms
    feed = perf_feed({n: (tuple(s), dt) for n, (s, dt) in info["inputs"].items()})
    outs, times = {}, {}
    for codegen in ("cuda", "triton"):
        path = d / f"{name}.{codegen}.dpk"
        if not path.exists():
            continue
        try:
            mod = deploy.load(path)
            outs[codegen] = mod.run(feed)[0]
            times[codegen] = _replay_ms(mod)
        except Exception as e:  # noqa: BLE001
            print(f"FAIL {name} [{codegen}]: {type(e).__name__}: {str(e)[:800]}", flush=True)
    err = rel_l2(outs["cuda"], outs["triton"]) if len(outs) == 2 else float("nan")
    fmt = {k: (f"{v:.4f} ms" if v is not None else "n/a") for k, v in times.items()}
    ok = len(outs) == 2 and err <= 2e-3
    print(f"{'perf' if ok else 'FAIL'} {name}: cuda {fmt.get('cuda')} triton {fmt.get('triton')} "
          f"(cuda vs triton rel L2 {err:.1e}) {info.get('cuda')}", flush=True)


def _probe(d: Path) -> None:
    """Load each probe image with cuModuleLoadData and say what the driver answered."""
    import ctypes

    from deploy.runtime.cuda_driver import CudaDevice
    dev = CudaDevice()
    version = ctypes.c_int()
    dev.lib.cuDriverGetVersion(ctypes.byref(version))
    print(f"driver CUDA version {version.value}, device sm_{dev.capability}")
    for path in sorted(d.glob("probe_*")):
        data = path.read_bytes() + (b"\0" if path.suffix == ".ptx" else b"")
        module = ctypes.c_void_p()
        buf = ctypes.create_string_buffer(data, len(data))
        result = dev.lib.cuModuleLoadData(ctypes.byref(module), buf)
        print(f"probe {path.name}: {'loads' if result == 0 else dev.error_text(result)}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("action", choices=["build", "run", "child"])
    p.add_argument("dir", type=Path)
    p.add_argument("--only", default="")
    p.add_argument("--target", default="h100")
    p.add_argument("--start", type=int, default=0)
    a = p.parse_args(argv)
    if a.action == "build":
        build(a.dir, set(filter(None, a.only.split(","))) or None, a.target)
        return 0
    if a.action == "child":
        child(a.dir, a.start)
        return 0
    return run(a.dir)


if __name__ == "__main__":
    sys.exit(main())
