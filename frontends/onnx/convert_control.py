"""ONNX converters: control flow (If, Loop, Scan), resolved at import time.

- If: a constant condition inlines its branch. A runtime condition computes both branches and
  selects with Where when their outputs have equal shapes; otherwise the condition must be known
  at compile time (``NeedsConstant``, which the ONNX backend turns into specialization).
- Loop: unrolled. The trip count must be known at compile time. A loop-carried condition that is
  only known at run time freezes the carried values with Where once it turns false (allowed when
  the loop has no scan outputs, whose length would then depend on data).
- Scan: unrolled over the (static) scan length, slicing inputs and stacking outputs.

Subgraphs are converted in the enclosing scope (``cx.env``), so they read outer values directly.
"""
from __future__ import annotations

import numpy as np
import onnx

from ...graph_ir.ops import elementwise as ew
from ...graph_ir.ops import movement as mv
from ...graph_ir.types import DType
from .registry import converter

MAX_UNROLL = 4096  # iterations a Loop/Scan may unroll into before import refuses


def run_subgraph(cx, g: onnx.GraphProto, bindings: dict) -> list:
    """Convert subgraph ``g`` with its formal inputs bound to ``bindings`` (name -> Value)."""
    from .importer import convert_graph
    outer_env, outer_node = cx.env, cx.node
    env = dict(outer_env)
    env.update(bindings)
    try:
        return convert_graph(cx, g, env)
    finally:
        cx.env, cx.node = outer_env, outer_node


def scalar_bool(cx, v):
    if v.shape:
        v = cx.b.op(mv.Reshape, v, shape=())
    return v if v.dtype is DType.bool else cx.b.op(ew.Cast, v, to=DType.bool)


def known_bool(cx, v) -> bool | None:
    arr = cx.b.value_of(v)
    return None if arr is None else bool(np.asarray(arr).reshape(-1)[0])


# ---- If ------------------------------------------------------------------------------------

@converter("If")
def convert_if(cx, node, ins):
    cond = ins[0]
    known = known_bool(cx, cond)
    if known is not None:
        return run_subgraph(cx, cx.attr(node, "then_branch" if known else "else_branch"), {})
    then = run_subgraph(cx, cx.attr(node, "then_branch"), {})
    other = run_subgraph(cx, cx.attr(node, "else_branch"), {})
    if any(not _tensor(t) or not _tensor(e) or t.shape != e.shape or t.dtype != e.dtype
           for t, e in zip(then, other)):
        cx.const_of(cond, "If's condition (its branches give outputs of different shapes)")
    c = scalar_bool(cx, cond)
    return [cx.b.op(ew.Where, c, t, e, name=node.name) for t, e in zip(then, other)]


def _tensor(v) -> bool:
    return hasattr(v, "shape") and hasattr(v, "dtype") and not v.dtype.is_host_value


# ---- Loop ----------------------------------------------------------------------------------

def _trip_count(cx, m) -> int | None:
    if m is None:
        return None
    return int(np.asarray(cx.const_of(m, "Loop's trip count M")).reshape(-1)[0])


@converter("Loop")
def convert_loop(cx, node, ins):
    body: onnx.GraphProto = cx.attr(node, "body")
    m, cond, carried = ins[0] if ins else None, ins[1] if len(ins) > 1 else None, list(ins[2:])
    trips = _trip_count(cx, m)
    n_scan = len(body.output) - 1 - len(carried)
    running = None if cond is None else scalar_bool(cx, cond)  # None: known true
    if running is not None and known_bool(cx, running) is not None:
        if not known_bool(cx, running):
            return carried + [_empty_scan(cx, body, k) for k in range(n_scan)]
        running = None
    if running is not None and n_scan:
        cx.const_of(cond, "Loop's initial condition (the loop has scan outputs)")
    if running is not None and any(isinstance(v, list) for v in carried):
        cx.const_of(cond, "Loop's initial condition (the loop carries a sequence)")
    if trips is None and running is not None:
        cx.const_of(cond, "Loop's condition (no trip count bounds the loop)")
    scans: list[list] = [[] for _ in range(n_scan)]
    it, limit = 0, trips if trips is not None else MAX_UNROLL + 1
    while it < limit:
        if it >= MAX_UNROLL:
            raise NotImplementedError(f"Loop runs more than {MAX_UNROLL} iterations; it is "
                                      "unrolled at import, so its trip count must stay below that")
        bind = dict(zip((i.name for i in body.input),
                        [cx.b.const(np.array(it, np.int64)),
                         running if running is not None else cx.b.const(np.array(True))] + carried))
        outs = run_subgraph(cx, body, bind)
        c_out, new, scan_vals = outs[0], outs[1:1 + len(carried)], outs[1 + len(carried):]
        if running is None:
            carried = list(new)
        else:  # the iteration only counts where the loop still runs
            if n_scan:
                raise NotImplementedError("Loop with scan outputs and a condition known only at "
                                          "run time (the output length would depend on data)")
            carried = [cx.b.op(ew.Where, running, n, o) for n, o in zip(new, carried)]
        for acc, v in zip(scans, scan_vals):
            acc.append(v)
        it += 1
        stop = known_bool(cx, c_out)
        if stop is False:
            break
        if stop is None:
            if n_scan:
                cx.const_of(c_out, "Loop's condition (the loop has scan outputs)")
            if any(isinstance(v, list) for v in carried):  # sequences: no Where across lengths
                cx.const_of(c_out, "Loop's condition (the loop carries a sequence)")
            c = scalar_bool(cx, c_out)
            running = c if running is None else cx.b.op(ew.And, running, c)
    return carried + [stack(cx, vals, 0) if vals else _empty_scan(cx, body, k)
                      for k, vals in enumerate(scans)]


