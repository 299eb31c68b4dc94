"""Attention graphs for the backends' attention templates (C and Triton): Q, K, V inputs,
scale, masks, softmax, @V, optional layouts."""
from __future__ import annotations

import numpy as np

from tests.util import helper, make_model

RNG = np.random.default_rng(11)
NEG = float(np.finfo(np.float32).min)  # what transformers' masks add


def rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def attention_model(b, h, sq, sk, d, dv=None, mask=None, bias=None, where=None, bshd=False,
                    dtype=np.float32, probs_out=False, axis=-1):
    """Q [b,h,sq,d] (or [b,sq,h,d] with ``bshd``: transposed in, out), K, V; scale 1/sqrt(d);
    ``mask``: an additive input of that shape; ``bias``: an additive constant; ``where``: a
    constant bool keep-mask applied with Where(keep, s, NEG)."""
    dv = dv or d
    shape = (lambda s, e: [b, s, h, e]) if bshd else (lambda s, e: [b, h, s, e])
    nodes, q, k, v = [], "q", "k", "v"
    inits = {"scale": np.array(1 / np.sqrt(d), np.float32).astype(dtype)}
    if bshd:
        nodes += [helper.make_node("Transpose", [x], [x + "t"], perm=[0, 2, 1, 3]) for x in "qkv"]
        q, k, v = "qt", "kt", "vt"
    nodes += [helper.make_node("Transpose", [k], ["kT"], perm=[0, 1, 3, 2]),
              helper.make_node("MatMul", [q, "kT"], ["s0"]),
              helper.make_node("Mul", ["s0", "scale"], ["s1"])]
    last = "s1"
    inputs = [("q", dtype, shape(sq, d)), ("k", dtype, shape(sk, d)), ("v", dtype, shape(sk, dv))]
    if mask is not None:
        inputs.append(("mask", dtype, list(mask)))
        nodes.append(helper.make_node("Add", [last, "mask"], ["s2"]))
        last = "s2"
    if bias is not None:
        inits["bias"] = np.maximum(bias, np.finfo(dtype).min).astype(dtype)
        nodes.append(helper.make_node("Add", [last, "bias"], ["s3"]))
        last = "s3"
    if where is not None:
        inits["keep"], inits["neg"] = where, np.array(NEG, dtype)
        nodes.append(helper.make_node("Where", ["keep", last, "neg"], ["s4"]))
        last = "s4"
    nodes += [helper.make_node("Softmax", [last], ["p"], axis=axis),
              helper.make_node("MatMul", ["p", v], ["o"])]
    out = [("o", dtype, [b, h, sq, dv])]
    if bshd:
        nodes.append(helper.make_node("Transpose", ["o"], ["y"], perm=[0, 2, 1, 3]))
        out = [("y", dtype, [b, sq, h, dv])]
    if probs_out:
        out.append(("p", dtype, [b, h, sq, sk]))
    return make_model(nodes, inputs, out, initializers=inits)


def qkv(b, h, sq, sk, d, dv=None, bshd=False, dtype=np.float32):
    dv = dv or d
    if bshd:
        return {"q": rand(b, sq, h, d, dtype=dtype), "k": rand(b, sk, h, d, dtype=dtype),
                "v": rand(b, sk, h, dv, dtype=dtype)}
    return {"q": rand(b, h, sq, d, dtype=dtype), "k": rand(b, h, sk, d, dtype=dtype),
            "v": rand(b, h, sk, dv, dtype=dtype)}
