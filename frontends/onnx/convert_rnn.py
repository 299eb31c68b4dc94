"""ONNX converters: recurrent layers (RNN, GRU, LSTM), unrolled over the static sequence length.

Each direction becomes one input projection for all time steps (a single MatMul
``X[T*B, I] @ W^T`` plus the constant-foldable bias sum) followed, per step, by the recurrent
MatMul ``H[B, H] @ R^T`` and the gate arithmetic as elementwise ops (which the fusion pass groups).
Every attribute is honoured: ``direction`` (forward / reverse / bidirectional), ``activations``
with ``activation_alpha``/``activation_beta``, ``clip``, ``layout`` 0/1, GRU
``linear_before_reset``, LSTM ``input_forget`` and peepholes ``P``, ``initial_h``/``initial_c``.
``sequence_lens`` may be a runtime tensor: a batch entry past its length keeps its state and
writes zeros to ``Y`` (a ``Where`` per step), and the reverse direction reads each sequence
backwards from its own last step (``ReverseSequence`` before and after).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...graph_ir.graph import Value
from ...graph_ir.ops import contraction as ct
from ...graph_ir.ops import elementwise as ew
from ...graph_ir.ops import movement as mv
from ...graph_ir.types import DType
from .convert_elementwise import ACTIVATIONS, Alg
from .convert_movement import reshape_to, slice_of
from .registry import converter


@dataclass(frozen=True)
class Cell:
    gates: int  # gate blocks stacked in W and R
    activations: tuple[str, ...]  # default activation per direction


CELLS = {"RNN": Cell(1, ("Tanh",)), "GRU": Cell(3, ("Sigmoid", "Tanh")),
         "LSTM": Cell(4, ("Sigmoid", "Tanh", "Tanh"))}

# activation -> (uses alpha, uses beta, default alpha, default beta); values are consumed from
# activation_alpha / activation_beta in order, by the activations that use them (as ONNX Runtime)
ARGS = {"affine": (1, 1, 1.0, 0.0), "leakyrelu": (1, 0, 0.01, 0.0),
        "thresholdedrelu": (1, 0, 1.0, 0.0), "scaledtanh": (1, 1, 1.0, 1.0),
        "hardsigmoid": (1, 1, 0.2, 0.5), "elu": (1, 0, 1.0, 0.0)}

_CANONICAL = {k.lower(): k for k in ACTIVATIONS}
_BASIC = {
    "relu": lambda g, x, a: g.op(ew.Relu, x),
    "tanh": lambda g, x, a: g.tanh(x),
    "sigmoid": lambda g, x, a: g.op(ew.Sigmoid, x),
    # alpha * x + beta
    "affine": lambda g, x, a: g.add(g.scaled(x, a("alpha", 1.0)), g.c(a("beta", 0.0), x)),
    # alpha * tanh(beta * x)
    "scaledtanh": lambda g, x, a: g.scaled(g.tanh(g.scaled(x, a("beta", 1.0))), a("alpha", 1.0)),
}


def _activation(name: str, alpha: float, beta: float):
    """``fn(g, x) -> Value`` for one named activation with its resolved alpha and beta."""
    key = name.lower()
    args = {"alpha": alpha, "beta": beta}
    fn = _BASIC.get(key) or (ACTIVATIONS.get(_CANONICAL[key]) if key in _CANONICAL else None)
    if fn is None or key in ("gelu", "selu", "celu", "mish", "hardswish"):
        raise ValueError(f"unknown recurrent activation '{name}' (accepted: Relu, Tanh, Sigmoid, "
                         "Affine, LeakyRelu, ThresholdedRelu, ScaledTanh, HardSigmoid, Elu, "
                         "Softsign, Softplus)")
    return lambda g, x: fn(g, x, lambda k, d: args[k])


def _activations(cx, node, cell: Cell, dirs: int) -> list[list]:
    """The activation functions of each direction, alpha/beta resolved."""
    names = list(cx.attr(node, "activations", ()) or cell.activations * dirs)
    n = len(cell.activations)
    if len(names) != n * dirs:
        raise ValueError(f"{node.op_type} needs {n * dirs} activations for {dirs} direction(s), "
                         f"got {len(names)}: {names}")
    alphas = list(cx.attr(node, "activation_alpha", ()) or ())
    betas = list(cx.attr(node, "activation_beta", ()) or ())
    fns = []
    for name in names:
        ua, ub, da, db = ARGS.get(name.lower(), (0, 0, 0.0, 0.0))
        alpha = alphas.pop(0) if ua and alphas else da
        beta = betas.pop(0) if ub and betas else db
        fns.append(_activation(name, float(alpha), float(beta)))
    return [fns[d * n:(d + 1) * n] for d in range(dirs)]


class Steps:
    """Builder algebra for one direction's unrolled steps."""

    def __init__(self, cx, node, hidden: int, clip: float | None, masks: list | None):
        self.cx, self.g, self.h = cx, Alg(cx, node), hidden
        self.clip, self.masks = clip, masks

    def part(self, v: Value, k: int, n: int = 1) -> Value:
        """Gate blocks k .. k+n-1 (columns) of a [B, G*H] tensor or a transposed [H, G*H] weight."""
        return slice_of(self.cx, v, [k * self.h], [(k + n) * self.h], [1], [1], self.g.name)

    def act(self, fn, x: Value) -> Value:
        if self.clip is not None:  # clip bounds the input of every activation
            x = self.g.min(self.g.max(x, self.g.c(-self.clip, x)), self.g.c(self.clip, x))
        return fn(self.g, x)

    def keep(self, t: int, new: Value, old: Value) -> Value:
        """Past a sequence's length the state keeps its previous value."""
        return new if self.masks is None else self.g.where(self.masks[t], new, old)

    def out(self, t: int, new: Value) -> Value:
        """Y entries past a sequence's length are zero."""
        return new if self.masks is None else self.g.where(self.masks[t], new, self.g.c(0, new))


