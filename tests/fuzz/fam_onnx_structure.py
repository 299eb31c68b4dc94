"""ONNX structure: seed models edited into malformed or unusual graphs. Each mutation says
whether deploy must refuse the model (``must_refuse``) or may compile it, in which case the
artifact must agree with ONNX Runtime."""
from __future__ import annotations

import os
from pathlib import Path

import deploy
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .judge import Result, accepted, check_against_ort, cli, judge

HUGE = 2 ** 20  # two of these: 2**40 elements


class Edit:
    """One structural edit: ``must_refuse`` when no correct compiler accepts the result;
    ``run`` False when the compiled model cannot be run on real inputs (huge sizes)."""

    def __init__(self, label: str, must_refuse: bool, run: bool = True, same: bool = False):
        self.label, self.must_refuse, self.run = label, must_refuse, run
        self.same = same  # the edit changes no meaning: compare with ORT on the seed model


def _pick(rng, seq):
    return seq[int(rng.integers(0, len(seq)))]


def _node(m, rng):
    return _pick(rng, list(m.graph.node))


def unknown_op(m, rng, tmp):
    _node(m, rng).op_type = _pick(rng, ["FooBar", "relu", "Conv2D", "", "Softmax_", "\x00",
                                        "MatMul" * 50])
    return Edit("unknown-op", True)


def unknown_domain(m, rng, tmp):
    node = _node(m, rng)
    node.domain = _pick(rng, ["com.example", "ai.onnx.ml", "ai.onnx.preview.training", "x" * 300,
                              "ai.onnx"])
    return Edit(f"domain-{node.domain[:12]}", node.domain != "ai.onnx")


def opset(m, rng, tmp):
    choice = _pick(rng, ["0", "999", "-1", "2**40", "none", "twice", "ir0", "ir999"])
    versions = {"0": 0, "999": 999, "-1": -1, "2**40": 2 ** 40}
    if choice == "none":
        del m.opset_import[:]
    elif choice == "twice":
        m.opset_import.append(helper.make_opsetid("", 13))
    elif choice.startswith("ir"):
        m.ir_version = int(choice[2:])
    else:
        m.opset_import[0].version = versions[choice]
    return Edit(f"opset-{choice}", True)


def missing_initializer(m, rng, tmp):
    inits = m.graph.initializer
    del inits[int(rng.integers(0, len(inits)))]
    return Edit("missing-initializer", True)


def dangling(m, rng, tmp):
    if rng.random() < 0.5:
        node = _node(m, rng)
        node.input[int(rng.integers(0, len(node.input)))] = "ghost"
        return Edit("dangling-node-input", True)
    m.graph.output[0].name = "ghost"
    return Edit("dangling-graph-output", True)


def duplicate(m, rng, tmp):
    g = m.graph
    kind = _pick(rng, ["input", "node-output", "initializer", "node-name", "graph-output"])
    if kind == "input":
        g.input.append(g.input[0])
    elif kind == "node-output":
        if len(g.node) < 2:
            g.node.append(helper.make_node("Relu", [g.input[0].name], [g.output[0].name]))
        else:  # a later node writes a value an earlier one wrote (not SSA)
            g.node[-1].output[0] = g.node[0].output[0]
    elif kind == "initializer":
        t = onnx.TensorProto()
        t.CopyFrom(g.initializer[0])
        arr = numpy_helper.to_array(t)
        g.initializer.append(numpy_helper.from_array(
            (arr + 1).astype(arr.dtype) if arr.dtype != np.bool_ else ~arr, t.name))
    elif kind == "node-name":
        for n in g.node:
            n.name = "same"
    else:
        g.output.append(g.output[0])
    # (node names are diagnostics; ORT refuses duplicates, deploy may accept them)
    return Edit(f"duplicate-{kind}", kind in ("input", "node-output", "initializer"),
                same=kind == "node-name")


def cycle(m, rng, tmp):
    g = m.graph
    if len(g.node) < 2 or rng.random() < 0.3:
        node = _node(m, rng)
        node.input[0] = node.output[0]  # reads its own output
        return Edit("cycle-self", True)
    i, j = sorted(int(x) for x in rng.choice(len(g.node), 2, replace=False))
    g.node[i].input[0] = g.node[j].output[0]  # an earlier node reads a later one's output
    return Edit("cycle", True)


