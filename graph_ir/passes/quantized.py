"""The ``int8`` pass: QDQ contractions -> integer contractions (``QMatMul``, ``QConv``).

ONNX Runtime's ``quantize_static`` (QDQ format) writes every quantized layer as
``Q(Conv(DQ(Q(x)), DQ(w_int8), DQ(bias_int32)))``. The frontend decomposes Q and DQ into float
math (``frontends/onnx/convert_quant.py``) and keeps the weights' DQ unfolded (deferred
constants) until this pass has looked at them. The rules, tried to a fixpoint:

1. ``MatMul/Conv(DQ(xq), DQ(wq))`` -> ``QMatMul/QConv(xq, wq)`` with a float32 output
   (``DQ(v) = (float(v) - zp) * s``; the activation per tensor, the weight per tensor or per
   output channel; a Gemm's constant ``B^T`` is a transposed weight);
2. ``Add(Q*(...)_float, bias)`` -> the bias joins the epilogue: in the int32 accumulator when it
   is ``DQ(int32, scale = sx * sw, zero point 0)`` (ONNX Runtime's form), else as a float offset;
3. ``Q(Q*(...)_float)`` -> the same contraction writing uint8 / int8 (``mult / sy``, ``+ zp``,
   saturated): the requantization runs in the kernel's epilogue;
4. ``Q(DQ(q, s, z) * 2^e, s * 2^e, z)`` -> ``q`` (exact: the product is, and the rounding
   gives ``q`` back), as MinMax calibration writes around BERT's attention scaling; likewise
   ``Q(DQ(q, s, z), s, z)`` -> ``q``;
5. ``MaxPool(DQ(q))`` -> ``DQ(MaxPool(q))`` (DQ is increasing): the pool reads bytes;
6. in rule 3, ``Q(Relu(y))`` counts as ``Q(y)`` where Q's zero point is the type's least value
   (exact: both saturate a negative ``y`` to it), as PT2E quantizes a Conv + ReLU output;
7. on CPU targets with byte dot products (``vnni``, ``amx``, ``sdot``): ``MatMul(DQ(a), DQ(b))`` with
   both operands run-time bytes (through Transpose / Reshape, moved onto the bytes) ->
   ``QBatchMatMul(a, b)``, ``float32(sum (a - za)(b - zb)) * sa * sb``: a QDQ attention's two
   products in integers (the graph's float sums of float products agree to rounding);
8. on CPU targets, after the layout pass: the float steps a QDQ graph writes after a
   contraction's own QuantizeLinear (``Q(DQ(QMatMul(x)) + bias)``, BERT's projections with
   their float biases; a table lookup after it, ``int8_lut``'s GELU; a residual add and the
   DequantizeLinear a LayerNorm reads) -> the contraction's requantization program ``post``
   (``ops/quant.py``), run in its epilogue in the same float32 steps; then an attention's
   head split of a projection's bytes (Reshape, Transpose (0, 2, 1, 3)) -> the QMatMul's
   ``heads``, and the heads merged back after ``p v`` -> the QBatchMatMul's ``merge_heads``:
   each writes that layout.

Before: ``%y = Cast(Min(Max(Add(Round(Div(Conv(Mul(Sub(Cast(%xq), 128), 0.02), %w_f32), 0.1),
3), 0), 255), uint8)``. After: ``%y = QConv(%xq, %wq, %w_zp, %bias, %mult, %offset)`` with
``out_dtype=uint8``. Anything else (a per-channel activation scale, a weight quantized along K,
an activation scale that is not a constant) keeps the float decomposition, which the `fold`
pass then folds as before. Targets whose ``int8_path`` is ``none`` (GPUs) skip the pass.
"""
from __future__ import annotations

import functools

import numpy as np

from ..graph import Graph, Node, Value
from ..ops.quant import POST_INPUTS, post_start
from ..types import DType
from .dce import dce
from .rewrite import Rewriter, rewrite

QTYPES = (DType.uint8, DType.int8)
QOPS = ("QMatMul", "QConv")
BYTE_DOT_PATHS = ("vnni", "amx", "sdot")  # int8 paths whose kernels take QBatchMatMul (dp_qbmm)


def _scalar(rw: Rewriter, v: Value | None) -> float | None:
    c = rw.const(v)
    if c is None or c.size != 1:
        return None
    return float(np.asarray(c).reshape(()))


def _evaluate(rw: Rewriter, v: Value, depth: int = 8) -> np.ndarray | None:
    """The compile-time value of ``v``: a constant, or a deferred one (a chain of nodes over
    constants, evaluated with the op table's references)."""
    c = rw.const(v)
    if c is not None or depth == 0:
        return c
    n = rw.prod(v)
    if n is None or len(n.outputs) != 1:
        return None
    ins = [None if i is None else _evaluate(rw, i, depth - 1) for i in n.inputs]
    if any(a is None and i is not None for a, i in zip(ins, n.inputs)):
        return None
    return np.asarray(n.op.reference(ins, n.attrs)[0], dtype=v.dtype.np)