def _rnn_step(s: Steps, fns, xw, rt, h, c, extra):
    # H = f(clip(x W^T + H R^T + Wb + Rb))
    return s.act(fns[0], s.g.add(xw, s.g.op(ct.MatMul, h, rt))), None


def _gru_step(s: Steps, fns, xw, rt, h, c, extra):
    # z, r = f(x W^T + H R^T + b); n = g(x Wh^T + (r*H) Rh^T + b) or, linear_before_reset,
    # g(x Wh^T + Wbh + r * (H Rh^T + Rbh)); H' = n + z * (H - n)
    g, (rbh, lbr) = s.g, extra
    f, gf = fns
    if lbr:
        hr = g.op(ct.MatMul, h, rt)
        zr = g.add(s.part(xw, 0, 2), s.part(hr, 0, 2))
    else:
        zr = g.add(s.part(xw, 0, 2), g.op(ct.MatMul, h, s.part(rt, 0, 2)))
    z, r = s.act(f, s.part(zr, 0)), s.act(f, s.part(zr, 1))
    if lbr:
        hh = s.part(hr, 2)
        hh = g.mul(r, hh if rbh is None else g.add(hh, rbh))
    else:
        hh = g.op(ct.MatMul, g.mul(r, h), s.part(rt, 2))
    n = s.act(gf, g.add(s.part(xw, 2), hh))
    return g.add(n, g.mul(z, g.sub(h, n))), None


def _lstm_step(s: Steps, fns, xw, rt, h, c, extra):
    # i, o, f, c~ blocks; i = f(.. + Pi*C), f = f(.. + Pf*C) (or 1 - i with input_forget),
    # C' = f*C + i*g(c~), o = f(.. + Po*C'), H' = o * h(C')
    g, (peep, input_forget) = s.g, extra
    fa, ga, ha = fns
    gates = g.add(xw, g.op(ct.MatMul, h, rt))
    pi, po, pf = peep if peep is not None else (None, None, None)
    i_pre, f_pre = s.part(gates, 0), s.part(gates, 2)
    if pi is not None:
        i_pre, f_pre = g.add(i_pre, g.mul(pi, c)), g.add(f_pre, g.mul(pf, c))
    i = s.act(fa, i_pre)
    f = g.sub(g.c(1, i), i) if input_forget else s.act(fa, f_pre)
    c_new = g.add(g.mul(f, c), g.mul(i, s.act(ga, s.part(gates, 3))))
    o_pre = s.part(gates, 1)
    if po is not None:
        o_pre = g.add(o_pre, g.mul(po, c_new))
    o = s.act(fa, o_pre)
    return g.mul(o, ha(g, c_new)), c_new


STEPS = {"RNN": _rnn_step, "GRU": _gru_step, "LSTM": _lstm_step}