def attribute_type(m, rng, tmp):
    nodes = [n for n in m.graph.node if n.attribute]
    if not nodes or rng.random() < 0.3:
        node = _node(m, rng)
        node.attribute.append(_pick(rng, [
            helper.make_attribute("axis", "x"), helper.make_attribute("axis", 1.5),
            helper.make_attribute("no_such_attribute", 3),
            helper.make_attribute("kernel_shape", [2.5, 1.0])]))
        return Edit("attribute-added", True)
    node = _pick(rng, nodes)
    a = _pick(rng, list(node.attribute))
    new = _pick(rng, [helper.make_attribute(a.name, "text"),
                      helper.make_attribute(a.name, 1.25),
                      helper.make_attribute(a.name, [1.5, 2.5]),
                      helper.make_attribute(a.name, numpy_helper.from_array(np.ones(2, np.float32)))])
    if new.type == a.type:
        new = helper.make_attribute(a.name, "text")
    a.CopyFrom(new)
    return Edit("attribute-type", True)


def dims(m, rng, tmp):
    vi = m.graph.input[0]
    shape = vi.type.tensor_type.shape
    kind = _pick(rng, ["negative", "zero", "huge", "huge-constant", "huge-initializer"])
    if kind == "negative":
        shape.dim[int(rng.integers(0, len(shape.dim)))].dim_value = -int(rng.integers(1, 5))
        return Edit("dim-negative", True)
    if kind == "zero" and not shape.dim:
        kind = "huge"
    if kind == "zero":
        d = shape.dim[0]
        d.Clear()
        d.dim_value = 0
        for o in m.graph.output:  # (the declared output shape follows)
            if o.type.tensor_type.shape.dim:
                o.type.tensor_type.shape.dim[0].Clear()
        return Edit("dim-zero", False)
    if kind == "huge":  # a 2**40-element input: compiles maybe, never runs here
        g = m.graph
        g.ClearField("node")
        g.ClearField("initializer")
        g.ClearField("input")
        g.ClearField("output")
        g.input.append(helper.make_tensor_value_info("x", TensorProto.FLOAT, [HUGE, HUGE]))
        g.output.append(helper.make_tensor_value_info("y", TensorProto.FLOAT, [HUGE, HUGE]))
        g.node.append(helper.make_node("Relu", ["x"], ["y"]))
        return Edit("dim-huge-input", False, run=False)
    if kind == "huge-constant":  # a 2**40-element value made inside the model
        g = m.graph
        out = g.output[0].name
        g.node.append(helper.make_node("ConstantOfShape", ["huge_shape"], ["big"],
                                       value=numpy_helper.from_array(np.ones(1, np.float32))))
        g.node.append(helper.make_node("ReduceSum", ["big"], ["total"], keepdims=0))
        g.node.append(helper.make_node("Add", [out, "total"], ["y_total"]))
        g.initializer.append(numpy_helper.from_array(np.array([HUGE, HUGE], np.int64),
                                                     "huge_shape"))
        g.output[0].name = "y_total"
        return Edit("dim-huge-constant", False, run=False)
    t = m.graph.initializer[0]  # declares 2**40 elements, holds a few
    del t.dims[:]
    t.dims.extend([HUGE, HUGE])
    return Edit("dim-huge-initializer", True)


def rank_dtype(m, rng, tmp):
    g = m.graph
    kind = _pick(rng, ["input-rank", "initializer-rank", "input-dtype", "initializer-dtype",
                       "output-dtype", "output-shape", "value-info"])
    if kind == "input-rank":
        shape = g.input[0].type.tensor_type.shape
        if rng.random() < 0.5:
            shape.dim.add().dim_value = 1
        else:
            del shape.dim[-1]
    elif kind == "initializer-rank":
        t = _pick(rng, list(g.initializer))
        arr = numpy_helper.to_array(t)
        new = arr.reshape(-1) if arr.ndim != 1 else arr.reshape(1, -1, 1)
        t.CopyFrom(numpy_helper.from_array(new, t.name))
    elif kind == "input-dtype":
        g.input[0].type.tensor_type.elem_type = int(_pick(rng, [
            TensorProto.INT64, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.STRING,
            TensorProto.BOOL, TensorProto.UNDEFINED, 999, TensorProto.COMPLEX64]))
    elif kind == "initializer-dtype":
        t = _pick(rng, list(g.initializer))
        arr = numpy_helper.to_array(t)
        t.CopyFrom(numpy_helper.from_array(arr.astype(_pick(rng, [np.float64, np.int32,
                                                                   np.float16, np.uint8])),
                                           t.name))
    elif kind == "output-dtype":
        g.output[0].type.tensor_type.elem_type = int(_pick(rng, [TensorProto.INT64,
                                                                 TensorProto.DOUBLE]))
    elif kind == "output-shape":
        shape = g.output[0].type.tensor_type.shape
        shape.dim.add().dim_value = 7
    else:  # an intermediate's declared shape is wrong
        node = g.node[0]
        g.value_info.append(helper.make_tensor_value_info(node.output[0], TensorProto.FLOAT,
                                                          [3, 9, 9]))
    return Edit(kind, False)