def _dequantized(rw: Rewriter, v: Value):
    """``v = (float(q) - zp) * s`` -> (q, zp, s) as values / constants, else None."""
    return _dequantized_node(rw, rw.prod(v, "Mul"))


def _dequantized_node(rw: Rewriter, mul: Node | None):
    """``_dequantized`` of the Mul node itself."""
    if mul is None or mul.op.name != "Mul" or mul.outputs[0].dtype is not DType.float32:
        return None
    s = rw.const(mul.inputs[1])
    if s is None:
        return None
    sub, zp = rw.prod(mul.inputs[0], "Sub"), np.zeros((), np.float32)
    cast = rw.prod(sub.inputs[0] if sub is not None else mul.inputs[0], "Cast")
    if sub is not None:
        zp = rw.const(sub.inputs[1])
        if zp is None:
            return None
    if cast is None or cast.inputs[0].dtype not in (*QTYPES, DType.int32):
        return None
    return cast.inputs[0], np.asarray(zp, np.float64), np.asarray(s, np.float32)


def _activation(rw: Rewriter, v: Value):
    """A per-tensor DQ of a run-time uint8 / int8 value -> (xq, x_zp, x_scale)."""
    d = _dequantized(rw, v)
    if d is None or d[0].dtype not in QTYPES or rw.const(d[0]) is not None:
        return None
    xq, zp, s = d
    if zp.size != 1 or s.size != 1 or float(zp.reshape(())) != int(zp.reshape(())):
        return None
    return xq, int(zp.reshape(())), np.float32(s.reshape(()))


def _weight(rw: Rewriter, v: Value, out_axis: int):
    """A DQ of a constant int8 / uint8 weight (per tensor or per ``out_axis`` channel), maybe
    transposed (a Gemm's B^T) -> (wq, zp[N] int32, scale[N] float32), else None."""
    perm = None
    t = rw.prod(v, "Transpose")
    if t is not None:
        perm, v = tuple(t.attrs["perm"]), t.inputs[0]
    d = _dequantized(rw, v)
    if d is None or d[0].dtype not in QTYPES:
        return None
    wq = _evaluate(rw, d[0])
    if wq is None:
        return None
    if perm is not None:
        wq = np.ascontiguousarray(wq.transpose(perm))
    zp = np.broadcast_to(d[1], v.shape)
    s = np.broadcast_to(d[2], v.shape)
    if perm is not None:
        zp, s = zp.transpose(perm), s.transpose(perm)
    zp, s = np.moveaxis(zp, out_axis, 0), np.moveaxis(s, out_axis, 0)
    zp1, s1 = zp.reshape(zp.shape[0], -1), s.reshape(s.shape[0], -1)
    if not ((zp1 == zp1[:, :1]).all() and (s1 == s1[:, :1]).all()):
        return None  # quantized along the reduction: not one scale per output channel
    zq = zp1[:, 0]
    if (zq != np.rint(zq)).any():
        return None
    return wq, zq.astype(np.int32), s1[:, 0].astype(np.float32)


def contraction(node: Node, rw: Rewriter, symbolic_rows: bool = False) -> Value | None:
    # MatMul/Conv(DQ(xq), DQ(wq)) -> QMatMul/QConv(xq, wq) with a float32 output;
    # symbolic_rows: a MatMul's leading dims may be symbolic (the C kernels read m at run time)
    is_conv = node.op.name == "Conv"
    if is_conv and (node.attrs["group"] != 1 or node.attrs["layout"] != "NCHW"
                    or len(node.inputs[0].shape) != 4):
        return None
    if not is_conv and (len(node.inputs[1].shape) != 2 or len(node.inputs[0].shape) < 2):
        return None
    shape = node.inputs[0].shape
    if not all(isinstance(d, int) for d in (shape[-1:] if symbolic_rows and not is_conv else shape)):
        return None
    x = _activation(rw, node.inputs[0])
    w = _weight(rw, node.inputs[1], 0 if is_conv else 1)
    if x is None or w is None:
        return None
    (xq, x_zp, sx), (wq, w_zp, sw) = x, w
    n = sw.shape[0]
    mult = (sx * sw).astype(np.float32)
    bias, offset = np.zeros(n, np.int32), np.zeros(n, np.float32)
    if is_conv and len(node.inputs) > 2 and node.inputs[2] is not None:
        b = _bias(rw, node.inputs[2], mult, n)
        if b is None:
            return None
        bias, offset = b
    ins = [xq, rw.new_const(wq, node.name + "_wq", _like(wq, xq)),
           *_vectors(rw, node.name, w_zp, bias, mult, offset, xq)]
    if is_conv:
        attrs = {k: node.attrs[k] for k in ("strides", "pads", "dilations")}
        return rw.emit("QConv", ins, node.name, x_zp=x_zp, **attrs)
    return rw.emit("QMatMul", ins, node.name, x_zp=x_zp)