def _direction(cx, node, d: int, ins: dict, fns, masks, reverse: bool):
    """Unroll one direction; returns the per-step outputs in time order, last H and last C."""
    kind, g = node.op_type, Alg(cx, node)
    x, hidden, gates = ins["X"], ins["hidden"], CELLS[kind].gates
    T, B, I = x.shape
    w = reshape_to(cx, _pick(cx, ins["W"], d), (gates * hidden, I))
    r = reshape_to(cx, _pick(cx, ins["R"], d), (gates * hidden, hidden))
    wt, rt = (cx.b.op(mv.Transpose, v, perm=(1, 0)) for v in (w, r))
    s = Steps(cx, node, hidden, ins["clip"], masks)
    lbr = kind == "GRU" and ins["lbr"]
    xw = g.op(ct.MatMul, reshape_to(cx, x, (T * B, I)), wt)
    bias, rbh = _biases(cx, s, ins["B"], d, gates, lbr)
    if bias is not None:
        xw = g.add(xw, bias)
    xw = reshape_to(cx, xw, (T, B, gates * hidden))
    h = _initial(cx, ins["initial_h"], d, (B, hidden), x)
    c = _initial(cx, ins["initial_c"], d, (B, hidden), x) if kind == "LSTM" else None
    extra = {"RNN": None, "GRU": (rbh, lbr),
             "LSTM": (_peepholes(cx, s, ins["P"], d), ins["input_forget"])}[kind]
    order = range(T - 1, -1, -1) if reverse else range(T)
    ys = [None] * T
    for t in order:
        xw_t = slice_of(cx, xw, [t], [t + 1], [0], [1], node.name)
        xw_t = reshape_to(cx, xw_t, (B, gates * hidden))
        h_new, c_new = STEPS[kind](s, fns, xw_t, rt, h, c, extra)
        ys[t] = s.out(t, h_new)
        h = s.keep(t, h_new, h)
        c = None if c_new is None else s.keep(t, c_new, c)
    return ys, h, c


def _pick(cx, v: Value, d: int) -> Value:
    """Direction ``d`` of a [D, ...] tensor, shape [1, ...]."""
    return slice_of(cx, v, [d], [d + 1], [0], [1])


def _biases(cx, s: Steps, b: Value | None, d: int, gates: int, lbr: bool):
    """The bias added to the input projection (Wb + Rb, without Rbh when linear_before_reset)
    and the recurrent bias Rbh kept apart for linear_before_reset."""
    if b is None:
        return None, None
    n = gates * s.h
    bd = reshape_to(cx, _pick(cx, b, d), (2 * n,))
    wb = slice_of(cx, bd, [0], [n], [0], [1])
    rb = slice_of(cx, bd, [n], [2 * n], [0], [1])
    if not lbr:
        return s.g.add(wb, rb), None
    rzr = slice_of(cx, rb, [0], [2 * s.h], [0], [1])
    rbh = slice_of(cx, rb, [2 * s.h], [n], [0], [1])
    zeros = cx.b.const(np.zeros(s.h, b.dtype.np), "zeros", b.dtype)
    return s.g.add(wb, cx.b.op(mv.Concat, rzr, zeros, axis=0)), rbh


def _peepholes(cx, s: Steps, p: Value | None, d: int):
    if p is None:
        return None
    pd = reshape_to(cx, _pick(cx, p, d), (3 * s.h,))
    return tuple(slice_of(cx, pd, [k * s.h], [(k + 1) * s.h], [0], [1]) for k in range(3))


def _initial(cx, v: Value | None, d: int, shape, like: Value) -> Value:
    if v is None:
        return cx.b.const(np.zeros(shape, like.dtype.np), "zeros", like.dtype)
    return reshape_to(cx, _pick(cx, v, d), shape)


def _masks(cx, node, lens: Value | None, T: int):
    """Per step a [B, 1] bool mask t < sequence_lens[b]; None when every length is T."""
    if lens is None:
        return None
    known = cx.b.value_of(lens)
    if known is not None:
        if np.any((known < 0) | (known > T)):
            raise ValueError(f"sequence_lens {known.tolist()} out of range [0, {T}]")
        if np.all(known == T):
            return None
    col = reshape_to(cx, lens, (lens.shape[0], 1))
    g = Alg(cx, node)
    step = lambda t: cx.b.const(np.asarray(t, lens.dtype.np), "t", lens.dtype)
    return [g.less(step(t), col) for t in range(T)]


