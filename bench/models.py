"""Real models built from ``transformers`` configs with seeded random weights, exported to ONNX.

Nothing is downloaded: each model is the architecture of a public checkpoint (its config class's
defaults, e.g. ``ResNetConfig()`` is microsoft/resnet-50) with weights drawn after
``torch.manual_seed(SEED)``. ``--tiny`` variants keep every op kind but use few layers and small
widths, for fast tests. Exported files are cached under ``bench/.models/`` (gitignored by a
``.gitignore`` the cache writes into itself), keyed by everything that changes the file.
``--dynamic`` (``model_path(..., dynamic=True)``) exports with ONNX dynamic axes: inputs
``[batch, seq]`` for text models, ``[batch, C, H, W]`` for images (see ``dynamic_axes``).

    python -m deploy.bench.models resnet50 [--batch 1] [--tiny] [--exporter dynamo|torchscript]
        [--dynamic]
    python -m deploy.bench.models bert --compile      # also compile for host, time it, check vs ORT
    python -m deploy.bench.models all --tiny
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import sys
import time
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

SEED = 0
OPSET = 17
FORMAT = 3  # bump to invalidate every cached export
CACHE_DIR = Path(os.environ.get("DEPLOY_MODELS_DIR", Path(__file__).resolve().parent / ".models"))


@dataclass(frozen=True)
class InputSpec:
    """One model input: ``kind`` is "image" (standard normal), "ids" (ints in [0, high)) or
    "mask" (1 for a random-length prefix of each row, 0 after it: right padding)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    kind: str
    high: int = 0


@dataclass(frozen=True)
class Recipe:
    """How to build one model: config (tiny or not), model class, inputs, output attribute."""

    config: Callable[[bool], object]
    model_class: str
    inputs: Callable[[object, int, bool], list[InputSpec]]
    output: str
    exporter: str  # the exporter that gives the cleaner standard-op graph for this model


# ----------------------------------------------------------------------------- configs

def _resnet50(tiny: bool):
    from transformers import ResNetConfig
    if tiny:
        return ResNetConfig(embedding_size=8, hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1],
                            num_labels=10)
    return ResNetConfig(num_labels=1000)  # microsoft/resnet-50


def _mobilenet_v2(tiny: bool):
    from transformers import MobileNetV2Config
    if tiny:
        return MobileNetV2Config(depth_multiplier=0.25, image_size=32, num_labels=10)
    return MobileNetV2Config(num_labels=1001)  # google/mobilenet_v2_1.0_224


def _convnext_tiny(tiny: bool):
    from transformers import ConvNextConfig
    if tiny:
        return ConvNextConfig(hidden_sizes=[8, 16, 32, 64], depths=[1, 1, 1, 1], num_labels=10,
                              image_size=32)
    return ConvNextConfig(num_labels=1000)  # facebook/convnext-tiny-224


def _vit_base(tiny: bool):
    from transformers import ViTConfig
    if tiny:
        return ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=64, image_size=32, patch_size=8, num_labels=10,
                         attn_implementation="eager")
    return ViTConfig(num_labels=1000, attn_implementation="eager")  # google/vit-base-patch16-224


def _bert_base(tiny: bool):
    from transformers import BertConfig
    if tiny:
        return BertConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2,
                          num_attention_heads=4, intermediate_size=128,
                          attn_implementation="eager")
    return BertConfig(attn_implementation="eager")  # bert-base-uncased


def _distilbert(tiny: bool):
    from transformers import DistilBertConfig
    if tiny:
        return DistilBertConfig(vocab_size=1000, dim=64, n_layers=2, n_heads=4, hidden_dim=128,
                                attn_implementation="eager")
    return DistilBertConfig(attn_implementation="eager")  # distilbert-base-uncased


def _gpt2_small(tiny: bool):
    from transformers import GPT2Config
    if tiny:
        return GPT2Config(vocab_size=1000, n_positions=64, n_embd=64, n_layer=2, n_head=4,
                          bos_token_id=999, eos_token_id=999, use_cache=False,
                          attn_implementation="eager")
    return GPT2Config(use_cache=False, attn_implementation="eager")  # gpt2


def _image_inputs(cfg, batch: int, tiny: bool) -> list[InputSpec]:
    size = 32 if tiny else getattr(cfg, "image_size", 224)
    return [InputSpec("pixel_values", (batch, 3, size, size), "float32", "image")]