def _moved_activation(rw: Rewriter, v: Value):
    """``Transpose/Reshape*(DQ(q))``, a run-time uint8 / int8 ``q`` per tensor -> (the same
    movement emitted on the bytes, zp, scale), else None."""
    moves = []
    while (m := rw.prod(v)) is not None and m.op.name in MOVES and len(m.inputs) == 1:
        moves.append(m)
        v = m.inputs[0]
    d = _activation(rw, v)
    if d is None:
        return None
    q, zp, s = d
    for m in reversed(moves):
        q = rw.emit(m.op.name, [q], m.name + "_q", **m.attrs)
    return q, zp, s


def batch_matmul(node: Node, rw: Rewriter) -> Value | None:
    # MatMul(DQ(a), DQ(b)) with both operands run-time bytes (a QDQ attention's q k^T and p v,
    # through the heads' transposes) -> QBatchMatMul(a, b): exact integer sums, one scale
    if not all(isinstance(d, int) for v in node.inputs for d in v.shape) or \
            len(node.inputs[0].shape) < 2 or len(node.inputs[0].shape) != len(node.inputs[1].shape):
        return None
    if rw.const(node.inputs[1]) is not None or _evaluate(rw, node.inputs[1], 2) is not None:
        return None
    a, b = _moved_activation(rw, node.inputs[0]), _moved_activation(rw, node.inputs[1])
    if a is None or b is None:
        return None
    (qa, za, sa), (qb, zb, sb) = a, b
    qb, trans = _rows_of_b(rw, qb)
    return rw.emit("QBatchMatMul", [qa, qb], node.name, a_zp=za, b_zp=zb,
                   scale=float(np.float32(sa) * np.float32(sb)), trans_b=trans)


def _rows_of_b(rw: Rewriter, qb: Value) -> tuple[Value, int]:
    """``b`` moved last by a Transpose that makes its last axis (k^T: the keys' channels
    become b's rows) -> the same transpose with b's last two axes swapped back and
    ``trans_b``: b read as [..., N, K], its rows contiguous (a head split, which the key
    projection's epilogue writes), else (qb, 0)."""
    t = rw.prod(qb, "Transpose")
    perm = tuple(t.attrs["perm"]) if t is not None else ()
    last = len(perm) - 1
    if len(perm) < 2 or perm[-1] == last or perm[-2] != last:
        return qb, 0
    swapped = (*perm[:-2], perm[-1], perm[-2])
    if swapped == tuple(range(len(perm))):
        return t.inputs[0], 1
    return rw.emit("Transpose", [t.inputs[0]], t.name + "_rows", perm=swapped), 1


def _like(arr: np.ndarray, v: Value):
    """A stand-in value whose dtype ``new_const`` takes (the array's own)."""
    from ..types import TensorType
    return Value("dtype", TensorType(tuple(arr.shape), DType.from_np(arr.dtype)))


def _vectors(rw: Rewriter, name: str, w_zp, bias, mult, offset, like: Value) -> list[Value]:
    arrays = (("w_zp", w_zp.astype(np.int32)), ("bias", bias.astype(np.int32)),
              ("mult", mult.astype(np.float32)), ("offset", offset.astype(np.float32)))
    return [rw.new_const(a, f"{name}_{k}", _like(a, like)) for k, a in arrays]


def _bias(rw: Rewriter, v: Value, mult: np.ndarray, n: int):
    """A bias over the output channels -> (int32 bias, float32 offset): integer when it is
    DQ(int32) at exactly the accumulator's scale with zero point 0 (ONNX Runtime adds it to
    the int32 accumulator then), else a float offset added after scaling."""
    d = _dequantized(rw, v)
    if d is not None and d[0].dtype is DType.int32 and not d[1].any():
        q = _evaluate(rw, d[0])
        s = np.broadcast_to(d[2], v.shape).reshape(-1)
        if q is not None and q.size == n and s.size == n and (s == mult).all():
            return q.reshape(n).astype(np.int32), np.zeros(n, np.float32)
    f = _evaluate(rw, v)
    if f is None or f.size not in (1, n) or f.dtype != np.float32:
        return None
    return np.zeros(n, np.int32), np.broadcast_to(f.reshape(-1), (n,)).astype(np.float32)