def empty(m, rng, tmp):
    g = m.graph
    kind = _pick(rng, ["nothing", "no-nodes-identity", "no-outputs", "constant-only"])
    if kind == "nothing":
        g.ClearField("node")
        g.ClearField("output")
    elif kind == "no-nodes-identity":
        g.ClearField("node")
        g.ClearField("initializer")
        del g.input[1:]
        g.ClearField("output")
        out = onnx.ValueInfoProto()
        out.CopyFrom(g.input[0])
        g.output.append(out)
    elif kind == "no-outputs":
        g.ClearField("output")
    else:  # no inputs: the output is an initializer
        g.ClearField("node")
        g.ClearField("input")
        t = g.initializer[0]
        g.ClearField("output")
        g.output.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    return Edit(f"empty-{kind}", kind in ("nothing", "no-outputs"))


def external_data(m, rng, tmp):
    """The largest initializer moved to a side file; where that file is, is fuzzed."""
    t = max(m.graph.initializer, key=lambda t: numpy_helper.to_array(t).size)
    raw = numpy_helper.to_array(t).tobytes()
    kind = _pick(rng, ["valid", "parent", "absolute", "missing", "past-end", "symlink-out",
                       "folder", "empty-name"])
    folder = tmp / "model"
    folder.mkdir()
    outside = tmp / "outside.bin"
    outside.write_bytes(raw)
    location, offset, length = "weights.bin", 0, len(raw)
    if kind in ("valid", "past-end"):
        (folder / "weights.bin").write_bytes(raw)
        if kind == "past-end":
            offset = int(rng.integers(1, 64))
    elif kind == "parent":
        location = "../outside.bin"
    elif kind == "absolute":
        location = str(outside)
    elif kind == "missing":
        location = "nowhere.bin"
    elif kind == "symlink-out":
        os.symlink(outside, folder / "weights.bin")
    elif kind == "folder":
        (folder / "weights.bin").mkdir()
    else:
        location = ""
    t.ClearField("raw_data")
    t.ClearField("float_data")
    t.ClearField("int64_data")
    t.data_location = TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", str(offset)), ("length", str(length))):
        e = t.external_data.add()
        e.key, e.value = k, v
    return Edit(f"external-{kind}", kind != "valid"), folder


def initializer_size(m, rng, tmp):
    t = _pick(rng, list(m.graph.initializer))
    arr = numpy_helper.to_array(t)
    kind = _pick(rng, ["short", "long", "typed-short", "dims-grow", "both-fields"])
    t.CopyFrom(numpy_helper.from_array(arr, t.name))  # raw_data form
    if kind == "short":
        t.raw_data = t.raw_data[:max(0, len(t.raw_data) - int(rng.integers(1, 5)))]
    elif kind == "long":
        t.raw_data = t.raw_data + b"\x00" * int(rng.integers(1, 9))
    elif kind == "typed-short":  # the typed field, one element too few
        t.ClearField("raw_data")
        flat = arr.reshape(-1)
        if arr.dtype == np.int64:
            t.int64_data.extend(int(x) for x in flat[:-1])
        else:
            t.float_data.extend(float(x) for x in flat[:-1].astype(np.float32))
    elif kind == "dims-grow":
        if t.dims:
            t.dims[0] += 1
        else:
            t.dims.append(2)
    else:  # raw_data and a typed field at once
        t.float_data.extend([1.0] * max(1, arr.size))
    return Edit(f"initializer-{kind}", True)


def _free_outputs(m) -> None:
    for o in m.graph.output:  # (the edit changes the output's shape: ONNX infers it)
        o.type.tensor_type.ClearField("shape")


