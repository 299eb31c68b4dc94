"""ONNX converters: Attention (opsets 23-25) and RotaryEmbedding (opset 23).

Both decompose into core ops. Attention becomes the pattern the fusion pass recognises:

    scores = MatMul(Q, Transpose(K)) * scale      [-> softcap: tanh(s / c) * c]
    scores = scores + bias                        (mask, causal, window, padding; 0 or -inf)
    P      = Softmax(scores)                      [-> Where(row fully masked, 0, P)]
    Y      = MatMul(P, V)

The additive bias is built from the attention mask, the causal / sliding-window frontier and the
``nonpad_kv_seqlen`` padding with Where/Less/Add; when all of them are compile-time constants it
folds into one constant. Grouped-query attention does not repeat K/V: the query heads are
grouped as (B, Hkv, rep, S, D) and MatMul broadcasts K/V over the ``rep`` axis.
"""
from __future__ import annotations

import numpy as np

from ...graph_ir.ops import contraction as ct
from ...graph_ir.ops import elementwise as ew
from ...graph_ir.ops import movement as mv
from ...graph_ir.ops import nn
from ...graph_ir.ops import reduction as rd
from ...graph_ir.types import DType
from .convert_movement import pad_of, reshape_to, slice_of
from .registry import converter


def _const(cx, value, dtype: DType, name: str = "const"):
    return cx.b.const(np.asarray(value, dtype=dtype.np), name, dtype)