def _qnode(rw: Rewriter, v: Value | None, out: str = "float32") -> Node | None:
    n = rw.prod(v)
    if n is None or n.op.name not in QOPS or n.attrs["out_dtype"] != out or not rw.single_use(v):
        return None
    return n


def _channel_axis(node: Node) -> int:
    return 1 if node.op.name == "QConv" and node.attrs["layout"] == "NCHW" else \
        len(node.outputs[0].shape) - 1


def add_bias(node: Node, rw: Rewriter) -> Value | None:
    # Add(Q*(x)_float, b) -> Q*(x) with b in its epilogue (b per output channel or scalar)
    for k in (0, 1):
        q = _qnode(rw, node.inputs[k])
        other = node.inputs[1 - k]
        if q is None or other is None or node.outputs[0].shape != q.outputs[0].shape:
            continue
        shape, axis = q.outputs[0].shape, _channel_axis(q)
        n = shape[axis]
        want = [1] * len(shape)
        want[axis] = n
        oshape = (1,) * (len(shape) - len(other.shape)) + tuple(other.shape)
        if any(d != 1 and d != w for d, w in zip(oshape, want)):
            continue
        ins = list(q.inputs)
        b = _bias(rw, other, rw.const(ins[4]), n)
        if b is None:
            continue
        bias = rw.const(ins[3]) + b[0]
        offset = rw.const(ins[5]) + b[1]
        ins[3] = rw.new_const(bias.astype(np.int32), q.name + "_bias", ins[3])
        ins[5] = rw.new_const(offset.astype(np.float32), q.name + "_offset", ins[5])
        return rw.emit(q.op.name, ins, q.name, **q.attrs)
    return None


def _quantize(node: Node, rw: Rewriter):
    """``Cast(Min(Max(Add(Round(Div(y, sy)), zy), lo), hi))`` to uint8 / int8 (a
    QuantizeLinear) -> (y, sy, zy, the chain's inner values), else None."""
    to = node.outputs[0].dtype
    if to not in QTYPES:
        return None
    info = np.iinfo(to.np)
    mn = rw.prod(node.inputs[0], "Min")
    mx = rw.prod(mn.inputs[0], "Max") if mn is not None else None
    if mx is None or _scalar(rw, mn.inputs[1]) != info.max or _scalar(rw, mx.inputs[1]) != info.min:
        return None
    add = rw.prod(mx.inputs[0], "Add")
    zy = _scalar(rw, add.inputs[1]) if add is not None else 0.0
    rnd = rw.prod(add.inputs[0] if add is not None else mx.inputs[0], "Round")
    div = rw.prod(rnd.inputs[0], "Div") if rnd is not None else None
    sy = _scalar(rw, div.inputs[1]) if div is not None else None
    if zy is None or sy is None or zy != int(zy) or not sy > 0:
        return None
    chain = [v for v in (div.outputs[0], rnd.outputs[0], add and add.outputs[0], mx.outputs[0],
                         mn.outputs[0]) if v is not None]
    y = div.inputs[0]
    relu = rw.prod(y, "Relu")
    if relu is not None and zy == info.min:
        # Q(Relu(y)) = Q(y) where the zero point is the type's least value: a negative y
        # rounds to at most the zero point and saturates to it, as Relu's 0 does (PT2E
        # quantizes a Conv + ReLU output so)
        chain.insert(0, y)
        y = relu.inputs[0]
    return y, sy, int(zy), chain


def requantize(node: Node, rw: Rewriter) -> Value | None:
    # Cast(Min(Max(Add(Round(Div(Q*(x)_float, sy)), zy), lo), hi)) -> Q*(x) writing uint8/int8
    quant = _quantize(node, rw)
    if quant is None:
        return None
    y, sy, zy, chain = quant
    q = _qnode(rw, y)
    if q is None or not all(rw.single_use(v) for v in chain):
        return None
    ins = list(q.inputs)
    sy32 = np.float32(sy)
    ins[4] = rw.new_const((rw.const(ins[4]) / sy32).astype(np.float32), q.name + "_mult", ins[4])
    ins[5] = rw.new_const((rw.const(ins[5]) / sy32).astype(np.float32), q.name + "_offset",
                          ins[5])
    to = node.outputs[0].dtype
    return rw.emit(q.op.name, ins, q.name, **dict(q.attrs, out_dtype=to.name, out_zp=zy))


def _power_of_two(c: float | None) -> bool:
    return c is not None and c > 0 and np.isfinite(c) and np.frexp(np.float32(c))[0] == 0.5