def _reverse_sequences(cx, v: Value, lens: Value) -> Value:
    """Reverse each batch entry's first sequence_lens[b] steps of a [T, B, ...] tensor."""
    lens64 = cx.b.op(ew.Cast, lens, to=DType.int64) if lens.dtype is not DType.int64 else lens
    return cx.b.op(mv.ReverseSequence, v, lens64, batch_axis=1, time_axis=0)


@converter("RNN", "GRU", "LSTM")
def convert_recurrent(cx, node, ins):
    kind = node.op_type
    names = ["X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"]
    named = dict(zip(names, list(ins) + [None] * (len(names) - len(ins))))
    layout = int(cx.attr(node, "layout", 0))
    x = named["X"]
    if layout:  # [B, T, I] -> [T, B, I]; initial states [B, D, H] -> [D, B, H]
        x = cx.b.op(mv.Transpose, x, perm=(1, 0, 2))
        for key in ("initial_h", "initial_c"):
            if named[key] is not None:
                named[key] = cx.b.op(mv.Transpose, named[key], perm=(1, 0, 2))
    direction = cx.attr(node, "direction", "forward")
    if direction not in ("forward", "reverse", "bidirectional"):
        raise ValueError(f"direction must be forward, reverse or bidirectional, got {direction!r}")
    dirs = 2 if direction == "bidirectional" else 1
    if named["W"].shape[0] != dirs:
        raise ValueError(f"W has {named['W'].shape[0]} direction(s), direction={direction!r} "
                         f"needs {dirs}")
    hidden = int(cx.attr(node, "hidden_size", named["R"].shape[-1]))
    clip = cx.attr(node, "clip")
    named.update(X=x, hidden=hidden, clip=None if clip is None else float(clip),
                 lbr=int(cx.attr(node, "linear_before_reset", 0)),
                 input_forget=int(cx.attr(node, "input_forget", 0)))
    T = x.shape[0]
    lens = named["sequence_lens"]
    masks = _masks(cx, node, lens, T)
    fns = _activations(cx, node, CELLS[kind], dirs)
    ys, hs, cs = [], [], []
    for d in range(dirs):
        reverse = direction == "reverse" or d == 1
        dir_ins = dict(named)
        if reverse and masks is not None:
            # ragged reverse: flip each sequence within its length, run forward, flip back
            dir_ins["X"] = _reverse_sequences(cx, x, lens)
            y, h, c = _direction(cx, node, d, dir_ins, fns[d], masks, False)
            y = _reverse_steps(cx, y, lens)
        else:
            y, h, c = _direction(cx, node, d, dir_ins, fns[d], masks, reverse)
        ys.append(y)
        hs.append(h)
        cs.append(c)
    return _outputs(cx, node, ys, hs, cs, layout)


def _reverse_steps(cx, ys: list, lens: Value) -> list:
    """Per-step [B, H] outputs -> the same steps with each sequence reversed within its length."""
    T, (B, H) = len(ys), ys[0].shape
    stacked = cx.b.op(mv.Concat, *[reshape_to(cx, y, (1, B, H)) for y in ys], axis=0)
    back = _reverse_sequences(cx, stacked, lens)
    return [reshape_to(cx, slice_of(cx, back, [t], [t + 1], [0], [1]), (B, H)) for t in range(T)]


def _outputs(cx, node, ys, hs, cs, layout: int) -> list:
    """Y [T, D, B, H] (layout 1: [B, T, D, H]), Y_h and Y_c [D, B, H] (layout 1: [B, D, H])."""
    want = [bool(n) for n in node.output] + [False] * 3
    (B, H), D = hs[0].shape, len(hs)
    outs = []
    if want[0]:
        per_dir = [cx.b.op(mv.Concat, *[reshape_to(cx, y, (1, 1, B, H)) for y in yd], axis=0)
                   for yd in ys]
        y = per_dir[0] if D == 1 else cx.b.op(mv.Concat, *per_dir, axis=1)
        outs.append(cx.b.op(mv.Transpose, y, perm=(2, 0, 1, 3)) if layout else y)
    else:
        outs.append(None)
    for k, states in ((1, hs), (2, cs)):
        if not want[k] or states[0] is None:
            outs.append(None)
            continue
        st = [reshape_to(cx, s, (1, B, H)) for s in states]
        v = st[0] if D == 1 else cx.b.op(mv.Concat, *st, axis=0)
        outs.append(cx.b.op(mv.Transpose, v, perm=(1, 0, 2)) if layout else v)
    return outs[:len(node.output)]
