"""ONNX converters: the optimizer update rules of ``ai.onnx.preview.training`` (Adagrad, Adam,
Momentum), decomposed into elementwise core ops so that each parameter's update compiles to one
fused kernel. Inputs are ``R`` (learning rate), ``T`` (update count), then n tensors of each
kind (X, G, then the optimizer's state); outputs are the new X's, then the new states. The
update rules follow ONNX's reference (``onnx.reference.ops.aionnx_preview_training``).
"""
from __future__ import annotations

import numpy as np

from ...graph_ir.graph import Value
from ...graph_ir.ops import elementwise as ew
from .registry import converter

TRAINING = "ai.onnx.preview.training::"


class _Update:
    """Scalar-and-tensor arithmetic for one node, in the dtype of its tensors."""

    def __init__(self, cx, node, ins, groups: int):
        self.b, self.node = cx.b, node
        n = (len(ins) - 2) // groups
        if n < 1 or 2 + n * groups != len(ins):
            raise ValueError(f"{node.op_type}: {len(ins)} inputs; expected R, T and {groups} "
                             "groups of equally many tensors")
        self.dtype = ins[2].dtype
        self.r = self.cast(ins[0])
        self.t = self.b.op(ew.Cast, ins[1], to=self.dtype)
        self.t_positive = self.b.op(ew.Greater, ins[1], self.b.const(np.array(0, np.int64)))
        self.groups = [ins[2 + k * n: 2 + (k + 1) * n] for k in range(groups)]

    def cast(self, v: Value) -> Value:
        return v if v.dtype is self.dtype else self.b.op(ew.Cast, v, to=self.dtype)

    def c(self, value: float) -> Value:
        return self.b.const(np.array(value, self.dtype.np))

    def op(self, core, *ins) -> Value:
        return self.b.op(core, *ins, name=self.node.name)

    def add(self, a, b): return self.op(ew.Add, a, b)
    def sub(self, a, b): return self.op(ew.Sub, a, b)
    def mul(self, a, b): return self.op(ew.Mul, a, b)
    def div(self, a, b): return self.op(ew.Div, a, b)

    def regularized(self, cx, x: Value, g: Value) -> Value:
        """g + norm_coefficient * x."""
        lam = float(cx.attr(self.node, "norm_coefficient", 0.0))
        return g if lam == 0 else self.add(self.mul(self.c(lam), x), g)


@converter(TRAINING + "Adagrad")
def convert_adagrad(cx, node, ins):
    # r' = R / (1 + T * decay); g' = g + lam * x; h' = h + g'^2; x' = x - r' g' / (sqrt(h') + eps)
    u = _Update(cx, node, ins, 3)
    decay, eps = float(cx.attr(node, "decay_factor", 0.0)), float(cx.attr(node, "epsilon", 1e-6))
    r = u.div(u.r, u.add(u.c(1), u.mul(u.t, u.c(decay))))
    xs, hs = [], []
    for x, g, h in zip(*u.groups):
        g = u.regularized(cx, x, g)
        h_new = u.add(h, u.mul(g, g))
        scale = u.add(u.op(ew.Sqrt, h_new), u.c(eps))
        xs.append(u.sub(x, u.div(u.mul(r, g), scale)))
        hs.append(h_new)
    return xs + hs


@converter(TRAINING + "Adam")
def convert_adam(cx, node, ins):
    # v' = a v + (1 - a) g'; h' = b h + (1 - b) g'^2; r' = R sqrt(1 - b^T) / (1 - a^T) when
    # T > 0 (else R); x' = (1 - lam_post) (x - r' v' / (sqrt(h') + eps))
    u = _Update(cx, node, ins, 4)
    alpha, beta = float(cx.attr(node, "alpha", 0.9)), float(cx.attr(node, "beta", 0.999))
    eps = float(cx.attr(node, "epsilon", 1e-6))
    post = float(cx.attr(node, "norm_coefficient_post", 0.0))
    corrected = u.div(u.mul(u.r, u.op(ew.Sqrt, u.sub(u.c(1), u.op(ew.Pow, u.c(beta), u.t)))),
                      u.sub(u.c(1), u.op(ew.Pow, u.c(alpha), u.t)))
    r = u.op(ew.Where, u.t_positive, corrected, u.r)
    xs, vs, hs = [], [], []
    for x, g, v, h in zip(*u.groups):
        g = u.regularized(cx, x, g)
        v_new = u.add(u.mul(u.c(alpha), v), u.mul(u.c(1 - alpha), g))
        h_new = u.add(u.mul(u.c(beta), h), u.mul(u.c(1 - beta), u.mul(g, g)))
        step = u.div(v_new, u.add(u.op(ew.Sqrt, h_new), u.c(eps)))
        x_new = u.sub(x, u.mul(r, step))
        xs.append(x_new if post == 0 else u.mul(u.c(1 - post), x_new))
        vs.append(v_new)
        hs.append(h_new)
    return xs + vs + hs


@converter(TRAINING + "Momentum")
def convert_momentum(cx, node, ins):
    # v' = a v + b' g' (b' = beta when T > 0, else 1); standard: x' = x - R v';
    # nesterov: x' = x - R (g' + a v')
    u = _Update(cx, node, ins, 3)
    alpha, beta = float(cx.attr(node, "alpha")), float(cx.attr(node, "beta"))
    mode = cx.attr(node, "mode", "standard")
    if mode not in ("standard", "nesterov"):
        raise ValueError(f"Momentum mode={mode!r}; expected standard or nesterov")
    beta_t = u.op(ew.Where, u.t_positive, u.c(beta), u.c(1))
    xs, vs = [], []
    for x, g, v in zip(*u.groups):
        g = u.regularized(cx, x, g)
        v_new = u.add(u.mul(u.c(alpha), v), u.mul(beta_t, g))
        step = v_new if mode == "standard" else u.add(g, u.mul(u.c(alpha), v_new))
        xs.append(u.sub(x, u.mul(u.r, step)))
        vs.append(v_new)
    return xs + vs