def rescale_identity(node: Node, rw: Rewriter) -> Value | None:
    # Q(DQ(q, s, z) * 2^e, s * 2^e, z) -> q: the product is exact, so y / (s * 2^e) rounds as
    # fl((q - z) * s) / s does: within 255 * 2^-24 of q - z, and rint gives it back
    quant = _quantize(node, rw)
    if quant is None:
        return None
    y, sy, zy, _ = quant
    scale = rw.prod(y)
    if scale is None or scale.op.name not in ("Mul", "Div"):
        return None
    k = _evaluate(rw, scale.inputs[1])  # a constant, or itself a DQ of one
    c = float(k.reshape(())) if k is not None and k.size == 1 else None
    if scale.op.name == "Div" and c:
        c = 1.0 / c
    d = _dequantized(rw, scale.inputs[0])
    if not _power_of_two(c) or d is None or d[0].dtype is not node.outputs[0].dtype:
        return None
    q, zp, s = d
    if zp.size != 1 or s.size != 1 or float(zp.reshape(())) != zy or \
            np.float32(s.reshape(())) * np.float32(c) != np.float32(sy):
        return None
    return q


MOVES = ("Transpose", "Reshape")  # value-preserving, one data input


def requantize_identity(node: Node, rw: Rewriter) -> Value | None:
    # Q(DQ(q, s, z), s, z) -> q (the product and the quotient round within 2^-23 of q - z);
    # through movement ops, Q(Transpose(DQ(q, s, z)), s, z) -> Transpose(q): a QDQ attention's
    # heads merged back (BERT's Transpose and Reshape, each wrapped in the same Q/DQ pair)
    quant = _quantize(node, rw)
    if quant is None:
        return None
    y, sy, zy, _ = quant
    moves = []
    while (m := rw.prod(y)) is not None and m.op.name in MOVES and len(m.inputs) == 1:
        moves.append(m)
        y = m.inputs[0]
    d = _dequantized(rw, y)
    if d is None or d[0].dtype is not node.outputs[0].dtype or d[1].size != 1 or \
            d[2].size != 1 or float(d[1].reshape(())) != zy or \
            np.float32(d[2].reshape(())) != np.float32(sy):
        return None
    q = d[0]
    for m in reversed(moves):  # the same movement, on the bytes
        q = rw.emit(m.op.name, [q], m.name + "_q", **m.attrs)
    return q


def max_pool(node: Node, rw: Rewriter) -> Value | None:
    # MaxPool(DQ(q)) -> DQ(MaxPool(q)): a per-tensor DQ with a positive scale is increasing,
    # so the pool runs on the bytes (and a Q after it cancels: requantize_identity)
    if node.attrs["mode"] != "max" or node.attrs["indices"]:
        return None
    d = _activation(rw, node.inputs[0])
    if d is None or not d[2] > 0:
        return None
    xq, zp, s = d
    pooled = rw.emit("Pool", [xq], node.name, **node.attrs)
    v = rw.emit("Cast", [pooled], node.name + "_dq", to=DType.float32)
    if zp:
        v = rw.emit("Sub", [v, rw.new_const(np.float32(zp), node.name + "_zp", v)],
                    node.name + "_dq")
    return rw.emit("Mul", [v, rw.new_const(np.float32(s), node.name + "_s", v)],
                   node.name + "_dq")


def _dq_chain(rw: Rewriter, v: Value) -> list[Value] | None:
    """The values of ``v = Mul(Sub?(Cast(q), zp), s)`` from ``v`` down to the Cast's output,
    if each is read once (by the next), else None."""
    out = [v]
    n = rw.prod(v)
    while n is not None and n.op.name in ("Mul", "Sub", "Cast"):
        if n.op.name == "Cast":
            return out if all(rw.single_use(x) for x in out) else None
        out.append(n.inputs[0])
        n = rw.prod(n.inputs[0])
    return None


def _dq_values(rw: Rewriter, v: Value) -> list[Value]:
    """The values of ``v = Sub?(Cast(q), zp)`` (a DequantizeLinear's inner steps) from ``v``
    down to the Cast's output."""
    out, n = [v], rw.prod(v)
    while n is not None and n.op.name in ("Mul", "Sub"):
        out.append(n.inputs[0])
        n = rw.prod(n.inputs[0])
    return out