def _empty_scan(cx, body: onnx.GraphProto, k: int):
    """A zero-iteration scan output: shape (0, ...) from the body's declared output type."""
    vi = body.output[1 + (len(body.input) - 2) + k]
    tt = vi.type.tensor_type
    dims = [d.dim_value if d.HasField("dim_value") else 0 for d in tt.shape.dim]
    return cx.b.const(np.zeros([0] + dims, DType.from_onnx(tt.elem_type).np))


def stack(cx, values: list, axis: int):
    """Stack equal-shaped values along a new ``axis``."""
    parts = []
    for v in values:
        shape = list(v.shape)
        shape.insert(axis, 1)
        parts.append(cx.b.op(mv.Reshape, v, shape=tuple(shape)))
    return parts[0] if len(parts) == 1 else cx.b.op(mv.Concat, *parts, axis=axis)


# ---- Scan ----------------------------------------------------------------------------------

def _take(cx, x, index: int, axis: int):
    """x[..., index, ...] along ``axis``, dropping that axis."""
    return cx.b.op(mv.Gather, x, cx.b.const(np.array(index, np.int64)), axis=axis)


def scan_loop(cx, body, states: list, scan_ins: list, in_axes, in_dirs, out_axes, out_dirs):
    """One (unbatched) Scan: returns final states and stacked scan outputs."""
    length = scan_ins[0].shape[in_axes[0]] if scan_ins else 0
    if length > MAX_UNROLL:
        raise NotImplementedError(f"Scan over {length} steps; at most {MAX_UNROLL} are unrolled")
    n_out = len(body.output) - len(states)
    outs: list[list] = [[] for _ in range(n_out)]
    for t in range(length):
        steps = [_take(cx, x, length - 1 - t if d else t, a) for x, a, d in zip(scan_ins, in_axes, in_dirs)]
        bind = dict(zip((i.name for i in body.input), states + steps))
        res = run_subgraph(cx, body, bind)
        states = list(res[:len(states)])
        for acc, v in zip(outs, res[len(states):]):
            acc.append(v)
    stacked = []
    for k, vals in enumerate(outs):
        if out_dirs[k]:
            vals = vals[::-1]
        stacked.append(stack(cx, vals, out_axes[k] % (len(vals[0].shape) + 1)))
    return states, stacked


def _ints(cx, node, key, n, default=0):
    v = cx.attr(node, key)
    return [int(x) for x in v] if v else [default] * n


@converter("Scan")
def convert_scan(cx, node, ins):
    body = cx.attr(node, "body")
    n_scan = int(cx.attr(node, "num_scan_inputs"))
    if cx.opset < 9:
        return _scan8(cx, node, ins, body, n_scan)
    states, scan_ins = list(ins[:len(ins) - n_scan]), list(ins[len(ins) - n_scan:])
    n_out = len(body.output) - len(states)
    in_axes = [a % len(x.shape) for a, x in zip(_ints(cx, node, "scan_input_axes", n_scan), scan_ins)]
    in_dirs = _ints(cx, node, "scan_input_directions", n_scan)
    out_axes = _ints(cx, node, "scan_output_axes", n_out)
    out_dirs = _ints(cx, node, "scan_output_directions", n_out)
    states, stacked = scan_loop(cx, body, states, scan_ins, in_axes, in_dirs, out_axes, out_dirs)
    return states + stacked


def _scan8(cx, node, ins, body, n_scan):
    # opset 8: a leading batch axis on every state and scan input; scan along axis 1
    seq_lens, rest = ins[0], list(ins[1:])
    if seq_lens is not None:
        raise NotImplementedError("Scan-8 with sequence_lens is not supported")
    states, scan_ins = rest[:len(rest) - n_scan], rest[len(rest) - n_scan:]
    n_out = len(body.output) - len(states)
    dirs = _ints(cx, node, "directions", n_scan)
    batch = (states or scan_ins)[0].shape[0]
    finals, outs = [[] for _ in states], [[] for _ in range(n_out)]
    for bi in range(batch):
        st = [_take(cx, s, bi, 0) for s in states]
        sc = [_take(cx, x, bi, 0) for x in scan_ins]
        st, stacked = scan_loop(cx, body, st, sc, [0] * n_scan, dirs, [0] * n_out, [0] * n_out)
        for acc, v in zip(finals + outs, st + stacked):
            acc.append(v)
    return [stack(cx, vals, 0) for vals in finals + outs]