def _text_inputs(with_mask: bool):
    def inputs(cfg, batch: int, tiny: bool) -> list[InputSpec]:
        seq = 16 if tiny else 128
        specs = [InputSpec("input_ids", (batch, seq), "int64", "ids", cfg.vocab_size)]
        if with_mask:
            specs.append(InputSpec("attention_mask", (batch, seq), "int64", "mask"))
        return specs
    return inputs


RECIPES: dict[str, Recipe] = {
    "resnet50": Recipe(_resnet50, "ResNetForImageClassification", _image_inputs, "logits",
                       "dynamo"),
    "mobilenet_v2": Recipe(_mobilenet_v2, "MobileNetV2ForImageClassification", _image_inputs,
                           "logits", "dynamo"),
    "convnext_tiny": Recipe(_convnext_tiny, "ConvNextForImageClassification", _image_inputs,
                            "logits", "dynamo"),
    "vit_base": Recipe(_vit_base, "ViTForImageClassification", _image_inputs, "logits", "dynamo"),
    "bert_base": Recipe(_bert_base, "BertModel", _text_inputs(True), "last_hidden_state",
                        "dynamo"),
    "distilbert": Recipe(_distilbert, "DistilBertModel", _text_inputs(True),
                         "last_hidden_state", "dynamo"),
    "gpt2_small": Recipe(_gpt2_small, "GPT2LMHeadModel", _text_inputs(False), "logits", "dynamo"),
}
ALIASES = {"resnet": "resnet50", "resnet-50": "resnet50", "mobilenet": "mobilenet_v2",
           "mobilenetv2": "mobilenet_v2", "convnext": "convnext_tiny", "vit": "vit_base",
           "bert": "bert_base", "distilbert-base": "distilbert", "distilbert_base": "distilbert",
           "gpt2": "gpt2_small"}


def recipe_name(name: str) -> str:
    """Canonical model name (accepts the short aliases)."""
    key = ALIASES.get(name.lower(), name.lower())
    if key not in RECIPES:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(RECIPES)} "
                       f"(aliases: {', '.join(ALIASES)})")
    return key


# ----------------------------------------------------------------------------- building

def build(name: str, tiny: bool = False, batch: int = 1):
    """(torch module returning one tensor, its input specs, its config), weights seeded."""
    import torch
    import transformers
    r = RECIPES[recipe_name(name)]
    cfg = r.config(tiny)
    torch.manual_seed(SEED)
    model = getattr(transformers, r.model_class)(cfg).eval()
    _randomize_constant_params(model)
    specs = r.inputs(cfg, batch, tiny)
    return _single_output(model, [s.name for s in specs], r.output).eval(), specs, cfg


def _randomize_constant_params(model) -> None:
    """Fresh inits leave biases at 0, norm scales at 1 and BatchNorm stats at 0/1, which would let
    a wrong bias, scale or BN fold pass unnoticed: perturb every such tensor (seeded)."""
    import torch
    with torch.no_grad():
        for p in model.parameters():
            if p.numel() > 1 and bool((p == p.reshape(-1)[0]).all()):
                p.add_(torch.randn_like(p) * 0.05)
        for m in model.modules():
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                m.running_mean.normal_(0.0, 0.1)
                m.running_var.uniform_(0.5, 1.5)


def _single_output(model, names: list[str], output: str):
    """Wrap a transformers model: positional inputs in, one named output tensor out."""
    import torch

    class SingleOutput(torch.nn.Module):
        """Positional inputs -> keyword call -> one named output tensor."""

        def __init__(self, model, names: list[str], output: str):
            super().__init__()
            self.model, self.names, self.output = model, names, output

        def forward(self, *args):
            return getattr(self.model(**dict(zip(self.names, args))), self.output)

    return SingleOutput(model, names, output)