def residual_add(node: Node, rw: Rewriter) -> Value | None:
    # Q(Relu?(DQ(QConv(x)) + DQ(r))) -> QConv(x, ..., r): a QDQ residual block's add, ReLU and
    # requantization in the convolution's epilogue (CPU; see ops/quant.py for the arithmetic);
    # likewise Q(Relu?(QConv(x)_float + DQ(r))), PT2E's form
    quant = _quantize(node, rw)
    if quant is None or not all(rw.single_use(v) for v in quant[3]):
        return None
    y, so, zo, _ = quant
    relu = rw.prod(y, "Relu")
    add = rw.prod(relu.inputs[0] if relu is not None else y, "Add")
    if add is None or not rw.single_use(y) or relu is not None and not rw.single_use(add.outputs[0]):
        return None
    for k in (0, 1):
        mid = _mid(rw, add.inputs[k])
        e = _dequantized(rw, add.inputs[1 - k])
        if mid is None or e is None:
            continue
        conv, q, mid_attrs = mid
        r, zr, sr = e
        if not (r.dtype in QTYPES and tuple(r.shape) == tuple(q.shape) and zr.size == 1
                and sr.size == 1 and zr.item() == int(zr.item())):
            continue
        attrs = dict(conv.attrs, out_dtype=node.outputs[0].dtype.name, out_zp=zo, **mid_attrs,
                     res_zp=int(zr.item()), res_scale=sr.item(), out_scale=float(so),
                     relu=int(relu is not None))
        return rw.emit("QConv", [*conv.inputs, r], conv.name + "_res", **attrs)
    return None


def _mid(rw: Rewriter, v: Value):
    """The convolution a residual add reads: ``DQ(QConv(x))`` requantized (ONNX Runtime's QDQ
    form) or ``QConv(x)`` in float32 (PT2E's: no quantization between the convolution and the
    add) -> (its node, its output, the ``mid_*`` attributes), else None."""
    conv = rw.prod(v, "QConv")
    if conv is not None:  # float32 out: the residual adds to the float value itself
        ok = conv.attrs["out_dtype"] == "float32" and rw.single_use(v)
        return (conv, v, {"mid_dtype": "float32", "mid_zp": 0, "mid_scale": 1.0}) \
            if ok and _residual_ready(conv) else None
    d = _dequantized(rw, v)
    conv = rw.prod(d[0], "QConv") if d is not None else None
    if conv is None or not _residual_ready(conv):
        return None
    q, z1, s1 = d
    if not (conv.attrs["out_dtype"] in ("uint8", "int8") and z1.size == 1 and s1.size == 1
            and z1.item() == conv.attrs["out_zp"] and rw.single_use(q)
            and _dq_chain(rw, v) is not None):
        return None
    return conv, q, {"mid_dtype": conv.attrs["out_dtype"], "mid_zp": conv.attrs["out_zp"],
                     "mid_scale": s1.item()}


def _residual_ready(conv: Node) -> bool:
    return len(conv.inputs) <= 6 and conv.attrs["layout"] == "NHWC"


def _post_base(rw: Rewriter, v: Value, want_float: bool):
    """``v`` the output of a contraction that can take (more) requantization steps -> (the
    node, its program so far, its extra inputs), else None: a QMatMul or channels-last QConv
    read once, its output requantized to bytes, or a QBatchMatMul's float output (or either
    already carrying a program)."""
    n = rw.prod(v)
    if n is None or n.op.name not in (*QOPS, "QBatchMatMul") or not rw.single_use(v):
        return None
    if n.op.name == "QConv" and n.attrs["layout"] != "NHWC":
        return None
    if n.attrs["post"]:
        return (n, list(n.attrs["post"]), list(n.inputs[post_start(n.op.name):])) \
            if (n.attrs["out_dtype"] == "float32") == want_float else None
    if n.op.name == "QBatchMatMul":  # a program from its float value
        return (n, [], []) if want_float else None
    if want_float or n.attrs["out_dtype"] not in ("uint8", "int8") or len(n.inputs) != 6:
        return None
    return n, [], []


def _post_int(rw: Rewriter, v: Value, root: Node | None = None):
    """The program that computes the byte ``v`` from a contraction: a QuantizeLinear or a
    table lookup over the program of its operand -> (base, steps, extras), else None (``v``
    read once, unless ``root``, the rewritten node, writes it)."""
    base = _post_base(rw, v, False) if root is None else None
    if base is not None:
        return base
    n = root or rw.prod(v)
    if n is None or n.op.name != "Cast" or not (root or rw.single_use(v)):
        return None
    quant = _quantize(n, rw)
    if quant is not None:
        y, sy, zy, chain = quant
        inner = _post_float(rw, y) if all(rw.single_use(c) for c in chain) else None
        return inner and _extend(inner, ("q", float(np.float32(sy)), zy,
                                         n.outputs[0].dtype.name))
    gather = rw.prod(n.inputs[0], "Gather")
    if gather is None or not rw.single_use(n.inputs[0]):
        return None
    table, idx = rw.const(gather.inputs[0]), gather.inputs[1]
    if table is None or table.shape != (256,) or idx.dtype is not DType.uint8:
        return None
    cast = rw.prod(idx, "Cast")  # an int8 byte indexes by its bit pattern
    if cast is not None and cast.inputs[0].dtype is DType.int8 and rw.single_use(idx):
        idx = cast.inputs[0]
    inner = _post_int(rw, idx)
    return inner and _extend(inner, ("lut", n.outputs[0].dtype.name), table.astype(np.int32))