def rewire(m, rng, tmp):
    """A node reads another value defined before it: shapes the seed never combined."""
    g = m.graph
    k = int(rng.integers(0, len(g.node)))
    node = g.node[k]
    earlier = [vi.name for vi in g.input] + [t.name for t in g.initializer] + \
        [o for n in g.node[:k] for o in n.output if o]
    node.input[int(rng.integers(0, len(node.input)))] = _pick(rng, earlier)
    _free_outputs(m)
    return Edit("rewire", False)


def attribute_value(m, rng, tmp):
    """An integer attribute (axis, perm, pads, strides, keepdims ...) given another value."""
    ints = [(n, a) for n in m.graph.node for a in n.attribute
            if a.type in (onnx.AttributeProto.INT, onnx.AttributeProto.INTS)]
    if not ints:
        return rewire(m, rng, tmp)
    node, a = _pick(rng, ints)
    values = [-3, -2, -1, 0, 1, 2, 3, 5]
    if a.type == onnx.AttributeProto.INT:
        a.i = _pick(rng, [v for v in values if v != a.i])
    elif rng.random() < 0.2 or not a.ints:
        a.ints.append(_pick(rng, values)) if rng.random() < 0.5 or not a.ints else a.ints.pop()
    else:
        a.ints[int(rng.integers(0, len(a.ints)))] = _pick(rng, values)
    _free_outputs(m)
    return Edit(f"attribute-value-{node.op_type}", False)


def constant_value(m, rng, tmp):
    """An integer or bool initializer (starts, pads, shapes, indices, axes, masks) given other
    values: the operands converters read at import."""
    inits = [t for t in m.graph.initializer
             if t.data_type in (TensorProto.INT64, TensorProto.INT32, TensorProto.BOOL)]
    if not inits:
        return attribute_value(m, rng, tmp)
    t = _pick(rng, inits)
    arr = numpy_helper.to_array(t).copy()
    flat = arr.reshape(-1)
    if flat.size and rng.random() < 0.8:
        k = int(rng.integers(0, flat.size))
        flat[k] = ~flat[k] if arr.dtype == np.bool_ else _pick(
            rng, [-(2 ** 62), -7, -3, -2, -1, 0, 1, 2, 3, 5, 9, 2 ** 31, 2 ** 62])
    else:  # one element more or less
        arr = np.append(flat, flat[-1:] if flat.size else 1)[:None if rng.random() < 0.5 else
                                                               max(flat.size - 1, 0)]
    t.CopyFrom(numpy_helper.from_array(arr.astype(numpy_helper.to_array(t).dtype), t.name))
    _free_outputs(m)
    return Edit(f"constant-value-{t.name}", False)


EDITS = [rewire, rewire, attribute_value, attribute_value, constant_value, constant_value, unknown_op, unknown_domain, opset, missing_initializer, dangling, duplicate, cycle,
         attribute_type, dims, rank_dtype, empty, external_data, initializer_size]


def case(rng: np.random.Generator, seeds, tmp: Path) -> tuple[str, Result]:
    name = str(rng.choice(sorted(seeds.index["models"])))
    model = seeds.model(name)
    edit = EDITS[int(rng.integers(0, len(EDITS)))]
    made = edit(model, rng, tmp)
    edit, folder = made if isinstance(made, tuple) else (made, tmp)
    path = folder / "model.onnx"
    path.write_bytes(model.SerializeToString())
    if edit.must_refuse:
        check = accepted(f"{edit.label} ({name})")
    elif edit.run:
        reference = seeds.index["models"][name] if edit.same else str(path)
        check = lambda mod: check_against_ort(reference, mod, rng)
    else:
        check = _runs_or_refuses
    if rng.random() < 0.1:
        result = cli(["compile", str(path), "-o", str(tmp / "m.dpk")])
        if result.outcome == "correct":
            result = judge(lambda: deploy.load(tmp / "m.dpk"), check)
        return f"cli-{edit.label}", result
    return edit.label, judge(lambda: deploy.compile(str(path)).load(tmp / "m.dpk"), check)


def _runs_or_refuses(mod) -> None:
    """A model of 2**40-element values that compiled: a run must end in a DeployError (the
    inputs cannot have the declared size here, or the values cannot be allocated)."""
    from .judge import Wrong, random_feeds
    feeds = random_feeds(mod.input_specs, np.random.default_rng(0)) if all(
        isinstance(d, int) and d < HUGE for s in mod.input_specs for d in s.shape) else \
        {s.name: np.zeros((2,) * len(s.shape), np.float32) for s in mod.input_specs}
    mod.run(feeds)
    raise Wrong("a model with 2**40-element values ran without an error")