def random_inputs(specs: list[InputSpec], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Fresh random inputs per spec: images ~ N(0,1), ids in [0, high), masks = padded prefixes."""
    out = {}
    for s in specs:
        if s.kind == "image":
            out[s.name] = rng.standard_normal(s.shape).astype(s.dtype)
        elif s.kind == "ids":
            out[s.name] = rng.integers(0, s.high, s.shape).astype(s.dtype)
        elif s.kind == "mask":
            batch, seq = s.shape
            lengths = rng.integers(max(1, seq // 2), seq + 1, batch)
            lengths[0] = seq // 2 + 1 if seq > 1 else 1  # row 0 always has padding
            out[s.name] = (np.arange(seq)[None, :] < lengths[:, None]).astype(s.dtype)
        else:
            raise ValueError(f"input {s.name}: unknown kind {s.kind!r} (image, ids, mask)")
    return out


def dynamic_axes(spec: InputSpec) -> dict[int, str]:
    """The dims a dynamic export leaves open: ``batch`` for images, ``batch`` and ``seq`` for
    token ids and masks."""
    return {0: "batch"} if spec.kind == "image" else {0: "batch", 1: "seq"}


def graph_input_dims(model) -> dict[str, list]:
    """Each graph input's dims (path or ModelProto): ints, dim_param names, or None."""
    import onnx
    proto = onnx.load(str(model), load_external_data=False) if not hasattr(model, "graph") else model
    init = {t.name for t in proto.graph.initializer}
    return {i.name: [d.dim_param or (d.dim_value if d.HasField("dim_value") else None)
                     for d in i.type.tensor_type.shape.dim]
            for i in proto.graph.input if i.name not in init}


# ----------------------------------------------------------------------------- export + cache

def cache_key(name: str, tiny: bool, batch: int, exporter: str, cfg,
              dynamic: bool = False) -> str:
    import torch
    import transformers
    key = {"name": name, "tiny": tiny, "batch": batch, "exporter": exporter,
           "opset": OPSET, "seed": SEED, "format": FORMAT,
           "config": cfg.to_json_string(use_diff=False),
           "torch": torch.__version__, "transformers": transformers.__version__}
    if dynamic:  # absent otherwise: static exports keep their keys
        key["dynamic"] = True
    blob = json.dumps(key, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def model_path(name: str, batch: int = 1, tiny: bool = False, exporter: str | None = None,
               verbose: bool = False, dynamic: bool = False) -> Path:
    """Path of the cached ONNX export, exporting it first if needed. ``dynamic``: export with
    the dims of ``dynamic_axes`` open; ``batch`` is then only the example's batch and is raised
    to 2 (torch.export specializes a size-1 dim to the constant 1)."""
    name = recipe_name(name)
    exporter = exporter or RECIPES[name].exporter
    cfg = RECIPES[name].config(tiny)
    batch = max(batch, 2) if dynamic else batch
    key = cache_key(name, tiny, batch, exporter, cfg, dynamic)
    stem = f"{name}{'-tiny' if tiny else ''}{'-dyn' if dynamic else ''}-b{batch}-{exporter}-{key}"
    path = CACHE_DIR / f"{stem}.onnx"
    if path.exists() and path.with_suffix(".json").exists():
        return path
    _ensure_cache_dir()
    module, specs, _ = build(name, tiny, batch)
    meta = export(module, specs, path, exporter, verbose, dynamic)
    meta.update(name=name, tiny=tiny, batch=batch, exporter=exporter)
    if dynamic:
        meta.update(dynamic=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(meta, indent=1))
    os.replace(tmp, path.with_suffix(".json"))
    return path


def _ensure_cache_dir() -> None:
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    ignore = CACHE_DIR / ".gitignore"
    if not ignore.exists():
        ignore.write_text("*\n")


def input_specs(path: Path) -> list[InputSpec]:
    """Input specs stored beside a cached export."""
    meta = json.loads(Path(path).with_suffix(".json").read_text())
    return [InputSpec(s["name"], tuple(s["shape"]), s["dtype"], s["kind"], s["high"])
            for s in meta["inputs"]]


def export(module, specs: list[InputSpec], path: Path, exporter: str,
           verbose: bool = False, dynamic: bool = False) -> dict:
    """torch.onnx.export at opset 17 into ``path`` (one file, no external data); check that
    ONNX Runtime loads it and agrees with torch. ``dynamic``: the dims of ``dynamic_axes`` stay
    open (dim_params ``batch``/``seq``, checked). Returns metadata for the cache."""
    import onnx
    import torch
    example = random_inputs(specs, np.random.default_rng(SEED))
    args = tuple(torch.from_numpy(example[s.name]) for s in specs)
    tmp = path.with_name(path.stem + f".{os.getpid()}.tmp.onnx")
    start = time.perf_counter()
    quiet = contextlib.nullcontext() if verbose else _quiet()
    with quiet, torch.no_grad():
        kwargs = {"opset_version": OPSET, "input_names": [s.name for s in specs],
                  "output_names": ["output"]}
        if dynamic:
            kwargs.update(_dynamic_kwargs(specs, exporter))
        if exporter == "dynamo":  # it writes opset 18 natively; to_opset17 converts it
            kwargs["opset_version"] = 18
            torch.onnx.export(module, args, str(tmp), dynamo=True, external_data=False,
                              verbose=False, **kwargs)
        elif exporter == "torchscript":
            torch.onnx.export(module, args, str(tmp), dynamo=False, **kwargs)
        else:
            raise ValueError(f"exporter {exporter!r}: use 'dynamo' or 'torchscript'")
        expected = module(*args).numpy()
    seconds = time.perf_counter() - start
    proto = onnx.load(str(tmp))
    if any(o.domain in ("", "ai.onnx") and o.version == 18 for o in proto.opset_import):
        proto = to_opset17(proto)
        onnx.save(proto, str(tmp))
    got = _ort_run(str(tmp), example)[0]
    meta = {"inputs": [asdict(s) for s in specs], "export_seconds": round(seconds, 2),
            "ir_version": proto.ir_version,
            "opsets": {o.domain or "ai.onnx": o.version for o in proto.opset_import},
            "op_histogram": dict(op_histogram(proto).most_common()),
            "nodes": len(proto.graph.node), "torch_vs_ort_max_abs": float(np.abs(got - expected).max())}
    if dynamic:
        meta["input_dims"] = _check_dynamic_dims(proto, specs, tmp)
    os.replace(tmp, path)
    return meta


def _dynamic_kwargs(specs: list[InputSpec], exporter: str) -> dict:
    """torch.onnx.export arguments that open ``dynamic_axes``: ``dynamic_axes`` (torchscript;
    the output's leading dims too) or ``dynamic_shapes`` (dynamo: one ``Dim`` per name, shared by
    every input that has it; the wrapped module takes ``*args``, hence the 1-tuple)."""
    import torch
    if exporter == "torchscript":
        axes = {s.name: dynamic_axes(s) for s in specs}
        return {"dynamic_axes": {**axes, "output": dynamic_axes(specs[0])}}
    dims = {n: torch.export.Dim(n) for s in specs for n in dynamic_axes(s).values()}
    return {"dynamic_shapes": (tuple({k: dims[n] for k, n in dynamic_axes(s).items()}
                                     for s in specs),)}


def _check_dynamic_dims(proto, specs: list[InputSpec], tmp: Path) -> dict[str, list]:
    """The exported inputs' dims; each dim of ``dynamic_axes`` must carry its dim_param."""
    dims = graph_input_dims(proto)
    for s in specs:
        got = dims.get(s.name, [])
        bad = {k: n for k, n in dynamic_axes(s).items() if k >= len(got) or got[k] != n}
        if bad:
            tmp.unlink(missing_ok=True)
            raise ValueError(f"dynamic export: input {s.name} has dims {got}, expected "
                             f"dim_params {bad}")
    return dims


REDUCE_18 = {"ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
             "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"}


def to_opset17(proto):
    """Rewrite an opset-18 export as opset 17 (onnx.version_converter has no Split 18->17 adapter
    and leaves opset-18 attributes behind). Reduce*-18: constant ``axes`` input -> attribute;
    Split-18 ``num_outputs`` -> the explicit ``split`` sizes it implies. Any other op whose
    schema changed at 18 is refused with its node name."""
    import onnx
    from onnx import helper, numpy_helper
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    shapes = _static_shapes(out)
    consts = {t.name: numpy_helper.to_array(t) for t in out.graph.initializer}
    for node in out.graph.node:
        if node.domain not in ("", "ai.onnx"):
            continue
        if node.op_type in REDUCE_18:
            _reduce_axes_to_attr(node, consts)
        elif node.op_type == "Split":
            _split_sizes_to_input(node, shapes, out.graph)
        elif onnx.defs.get_schema(node.op_type, 18).since_version == 18:
            raise ValueError(f"node {node.name} ({node.op_type}): changed at opset 18, "
                             "no rewrite to opset 17 here")
    used = {i for n in out.graph.node for i in n.input}
    keep = [t for t in out.graph.initializer if t.name in used]  # the axes moved to attributes
    del out.graph.initializer[:]
    out.graph.initializer.extend(keep)
    del out.opset_import[:]
    out.opset_import.append(helper.make_opsetid("", 17))
    onnx.checker.check_model(out, full_check=True)
    return out


def _reduce_axes_to_attr(node, consts: dict) -> None:
    # Reduce-18(x, axes) with constant axes == Reduce-13(x) with attribute axes
    from onnx import helper
    attrs = {a.name: a for a in node.attribute}
    noop = attrs.pop("noop_with_empty_axes", None)
    axes = consts.get(node.input[1]) if len(node.input) > 1 and node.input[1] else None
    if len(node.input) > 1 and node.input[1] and axes is None:
        raise ValueError(f"node {node.name} ({node.op_type}): axes is not a constant")
    if axes is None and noop is not None and noop.i:
        raise ValueError(f"node {node.name}: noop_with_empty_axes=1 without axes")
    del node.attribute[:]
    node.attribute.extend(attrs.values())
    if axes is not None:
        node.attribute.append(helper.make_attribute("axes", [int(v) for v in axes.ravel()]))
    del node.input[1:]


def _split_sizes_to_input(node, shapes: dict, graph) -> None:
    # Split-18 num_outputs=n == Split-13 with split = n chunks of ceil(dim/n), the last smaller
    from onnx import numpy_helper
    parts = next((a for a in node.attribute if a.name == "num_outputs"), None)
    if parts is None:
        return
    axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
    shape = shapes.get(node.input[0])
    if not shape or shape[axis] <= 0:
        raise ValueError(f"Split {node.name}: input shape unknown, cannot write split sizes")
    dim, n = shape[axis], parts.i
    chunk = -(-dim // n)
    sizes = np.array([min(chunk, dim - k * chunk) for k in range(n)], np.int64)
    name = f"{node.name or node.output[0]}_split_sizes"
    graph.initializer.append(numpy_helper.from_array(sizes, name))
    node.attribute.remove(parts)
    del node.input[1:]
    node.input.append(name)


def _static_shapes(proto) -> dict[str, list[int]]:
    import onnx
    inferred = onnx.shape_inference.infer_shapes(proto)
    vis = list(inferred.graph.value_info) + list(inferred.graph.input)
    return {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in vis}


@contextlib.contextmanager
def _quiet():
    """The exporters print progress and warnings on stdout/stderr; keep the CLI readable."""
    with open(os.devnull, "w") as null, contextlib.redirect_stdout(null), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import logging
        level = logging.root.manager.disable
        logging.disable(logging.WARNING)
        try:
            yield
        finally:
            logging.disable(level)


def op_histogram(model) -> Counter:
    """Op-type counts of an ONNX model (path or ModelProto), 'domain::Op' outside ai.onnx."""
    import onnx
    proto = onnx.load(str(model), load_external_data=False) if not hasattr(model, "graph") else model
    return Counter(f"{n.domain}::{n.op_type}" if n.domain not in ("", "ai.onnx") else n.op_type
                   for n in proto.graph.node)


def _ort_run(path: str, inputs: dict) -> list[np.ndarray]:
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = os.cpu_count() or 1
    sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    return sess.run(None, inputs)


# ----------------------------------------------------------------------------- compile + measure

@contextlib.contextmanager
def _time_c_build(sink: dict):
    """Time the C compiler call inside deploy.compile (its "render+build" stage is one lap)."""
    from deploy import compiler
    original = compiler.build_shared_library

    def timed(*a, **k):
        t = time.perf_counter()
        try:
            return original(*a, **k)
        finally:
            sink["c_build"] = sink.get("c_build", 0.0) + time.perf_counter() - t

    compiler.build_shared_library = timed
    try:
        yield
    finally:
        compiler.build_shared_library = original


def measure(path: Path, runs: int = 5, seed: int = 1) -> dict:
    """Compile ``path`` for host (no tuning), run it, compare with ORT on fresh random inputs."""
    import deploy
    specs = input_specs(path)
    inputs = random_inputs(specs, np.random.default_rng(seed))
    c_build: dict = {}
    start = time.perf_counter()
    with _time_c_build(c_build):
        art = deploy.compile(str(path), target="host")
    wall = time.perf_counter() - start
    stages = dict(art.timings)
    if "render+build" in stages and "c_build" in c_build:
        stages["render"] = round(stages["render+build"] - c_build["c_build"], 3)
        stages["c_build"] = round(c_build["c_build"], 3)
    mod = art.load()
    ours = mod.run(inputs)
    lat = []
    for _ in range(runs):
        t = time.perf_counter()
        mod.run(inputs)
        lat.append(time.perf_counter() - t)
    ref = _ort_run(str(path), inputs)
    ort_lat = []
    for _ in range(runs):
        t = time.perf_counter()
        _ort_run_cached(str(path), inputs)
        ort_lat.append(time.perf_counter() - t)
    return {"compile_wall_s": round(wall, 2), "stages_s": stages,
            "kernels": art.manifest.get("kernel_count"),
            "latency_ms_median": round(1e3 * float(np.median(lat)), 2),
            "ort_latency_ms_median": round(1e3 * float(np.median(ort_lat)), 2),
            **errors(ours, ref)}


_SESSIONS: dict = {}


def _ort_run_cached(path: str, inputs: dict) -> list[np.ndarray]:
    import onnxruntime as ort
    if path not in _SESSIONS:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = os.cpu_count() or 1
        _SESSIONS[path] = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    return _SESSIONS[path].run(None, inputs)


def errors(ours: list[np.ndarray], ref: list[np.ndarray]) -> dict:
    """Max abs error, max elementwise rel error (|d| / |ref|, over |ref| >= 1e-3), max abs error
    over max |ref|, non-finite counts, and whether rtol 1e-3 / atol 1e-4 holds (numpy.allclose)."""
    d = [np.abs(a.astype(np.float64) - b) for a, b in zip(ours, ref)]
    big = [np.abs(b) >= 1e-3 for b in ref]
    return {"max_abs_err": max(float(x.max()) for x in d),
            "max_rel_err": max(float((x[m] / np.abs(b[m])).max(initial=0.0))
                               for x, b, m in zip(d, ref, big)),
            "max_abs_over_max_ref": max(float(x.max() / max(np.abs(b).max(), 1e-30))
                                        for x, b in zip(d, ref)),
            "nonfinite_ours": int(sum((~np.isfinite(a)).sum() for a in ours)),
            "nonfinite_ort": int(sum((~np.isfinite(b)).sum() for b in ref)),
            "allclose_1e-3_1e-4": all(a.shape == b.shape and np.allclose(a, b, rtol=1e-3, atol=1e-4)
                                      for a, b in zip(ours, ref))}


# ----------------------------------------------------------------------------- CLI

def _print_histogram(path: Path) -> None:
    meta = json.loads(path.with_suffix(".json").read_text())
    print(f"{meta['name']}{' (tiny)' if meta['tiny'] else ''} batch {meta['batch']}: {path}")
    print(f"  exporter {meta['exporter']}, IR {meta['ir_version']}, opsets {meta['opsets']}, "
          f"{meta['nodes']} nodes, torch vs ORT max |d| {meta['torch_vs_ort_max_abs']:.2e}")
    print("  inputs: " + ", ".join(f"{s['name']} {s['dtype']}{list(s['shape'])}"
                                   for s in meta["inputs"]))
    if meta.get("dynamic"):
        print("  graph inputs: " + ", ".join(f"{n} {d}" for n, d in meta["input_dims"].items()))
    print("  ops: " + ", ".join(f"{op} {n}" for op, n in meta["op_histogram"].items()))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m deploy.bench.models", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", help=f"one of {', '.join(RECIPES)}, an alias, or 'all'")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--tiny", action="store_true", help="few layers, small widths")
    p.add_argument("--exporter", choices=["dynamo", "torchscript"], default=None,
                   help="default: the per-model choice in RECIPES")
    p.add_argument("--compile", action="store_true",
                   help="compile for host, time the stages, run, compare with ORT")
    p.add_argument("--runs", type=int, default=5, help="timed runs with --compile")
    p.add_argument("--verbose", action="store_true", help="show exporter output")
    p.add_argument("--dynamic", action="store_true",
                   help="export with dynamic axes (batch; seq for text models)")
    a = p.parse_args(argv)
    names = list(RECIPES) if a.name == "all" else [a.name]
    status = 0
    for name in names:
        try:
            path = model_path(name, a.batch, a.tiny, a.exporter, a.verbose, a.dynamic)
        except KeyError as e:
            print(e.args[0], file=sys.stderr)
            return 2
        _print_histogram(path)
        if a.compile:
            try:
                print("  " + json.dumps(measure(path, a.runs)))
            except Exception as e:  # noqa: BLE001 - report it, go on to the next model
                status = 1
                print(f"  compile/run FAILED: {type(e).__name__}: {e}")
    return status


if __name__ == "__main__":
    sys.exit(main())