def _post_float(rw: Rewriter, x: Value, root: Node | None = None):
    """The program that computes the float ``x`` from a contraction's bytes: a
    DequantizeLinear, then adds of a per-channel constant or of a dequantized residual, and
    ReLU -> (base, steps, extras), else None."""
    base = _post_base(rw, x, True) if root is None else None
    if base is not None:
        return base
    n = root or rw.prod(x)
    if n is None or not (root or rw.single_use(x)) or n.op.name not in ("Relu", "Add", "Mul"):
        return None
    if n.op.name == "Relu":
        inner = _post_float(rw, n.inputs[0])
        return inner and _extend(inner, ("relu",))
    if n.op.name == "Mul":  # a DequantizeLinear
        d = _dequantized_node(rw, n)
        if d is None or d[0].dtype not in QTYPES or d[1].size != 1 or d[2].size != 1 or \
                not all(rw.single_use(v) for v in _dq_values(rw, n.inputs[0])):
            return None
        inner = _post_int(rw, d[0])
        return inner and _extend(inner, ("dq", float(d[1].reshape(())),
                                         float(np.float32(d[2].reshape(())))))
    for k in (0, 1):
        inner = _post_float(rw, n.inputs[k])
        if inner is None or tuple(n.inputs[k].shape) != tuple(x.shape):
            continue
        step = _addend(rw, n.inputs[1 - k], x, inner[0])
        return step and _extend(inner, *step)
    return None


def _addend(rw: Rewriter, v: Value, out: Value, base: Node):
    """An Add's other operand -> the step and its extra input: a constant over the last axis
    (``addc``), a run-time float vector over it (``addv``) or over the last two (``addm``: an
    attention's mask added to every head's scores; the output one matrix, or the batches of a
    QBatchMatMul, whose programs index within one), or ``DQ(r)`` of run-time bytes of the
    output's shape (``addr``), else None."""
    c = rw.const(v)
    if c is None:
        c = _evaluate(rw, v, 2)
    n = out.shape[-1]
    if c is not None:
        if c.dtype != np.float32 or any(d != 1 for d in c.shape[:-1]) or \
                (c.shape and c.shape[-1] not in (1, n)) or len(c.shape) > len(out.shape):
            return None
        return ("addc",), np.broadcast_to(c.reshape(-1), (n,)).astype(np.float32)
    e = _dequantized(rw, v)
    if e is not None and e[0].dtype in QTYPES and tuple(e[0].shape) == tuple(out.shape) and \
            e[1].size == 1 and e[2].size == 1 and rw.const(e[0]) is None:
        return ("addr", float(e[1].reshape(())), float(np.float32(e[2].reshape(())))), e[0]
    if v.dtype is not DType.float32 or not v.shape or len(v.shape) > len(out.shape):
        return None
    if tuple(v.shape[-1:]) == (n,) and all(d == 1 for d in v.shape[:-1]):
        return ("addv",), v
    one_matrix = base.op.name == "QBatchMatMul" or all(d == 1 for d in out.shape[:-2])
    if len(v.shape) >= 2 and one_matrix and tuple(v.shape[-2:]) == tuple(out.shape[-2:]) and \
            all(d == 1 for d in v.shape[:-2]):
        return ("addm",), v
    return None


def _extend(found, step: tuple, extra=None):
    """(base, steps, extras) with one more step (and its extra input); None past the C
    kernels' limits (eight steps, one extra input of each kind)."""
    base, steps, extras = found
    slot = POST_INPUTS.get(step[0])
    if len(steps) >= MAX_POST or slot and any(POST_INPUTS.get(s[0]) == slot for s in steps):
        return None
    return base, [*steps, step], extras + ([extra] if step[0] in POST_INPUTS else [])


MAX_POST = 8  # requantization steps per contraction (qgemm.h dp_qprog)