def _to_heads(cx, x, heads: int, name: str):
    """(B, S, H*D) -> (B, H, S, D)."""
    b, s, hidden = x.shape
    if hidden % heads:
        raise ValueError(f"Attention: hidden size {hidden} of {name} is not divisible by "
                         f"{heads} heads")
    x = reshape_to(cx, x, (b, s, heads, hidden // heads))
    return cx.b.op(mv.Transpose, x, perm=(0, 2, 1, 3))


def _neg_inf_where(cx, allowed, dtype: DType):
    """Additive bias: 0 where ``allowed``, -inf elsewhere."""
    return cx.b.op(ew.Where, allowed, _const(cx, 0, dtype), _const(cx, -np.inf, dtype))


def _mask_bias(cx, mask, kv_len: int, dtype: DType):
    """The attention mask as an additive bias whose last axis covers all ``kv_len`` keys (a short
    mask is padded with 'masked')."""
    short = kv_len - mask.shape[-1]
    if short < 0:
        raise ValueError(f"Attention: attn_mask has {mask.shape[-1]} keys, more than the "
                         f"{kv_len} keys of K (past included)")
    if mask.dtype is DType.bool:
        if short:
            fill = cx.b.const(np.array(False), "mask_pad")
            mask = pad_of(cx, mask, [0] * (len(mask.shape) * 2 - 1) + [short], "constant", fill)
        return _neg_inf_where(cx, mask, dtype)
    if mask.dtype is not dtype:
        mask = cx.b.op(ew.Cast, mask, to=dtype)
    if short:
        fill = _const(cx, -np.inf, dtype, "mask_pad")
        mask = pad_of(cx, mask, [0] * (len(mask.shape) * 2 - 1) + [short], "constant", fill)
    return mask


def _frontier_bias(cx, node, sq: int, kv: int, past: int, nonpad, dtype: DType):
    """Causal and sliding-window bias. A query at row i sits at absolute position
    p = i + offset, where offset is the past length, or nonpad_kv_seqlen[b] - sq with an
    external cache; it sees key j iff j <= p (causal), p - j <= left and j - p <= right."""
    causal = bool(cx.attr(node, "is_causal", 0))
    left = int(cx.attr(node, "left_window_size", -1))
    right = int(cx.attr(node, "right_window_size", -1))
    if not causal and left < 0 and right < 0:
        return None
    # d[i, j] = i - j + offset  (per batch with nonpad: shape (B, 1, sq, kv))
    base = np.arange(sq)[:, None] - np.arange(kv)[None, :]
    if nonpad is not None:
        off = cx.b.op(ew.Sub, cx.b.op(ew.Cast, nonpad, to=DType.int64),
                      _const(cx, sq, DType.int64))
        off = reshape_to(cx, off, (nonpad.shape[0], 1, 1, 1))
        d = cx.b.op(ew.Add, _const(cx, base[None, None], DType.int64, "frontier"), off)
    else:
        d = _const(cx, base + past, DType.int64, "frontier")
    conds = []
    if causal:
        conds.append(cx.b.op(ew.GreaterOrEqual, d, _const(cx, 0, DType.int64)))
    if left >= 0:
        conds.append(cx.b.op(ew.LessOrEqual, d, _const(cx, left, DType.int64)))
    if right >= 0:
        conds.append(cx.b.op(ew.GreaterOrEqual, d, _const(cx, -right, DType.int64)))
    allowed = conds[0]
    for c in conds[1:]:
        allowed = cx.b.op(ew.And, allowed, c)
    return _neg_inf_where(cx, allowed, dtype)


def _padding_bias(cx, nonpad, kv: int, dtype: DType):
    """Keys j >= nonpad_kv_seqlen[b] are masked: a (B, 1, 1, kv) bias."""
    lens = reshape_to(cx, cx.b.op(ew.Cast, nonpad, to=DType.int64), (nonpad.shape[0], 1))
    allowed = cx.b.op(ew.Less, _const(cx, np.arange(kv)[None, :], DType.int64, "key_pos"), lens)
    bias = _neg_inf_where(cx, allowed, dtype)
    return reshape_to(cx, bias, (nonpad.shape[0], 1, 1, kv))


def _attention_bias(cx, node, mask, nonpad, sq: int, kv: int, past: int, dtype: DType):
    parts = []
    if mask is not None:
        parts.append(_mask_bias(cx, mask, kv, dtype))
    frontier = _frontier_bias(cx, node, sq, kv, past, nonpad, dtype)
    if frontier is not None:
        parts.append(frontier)
    if nonpad is not None:
        parts.append(_padding_bias(cx, nonpad, kv, dtype))
    bias = None
    for p in parts:
        bias = p if bias is None else cx.b.op(ew.Add, bias, p)
    if bias is not None and len(bias.shape) < 4:
        bias = reshape_to(cx, bias, (1,) * (4 - len(bias.shape)) + tuple(bias.shape))
    return bias


def _group_heads(cx, x, hkv: int, rep: int):
    """(B, H, S, D) -> (B, Hkv, rep, S, D) when H == Hkv * rep, or (B, 1, 1, S, D) when H == 1;
    heads h = g * rep + r (K/V head g serves query heads g*rep .. g*rep + rep - 1)."""
    b, h, s, d = x.shape
    if h == 1:
        return reshape_to(cx, x, (b, 1, 1, s, d))
    if h != hkv * rep:
        raise ValueError(f"Attention: {h} heads do not broadcast against {hkv * rep} query heads")
    return reshape_to(cx, x, (b, hkv, rep, s, d))


def _softmax_dtype(cx, node, dtype: DType) -> DType:
    code = cx.attr(node, "softmax_precision")
    return dtype if code is None else DType.from_onnx(int(code))


def _guard_rows(cx, probs, bias, dtype: DType):
    """Rows whose bias is -inf everywhere have no key to attend: their probabilities are 0
    (Where, not a multiply: the softmax of such a row is NaN)."""
    if bias is None:
        return probs
    known = cx.b.value_of(bias)
    if known is not None and not np.isneginf(np.asarray(known, np.float64).max(axis=-1)).any():
        return probs
    row_max = cx.b.op(rd.ReduceMax, bias, axes=(len(bias.shape) - 1,), keepdims=1)
    masked = cx.b.op(ew.Equal, row_max, _const(cx, -np.inf, bias.dtype))
    return cx.b.op(ew.Where, masked, _const(cx, 0, dtype), probs)


@converter("Attention")
def convert_attention(cx, node, ins):
    q, k, v, mask, past_k, past_v, nonpad = (list(ins) + [None] * 7)[:7]
    rank3 = len(q.shape) == 3
    if rank3:
        qh, kvh = cx.attr(node, "q_num_heads"), cx.attr(node, "kv_num_heads")
        if qh is None or kvh is None:
            raise ValueError("Attention: 3-D Q/K/V need the q_num_heads and kv_num_heads attributes")
        q, k, v = _to_heads(cx, q, qh, "Q"), _to_heads(cx, k, kvh, "K"), _to_heads(cx, v, kvh, "V")
    elif len(q.shape) != 4:
        raise ValueError(f"Attention: Q has rank {len(q.shape)}; accepted: 3 or 4")
    if (past_k is None) != (past_v is None):
        raise ValueError("Attention: past_key and past_value must be given together")
    past = 0
    if past_k is not None:
        past = past_k.shape[2]
        k = cx.b.op(mv.Concat, past_k, k, axis=2, name=node.name + "_present_key")
        v = cx.b.op(mv.Concat, past_v, v, axis=2, name=node.name + "_present_value")
    present_k, present_v = k, v
    dtype = q.dtype
    bsz, hq, sq, dq = q.shape
    hkv, kv = k.shape[1], k.shape[2]
    if hq % hkv:
        raise ValueError(f"Attention: {hq} query heads are not a multiple of {hkv} K/V heads")
    rep = hq // hkv
    bias = _attention_bias(cx, node, mask, nonpad, sq, kv, past, dtype)

    scale = cx.attr(node, "scale")
    scale = 1.0 / np.sqrt(dq) if scale is None else float(scale)
    grouped = rep > 1
    if grouped:  # (B, Hkv, rep, S, D) x (B, Hkv, 1, D, kv)
        q = _group_heads(cx, q, hkv, rep)
        k, v = _group_heads(cx, k, hkv, 1), _group_heads(cx, v, hkv, 1)
        if bias is not None:
            bias = _group_heads(cx, bias, hkv, rep)
    perm = tuple(range(len(k.shape) - 2)) + (len(k.shape) - 1, len(k.shape) - 2)
    kt = cx.b.op(mv.Transpose, k, perm=perm)
    # scores = (Q K^T) * scale ; softcap: c * tanh(scores / c)
    scores = cx.b.op(ct.MatMul, q, kt, name=node.name + "_qk")
    scores = cx.b.op(ew.Mul, scores, _const(cx, scale, dtype))
    softcap = float(cx.attr(node, "softcap", 0.0))
    if softcap > 0:
        scores = cx.b.op(ew.Div, scores, _const(cx, softcap, dtype))
        scores = cx.b.op(ew.Mul, cx.b.op(ew.Tanh, scores), _const(cx, softcap, dtype))
    qk_out = scores
    if bias is not None:
        scores = cx.b.op(ew.Add, scores, bias)
    mode = int(cx.attr(node, "qk_matmul_output_mode", 0))
    if mode == 2:
        qk_out = scores
    sdt = _softmax_dtype(cx, node, dtype)
    if sdt is not dtype:
        scores = cx.b.op(ew.Cast, scores, to=sdt)
    probs = cx.b.op(nn.Softmax, scores, axis=len(scores.shape) - 1)
    probs = _guard_rows(cx, probs, bias, sdt)
    if sdt is not dtype:
        probs = cx.b.op(ew.Cast, probs, to=dtype)
    if mode == 3:
        qk_out = probs
    y = cx.b.op(ct.MatMul, probs, v, name=node.name)
    if grouped:
        y = reshape_to(cx, y, (bsz, hq, sq, v.shape[-1]))
        qk_out = reshape_to(cx, qk_out, (bsz, hq, sq, kv))
    if rank3:
        y = cx.b.op(mv.Transpose, y, perm=(0, 2, 1, 3))
        y = reshape_to(cx, y, (bsz, sq, hq * y.shape[-1]))
    return [y, present_k, present_v, qk_out]


# ---- rotary embedding -------------------------------------------------------------------------

@converter("RotaryEmbedding")
def convert_rotary_embedding(cx, node, ins):
    """x1, x2 = halves (or even/odd lanes) of the rotated part;
    out = [cos*x1 - sin*x2, sin*x1 + cos*x2] (re-interleaved), then the unrotated lanes."""
    x, cos, sin, pos = (list(ins) + [None])[:4]
    shape = tuple(x.shape)
    if len(shape) == 3:
        heads = cx.attr(node, "num_heads")
        if not heads:
            raise ValueError("RotaryEmbedding: 3-D input needs the num_heads attribute")
        x = reshape_to(cx, x, (shape[0], shape[1], heads, shape[2] // heads))
        seq_axis = 1  # (B, S, H, D)
    elif len(shape) == 4:
        seq_axis = 2  # (B, H, S, D)
    else:
        raise ValueError(f"RotaryEmbedding: input rank {len(shape)}; accepted: 3 or 4")
    head = x.shape[-1]
    rot = int(cx.attr(node, "rotary_embedding_dim", 0)) or head
    half = rot // 2
    if pos is not None:  # (B, S) positions into the (max_pos, half) caches
        cos = cx.b.op(mv.Gather, cos, pos, axis=0)
        sin = cx.b.op(mv.Gather, sin, pos, axis=0)
    if cos.shape[-1] != half:
        raise ValueError(f"RotaryEmbedding: cos_cache has {cos.shape[-1]} columns, expected "
                         f"rotary_embedding_dim / 2 = {half}")
    b, s = cos.shape[0], cos.shape[1]
    cs_shape = (b, s, 1, half) if seq_axis == 1 else (b, 1, s, half)
    cos, sin = reshape_to(cx, cos, cs_shape), reshape_to(cx, sin, cs_shape)
    last = len(x.shape) - 1
    if cx.attr(node, "interleaved", 0):
        x1 = slice_of(cx, x, [0], [rot], [last], [2])
        x2 = slice_of(cx, x, [1], [rot], [last], [2])
    else:
        x1 = slice_of(cx, x, [0], [half], [last], [1])
        x2 = slice_of(cx, x, [half], [rot], [last], [1])
    real = cx.b.op(ew.Sub, cx.b.op(ew.Mul, cos, x1), cx.b.op(ew.Mul, sin, x2))
    imag = cx.b.op(ew.Add, cx.b.op(ew.Mul, sin, x1), cx.b.op(ew.Mul, cos, x2))
    if cx.attr(node, "interleaved", 0):
        lanes = tuple(real.shape) + (1,)
        pair = cx.b.op(mv.Concat, reshape_to(cx, real, lanes), reshape_to(cx, imag, lanes),
                       axis=last + 1)
        rotated = reshape_to(cx, pair, tuple(real.shape[:-1]) + (rot,))
    else:
        rotated = cx.b.op(mv.Concat, real, imag, axis=last)
    if rot < head:
        rest = slice_of(cx, x, [rot], [head], [last], [1])
        rotated = cx.b.op(mv.Concat, rotated, rest, axis=last)
    return [reshape_to(cx, rotated, shape, node.name)]