def post_chain(node: Node, rw: Rewriter) -> Value | None:
    # (Q | lookup | DQ)(...(DQ(Q*(x)_bytes) + c)...) -> Q*(x) with the steps as its
    # requantization program (rule 8): one kernel instead of a contraction and an
    # elementwise kernel that reads its bytes back
    out = node.outputs[0]
    found = _post_int(rw, out, node) if out.dtype in QTYPES else \
        _post_float(rw, out, node) if node.op.name == "Mul" else None
    if found is None or not found[1] or found[0].attrs["post"] == tuple(found[1]):
        return None
    base, steps, extras = found
    if out.dtype is DType.float32 and not base.attrs["post"] and len(steps) == 1:
        return None  # a lone DequantizeLinear: its consumer fuses it
    ins = list(base.inputs[:post_start(base.op.name)])
    for e in extras:
        ins.append(e if isinstance(e, Value) else
                   rw.new_const(e, f"{base.name}_post{len(ins)}", _like(e, base.inputs[0])))
    attrs = dict(base.attrs, post=tuple(steps), out_dtype=out.dtype.name)
    if base.op.name != "QBatchMatMul":
        attrs["out_zp"] = 0
        if not base.attrs["post"]:
            attrs.update(mid_dtype=base.attrs["out_dtype"], mid_zp=base.attrs["out_zp"])
    return rw.emit(base.op.name, ins, base.name if base.attrs["post"] else base.name + "_post",
                   **attrs)


def head_split(node: Node, rw: Rewriter) -> Value | None:
    # Transpose(Reshape(QMatMul(x)), (0, 2, 1, 3)): [B, S, H * D] -> [B, H, S, D], an
    # attention's heads split off a projection -> the QMatMul writes that layout itself
    # (D a whole number of 16-column panels; a projection with a requantization program, as
    # QDQ BERT's are; no residual or mask step, whose inputs keep the projection's layout)
    if tuple(node.attrs["perm"]) != (0, 2, 1, 3):
        return None
    r = rw.prod(node.inputs[0], "Reshape")
    q = rw.prod(r.inputs[0], "QMatMul") if r is not None else None
    if q is None or q.attrs["heads"] or not rw.single_use(r.inputs[0]) or \
            not rw.single_use(node.inputs[0]):
        return None
    shape, split = tuple(q.outputs[0].shape), tuple(r.outputs[0].shape)
    if len(shape) != 3 or not all(isinstance(d, int) for d in (*shape, *split)) or \
            split[:2] != shape[:2] or len(split) != 4 or split[2] * split[3] != shape[2] or \
            split[3] % 16 or not q.attrs["post"] or \
            any(s[0] in ("addr", "addm") for s in q.attrs["post"]):
        return None  # (the epilogue of a program writes heads: qgemm.h dp_q_store_post)
    return rw.emit("QMatMul", list(q.inputs), q.name, **dict(q.attrs, heads=split[2]))


def merge_heads(node: Node, rw: Rewriter) -> Value | None:
    # Transpose(QBatchMatMul(p, v), (0, 2, 1, 3)): an attention's heads merged back ->
    # the product writes each head's rows into the merged layout
    q = rw.prod(node.inputs[0], "QBatchMatMul")
    if tuple(node.attrs["perm"]) != (0, 2, 1, 3) or q is None or q.attrs["merge_heads"] or \
            not rw.single_use(node.inputs[0]) or len(q.outputs[0].shape) != 4 or \
            any(s[0] in ("addr", "addm") for s in q.attrs["post"]):
        return None
    return rw.emit("QBatchMatMul", list(q.inputs), q.name, **dict(q.attrs, merge_heads=1))


def fold_residuals(g: Graph, target=None) -> Graph:
    """QDQ residual adds into the channels-last QConv before them (``residual_add``), then
    the remaining float steps after a contraction's bytes into its requantization program
    (``post_chain``), on CPU targets with int8 kernels (after the layout pass: the C template
    indexes a residual as its output, NHWC; GPUs fuse the same chains as the kernel's
    elementwise epilogue)."""
    if target is None or target.kind != "cpu" or target.int8_path() == "none":
        return g
    g, fired = rewrite(g, [("Cast", residual_add)])
    g, more = rewrite(dce(g) if fired else g, [("Cast", post_chain), ("Mul", post_chain)])
    g, split = rewrite(dce(g) if more else g, [("Transpose", head_split),
                                               ("Transpose", merge_heads)])
    return dce(g) if fired or more or split else g


RULES = [("MatMul", contraction), ("Conv", contraction), ("Add", add_bias), ("Cast", requantize),
         ("Cast", rescale_identity), ("Cast", requantize_identity), ("Pool", max_pool)]


def fold_qdq(g: Graph, target=None) -> Graph:
    """Integer contractions for QDQ groups (see the module docstring) on targets with int8
    kernels."""
    if target is None or target.int8_path() == "none":
        return g
    rules = RULES
    if target.kind == "cpu":  # the C template takes a MatMul's rows from the dims
        rules = [(op, functools.partial(contraction, symbolic_rows=True) if fn is contraction
                  else fn) for op, fn in RULES]
        if target.int8_path(target.cpu_isa()) in BYTE_DOT_PATHS:  # run-time operands, vpdpbusd
            rules.append(("MatMul", batch_matmul))
    g, fired = rewrite(g, rules)
    return dce(g) if fired else g
