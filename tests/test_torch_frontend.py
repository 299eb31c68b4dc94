"""The PyTorch frontend: torch.export programs and torch.compile(backend="deploy") against eager."""
from __future__ import annotations

import logging
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import deploy
import deploy.torch_backend
from deploy.frontends.torch import import_torch, list_ops, supported_aten_ops
from deploy.frontends.torch.importer import UnsupportedAtenOpsError
from deploy.graph_ir.interpreter import interpret

RTOL, ATOL = 1e-3, 1e-4


def assert_close(ours, ref, what=""):
    ref = ref.detach().numpy() if isinstance(ref, torch.Tensor) else np.asarray(ref)
    ours = np.asarray(ours)
    assert ours.shape == ref.shape, f"{what}: shape {ours.shape} vs torch {ref.shape}"
    assert ours.dtype == ref.dtype, f"{what}: dtype {ours.dtype} vs torch {ref.dtype}"
    if ref.dtype.kind in "biu":
        np.testing.assert_array_equal(ours, ref, err_msg=what)
    else:
        np.testing.assert_allclose(ours, ref, rtol=RTOL, atol=ATOL, err_msg=what)


def eager(module, args):
    with torch.no_grad():
        out = module(*args)
    return list(out) if isinstance(out, (tuple, list)) else [out]


def check_compiled(module, args, **options):
    module = module.eval()
    art = deploy.compile(module, example_inputs=args, **options)
    ours = art.load().run([a.numpy() for a in args])
    ref = eager(module, args)
    assert len(ours) == len(ref)
    for k, (o, r) in enumerate(zip(ours, ref)):
        assert_close(o, r, f"output {k}")
    return art


# ---- small models -------------------------------------------------------------------------

class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 8)

    def forward(self, x):
        return torch.tanh(self.fc2(F.relu(self.fc1(x))))


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.conv2, self.bn2 = nn.Conv2d(8, 8, 3, stride=2, groups=2), nn.BatchNorm2d(8)
        self.head = nn.Linear(8, 5)
        for bn in (self.bn1, self.bn2):  # non-trivial running statistics
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.relu(self.bn2(self.conv2(x)))
        return self.head(F.adaptive_avg_pool2d(x, 1).flatten(1))


class Attention(nn.Module):
    def __init__(self, dim=32, heads=4):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
        return x + self.mlp(self.ln2(x))


MODELS = {"mlp": (MLP, lambda: (torch.randn(4, 16),)),
          "cnn_bn": (SmallCNN, lambda: (torch.randn(2, 3, 16, 16),)),
          "attention": (Attention, lambda: (torch.randn(2, 6, 32),))}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_via_export(name):
    torch.manual_seed(0)
    cls, inputs = MODELS[name]
    module, args = cls().eval(), inputs()
    ep = torch.export.export(module, args)
    art = deploy.compile(ep, target="host")
    ours = art.load().run({"x": args[0].numpy()})
    assert_close(ours[0], eager(module, args)[0], name)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_via_torch_compile(name, caplog, monkeypatch):
    from deploy.torch_backend import DeployCompiled
    calls = []
    original = DeployCompiled.__call__
    monkeypatch.setattr(DeployCompiled, "__call__",
                        lambda self, *a: calls.append(1) or original(self, *a))
    torch.manual_seed(0)
    torch._dynamo.reset()
    cls, inputs = MODELS[name]
    module, args = cls().eval(), inputs()
    compiled = torch.compile(module, backend="deploy")
    with caplog.at_level(logging.WARNING, logger="deploy.torch"), torch.no_grad():
        out = compiled(*args)
    assert not [r for r in caplog.records if "eagerly" in r.getMessage()], caplog.text
    assert calls, "the deploy artifact did not run"
    assert_close(out, eager(module, args)[0], name)


def test_torch_compile_falls_back_with_one_line(caplog):
    class CumMax(nn.Module):
        def forward(self, x):
            return torch.cummax(x * 2, dim=-1).values + 1

    torch._dynamo.reset()
    x = torch.randn(3, 5)
    compiled = torch.compile(CumMax(), backend="deploy")
    with caplog.at_level(logging.WARNING, logger="deploy.torch"), torch.no_grad():
        out = compiled(x)
    assert_close(out, CumMax()(x), "fallback")
    lines = [r.getMessage() for r in caplog.records if "eagerly" in r.getMessage()]
    assert len(lines) == 1 and "aten.cummax" in lines[0], caplog.text


# ---- ATen op sweep ------------------------------------------------------------------------

def rnd(*shape):
    return lambda g: torch.randn(*shape, generator=g)


def pos(*shape):
    return lambda g: torch.rand(*shape, generator=g) + 0.5


def ints(*shape, lo=-5, hi=6):
    return lambda g: torch.randint(lo, hi, shape, generator=g)


def nz_ints(*shape):
    return lambda g: torch.randint(1, 6, shape, generator=g) * (torch.randint(0, 2, shape, generator=g) * 2 - 1)


def mask(*shape):
    return lambda g: torch.rand(*shape, generator=g) > 0.5


def idx(n, *shape):
    return lambda g: torch.randint(0, n, shape, generator=g)


W = torch.Generator().manual_seed(7)
CONV_W = torch.randn(6, 4, 3, 3, generator=W)
CONVT_W = torch.randn(4, 3, 3, 3, generator=W)
EMB = torch.randn(10, 5, generator=W)

# (case id, ATen op the case must exercise (None: only checked end to end), fn, input makers)
SWEEP = [
    ("add", "aten.add.Tensor", lambda x, y: x + y, [rnd(3, 4), rnd(4)]),
    ("add_alpha", "aten.add.Tensor", lambda x, y: torch.add(x, y, alpha=2.5), [rnd(3, 4), rnd(3, 4)]),
    ("add_scalar_int", "aten.add.Tensor", lambda x: x + 3, [ints(3, 4)]),
    ("sub", "aten.sub.Tensor", lambda x, y: x - y, [rnd(2, 3), rnd(2, 1)]),
    ("rsub", None, lambda x: 1.5 - x, [rnd(5)]),
    ("mul", "aten.mul.Tensor", lambda x, y: x * y, [rnd(2, 3), rnd(3)]),
    ("mul_int_float", "aten.mul.Tensor", lambda x: x * 0.5, [ints(6)]),
    ("div", "aten.div.Tensor", lambda x, y: x / y, [rnd(4, 3), pos(4, 3)]),
    ("div_int", "aten.div.Tensor", lambda x, y: x / y, [ints(7), nz_ints(7)]),
    ("div_floor", "aten.div.Tensor_mode", lambda x, y: torch.div(x, y, rounding_mode="floor"),
     [rnd(6), rnd(6)]),
    ("div_trunc", "aten.div.Tensor_mode", lambda x, y: torch.div(x, y, rounding_mode="trunc"),
     [rnd(6), rnd(6)]),
    ("floordiv_int", None, lambda x, y: x // y, [ints(8), nz_ints(8)]),
    ("remainder", "aten.remainder.Tensor", lambda x, y: torch.remainder(x, y), [rnd(6), pos(6)]),
    ("remainder_int", "aten.remainder.Tensor", lambda x, y: x % y, [ints(8), nz_ints(8)]),
    ("fmod", "aten.fmod.Tensor", lambda x, y: torch.fmod(x, y), [rnd(6), pos(6)]),
    ("pow_scalar", "aten.pow.Tensor_Scalar", lambda x: x ** 3, [rnd(5)]),
    ("pow_square", "aten.pow.Tensor_Scalar", lambda x: x ** 2, [rnd(5)]),
    ("pow_tensor", "aten.pow.Tensor_Tensor", lambda x, y: x ** y, [pos(5), rnd(5)]),
    ("maximum", "aten.maximum.default", torch.maximum, [rnd(3, 4), rnd(3, 4)]),
    ("minimum", "aten.minimum.default", torch.minimum, [rnd(3, 4), rnd(1, 4)]),
    ("abs", "aten.abs.default", torch.abs, [rnd(5)]),
    ("neg", "aten.neg.default", torch.neg, [rnd(5)]),
    ("exp", "aten.exp.default", torch.exp, [rnd(5)]),
    ("log", "aten.log.default", torch.log, [pos(5)]),
    ("sqrt", "aten.sqrt.default", torch.sqrt, [pos(5)]),
    ("rsqrt", "aten.rsqrt.default", torch.rsqrt, [pos(5)]),
    ("sin", "aten.sin.default", torch.sin, [rnd(5)]),
    ("cos", "aten.cos.default", torch.cos, [rnd(5)]),
    ("tan", "aten.tan.default", torch.tan, [rnd(5)]),
    ("tanh", "aten.tanh.default", torch.tanh, [rnd(5)]),
    ("atan", "aten.atan.default", torch.atan, [rnd(5)]),
    ("sigmoid", "aten.sigmoid.default", torch.sigmoid, [rnd(5)]),
    ("relu", "aten.relu.default", torch.relu, [rnd(5)]),
    ("erf", "aten.erf.default", torch.erf, [rnd(5)]),
    ("floor", "aten.floor.default", torch.floor, [rnd(5)]),
    ("ceil", "aten.ceil.default", torch.ceil, [rnd(5)]),
    ("round", "aten.round.default", torch.round, [rnd(5)]),
    ("sign", "aten.sign.default", torch.sign, [rnd(5)]),
    ("reciprocal", "aten.reciprocal.default", torch.reciprocal, [pos(5)]),
    ("log1p", "aten.log1p.default", torch.log1p, [pos(5)]),
    ("expm1", "aten.expm1.default", torch.expm1, [rnd(5)]),
    ("log2", "aten.log2.default", torch.log2, [pos(5)]),
    ("log10", "aten.log10.default", torch.log10, [pos(5)]),
    ("exp_int", "aten.exp.default", torch.exp, [ints(5)]),
    ("clamp", "aten.clamp.default", lambda x: torch.clamp(x, -0.5, 0.7), [rnd(8)]),
    ("clamp_min", None, lambda x: torch.clamp(x, min=0.1), [rnd(8)]),
    ("hardtanh", "aten.hardtanh.default", F.hardtanh, [rnd(8)]),
    ("gelu", "aten.gelu.default", F.gelu, [rnd(8)]),
    ("gelu_tanh", "aten.gelu.default", lambda x: F.gelu(x, approximate="tanh"), [rnd(8)]),
    ("silu", None, F.silu, [rnd(8)]),
    ("leaky_relu", "aten.leaky_relu.default", lambda x: F.leaky_relu(x, 0.2), [rnd(8)]),
    ("elu", "aten.elu.default", F.elu, [rnd(8)]),
    ("hardswish", None, F.hardswish, [rnd(8)]),
    ("hardsigmoid", None, F.hardsigmoid, [rnd(8)]),
    ("softplus", None, F.softplus, [rnd(8)]),
    ("lt", "aten.lt.Tensor", lambda x, y: x < y, [rnd(6), rnd(6)]),
    ("gt_scalar", "aten.gt.Scalar", lambda x: x > 0.1, [rnd(6)]),
    ("le", "aten.le.Tensor", lambda x, y: x <= y, [ints(6), ints(6)]),
    ("ge", "aten.ge.Tensor", lambda x, y: x >= y, [ints(6), ints(6)]),
    ("eq", "aten.eq.Tensor", lambda x, y: x == y, [ints(6), ints(6)]),
    ("ne_scalar", "aten.ne.Scalar", lambda x: x != 2, [ints(6)]),
    ("lt_mixed", "aten.lt.Tensor", lambda x, y: x < y, [ints(6), rnd(6)]),
    ("logical_and", "aten.logical_and.default", torch.logical_and, [mask(6), mask(6)]),
    ("logical_or", "aten.logical_or.default", torch.logical_or, [mask(6), mask(6)]),
    ("logical_not", "aten.logical_not.default", torch.logical_not, [mask(6)]),
    ("bitwise_and_bool", "aten.bitwise_and.Tensor", lambda x, y: x & y, [mask(6), mask(6)]),
    ("bitwise_or_int", "aten.bitwise_or.Tensor", lambda x, y: x | y, [ints(6), ints(6)]),
    ("bitwise_not", "aten.bitwise_not.default", lambda x: ~x, [mask(6)]),
    ("where", "aten.where.self", torch.where, [mask(3, 4), rnd(3, 4), rnd(4)]),
    ("where_scalar", None, lambda m, x: torch.where(m, x, 0.0), [mask(3, 4), rnd(3, 4)]),
    ("masked_fill", None, lambda x, m: x.masked_fill(m, -1.0), [rnd(3, 4), mask(3, 4)]),
    ("isnan", "aten.isnan.default", lambda x: torch.isnan(torch.log(x)), [rnd(6)]),
    ("to_int", "aten._to_copy.default", lambda x: (x * 3).to(torch.int32), [rnd(6)]),
    ("to_float", "aten._to_copy.default", lambda x: x.float(), [ints(6)]),
    # movement
    ("view", "aten.view.default", lambda x: x.view(4, -1), [rnd(2, 3, 4)]),
    ("reshape", None, lambda x: x.permute(1, 0, 2).reshape(3, 8), [rnd(2, 3, 4)]),
    ("permute", "aten.permute.default", lambda x: x.permute(2, 0, 1), [rnd(2, 3, 4)]),
    ("transpose", None, lambda x: x.transpose(0, 2), [rnd(2, 3, 4)]),
    ("t", None, lambda x: x.t(), [rnd(2, 3)]),
    ("unsqueeze", "aten.unsqueeze.default", lambda x: x.unsqueeze(1), [rnd(2, 3)]),
    ("squeeze", "aten.squeeze.dims", lambda x: x.squeeze(1), [rnd(2, 1, 3)]),
    ("flatten", None, lambda x: x.flatten(1), [rnd(2, 3, 4)]),
    ("expand", "aten.expand.default", lambda x: x.expand(2, 3, 4), [rnd(3, 1)]),
    ("slice", "aten.slice.Tensor", lambda x: x[:, 1:6:2], [rnd(3, 8)]),
    ("slice_neg", "aten.slice.Tensor", lambda x: x[-2:, :-1], [rnd(4, 5)]),
    ("select", "aten.select.int", lambda x: x[:, 2], [rnd(3, 4, 2)]),
    ("select_neg", "aten.select.int", lambda x: x[-1], [rnd(3, 4)]),
    ("cat", "aten.cat.default", lambda x, y: torch.cat([x, y], dim=1), [rnd(2, 3), rnd(2, 2)]),
    ("cat_promote", "aten.cat.default", lambda x, y: torch.cat([x, y]), [rnd(2), ints(3)]),
    ("stack", None, lambda x, y: torch.stack([x, y], dim=1), [rnd(2, 3), rnd(2, 3)]),
    ("split", "aten.split_with_sizes.default", lambda x: x.split([1, 3], dim=1)[1],
     [rnd(2, 4)]),
    ("chunk", None, lambda x: x.chunk(2, dim=-1)[0] * x.chunk(2, dim=-1)[1], [rnd(3, 6)]),
    ("unbind", None, lambda x: x.unbind(0)[1], [rnd(3, 4)]),
    ("flip", "aten.flip.default", lambda x: x.flip(1), [rnd(2, 5)]),
    ("repeat", "aten.repeat.default", lambda x: x.repeat(2, 1, 3), [rnd(2, 3)]),
    ("pad_constant", "aten.constant_pad_nd.default", lambda x: F.pad(x, (1, 2, 0, 1), value=0.5),
     [rnd(2, 3, 4)]),
    ("pad_reflect", None, lambda x: F.pad(x, (2, 1), mode="reflect"), [rnd(1, 2, 5)]),
    ("pad_replicate", None, lambda x: F.pad(x, (1, 1, 2, 0), mode="replicate"),
     [rnd(1, 2, 3, 4)]),
    ("index_select", "aten.index_select.default", lambda x, i: x.index_select(1, i),
     [rnd(3, 5), idx(5, 4)]),
    ("embedding", "aten.embedding.default", lambda i: F.embedding(i, EMB), [idx(10, 2, 3)]),
    ("gather", "aten.gather.default", lambda x, i: x.gather(1, i), [rnd(3, 5), idx(5, 3, 2)]),
    ("index_first", "aten.index.Tensor", lambda x, i: x[i], [rnd(5, 3), idx(5, 2, 2)]),
    ("index_mid", "aten.index.Tensor", lambda x, i: x[:, i], [rnd(2, 5, 3), idx(5, 4)]),
    ("index_two", "aten.index.Tensor", lambda x, i, j: x[i, j], [rnd(4, 5), idx(4, 3), idx(5, 3)]),
    ("tril", None, lambda x: x.tril(), [rnd(4, 4)]),
    ("triu", None, lambda x: x.triu(1), [rnd(3, 5)]),
    ("narrow", None, lambda x: x.narrow(1, 1, 2), [rnd(3, 4)]),
    # reductions
    ("sum_dim", "aten.sum.dim_IntList", lambda x: x.sum(1), [rnd(3, 4, 5)]),
    ("sum_all", None, lambda x: x.sum(), [rnd(3, 4)]),
    ("sum_keepdim", "aten.sum.dim_IntList", lambda x: x.sum((0, 2), keepdim=True),
     [rnd(3, 4, 5)]),
    ("sum_int", None, lambda x: x.sum(0), [ints(3, 4)]),
    ("mean", "aten.mean.dim", lambda x: x.mean(-1), [rnd(3, 4)]),
    ("amax", "aten.amax.default", lambda x: x.amax(1), [rnd(3, 4)]),
    ("amin", "aten.amin.default", lambda x: x.amin((0, 1)), [rnd(3, 4)]),
    ("max_dim", "aten.max.dim", lambda x: x.max(1).values + x.max(1).indices, [rnd(3, 4)]),
    ("min_dim", "aten.min.dim", lambda x: x.min(0).indices, [rnd(3, 4)]),
    ("max_all", None, lambda x: x.max(), [rnd(3, 4)]),
    ("argmax", "aten.argmax.default", lambda x: x.argmax(-1), [rnd(3, 4)]),
    ("argmin_flat", "aten.argmin.default", lambda x: x.argmin(), [rnd(3, 4)]),
    ("prod", "aten.prod.dim_int", lambda x: x.prod(1), [pos(3, 4)]),
    ("var", "aten.var.correction", lambda x: x.var(1), [rnd(3, 6)]),
    ("std", None, lambda x: x.std(0, unbiased=False), [rnd(5, 2)]),
    ("any", None, lambda m: m.any(1), [mask(3, 4)]),
    ("all", None, lambda m: m.all(), [mask(3, 4)]),
    ("cumsum", "aten.cumsum.default", lambda x: x.cumsum(1), [rnd(3, 5)]),
    ("topk", "aten.topk.default", lambda x: torch.topk(x, 2).values, [rnd(3, 6)]),
    # nn
    ("linear", "aten.linear.default", lambda x, w, b: F.linear(x, w, b),
     [rnd(2, 3, 4), rnd(5, 4), rnd(5)]),
    ("mm", None, lambda x, y: x.mm(y), [rnd(3, 4), rnd(4, 2)]),
    ("bmm", None, torch.bmm, [rnd(2, 3, 4), rnd(2, 4, 5)]),
    ("matmul", "aten.matmul.default", torch.matmul, [rnd(2, 3, 4), rnd(4, 5)]),
    ("addmm", None, lambda b, x, y: torch.addmm(b, x, y, beta=0.5, alpha=2.0),
     [rnd(2), rnd(3, 4), rnd(4, 2)]),
    ("conv1d", "aten.conv1d.default", lambda x, w: F.conv1d(x, w, stride=2, padding=1),
     [rnd(1, 2, 9), rnd(3, 2, 3)]),
    ("conv2d", "aten.conv2d.default", lambda x: F.conv2d(x, CONV_W, padding=1, dilation=1),
     [rnd(1, 4, 6, 6)]),
    ("conv2d_groups", "aten.conv2d.default",
     lambda x, w, b: F.conv2d(x, w, b, stride=(2, 1), padding=(1, 0), dilation=(1, 2), groups=2),
     [rnd(1, 4, 7, 7), rnd(6, 2, 3, 3), rnd(6)]),
    ("conv2d_same", None, lambda x: F.conv2d(x, CONV_W, padding="same"),
     [rnd(1, 4, 5, 5)]),
    ("conv_transpose2d", "aten.convolution.default",
     lambda x: F.conv_transpose2d(x, CONVT_W, stride=2, padding=1, output_padding=1),
     [rnd(1, 4, 4, 4)]),
    ("max_pool2d", "aten.max_pool2d_with_indices.default",
     lambda x: F.max_pool2d(x, 3, stride=2, padding=1), [rnd(1, 2, 7, 7)]),
    ("max_pool2d_ceil", "aten.max_pool2d_with_indices.default",
     lambda x: F.max_pool2d(x, 2, ceil_mode=True), [rnd(1, 2, 5, 5)]),
    ("avg_pool2d", "aten.avg_pool2d.default",
     lambda x: F.avg_pool2d(x, 3, stride=2, padding=1), [rnd(1, 2, 6, 6)]),
    ("avg_pool2d_nopad_count", "aten.avg_pool2d.default",
     lambda x: F.avg_pool2d(x, 2, padding=1, count_include_pad=False), [rnd(1, 2, 5, 5)]),
    ("adaptive_avg_pool_global", None, lambda x: F.adaptive_avg_pool2d(x, 1), [rnd(2, 3, 4, 4)]),
    ("adaptive_avg_pool_2x2", "aten._adaptive_avg_pool2d.default",
     lambda x: F.adaptive_avg_pool2d(x, 2), [rnd(1, 3, 4, 6)]),
    ("softmax", "aten.softmax.int", lambda x: x.softmax(-1), [rnd(3, 5)]),
    ("softmax_dim0", "aten.softmax.int", lambda x: x.softmax(0), [rnd(3, 5)]),
    ("log_softmax", "aten.log_softmax.int", lambda x: F.log_softmax(x, 1), [rnd(3, 5)]),
    ("layer_norm", "aten.layer_norm.default", lambda x, w, b: F.layer_norm(x, (4,), w, b),
     [rnd(2, 3, 4), rnd(4), rnd(4)]),
    ("layer_norm_2d", "aten.layer_norm.default", lambda x: F.layer_norm(x, (3, 4), eps=1e-3),
     [rnd(2, 3, 4)]),
    ("batch_norm", "aten._native_batch_norm_legit_no_training.default",
     lambda x, m, v, w, b: F.batch_norm(x, m, v, w, b, eps=1e-3),
     [rnd(2, 3, 4), rnd(3), pos(3), rnd(3), rnd(3)]),
    ("group_norm", "aten.group_norm.default", lambda x, w, b: F.group_norm(x, 2, w, b),
     [rnd(2, 4, 3, 3), rnd(4), rnd(4)]),
    ("sdpa", "aten.scaled_dot_product_attention.default", F.scaled_dot_product_attention,
     [rnd(1, 2, 4, 8), rnd(1, 2, 5, 8), rnd(1, 2, 5, 8)]),
    ("sdpa_causal_scale", "aten.scaled_dot_product_attention.default",
     lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3),
     [rnd(2, 4, 8), rnd(2, 4, 8), rnd(2, 4, 6)]),
    ("sdpa_float_mask", "aten.scaled_dot_product_attention.default",
     lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
     [rnd(1, 2, 3, 4), rnd(1, 2, 5, 4), rnd(1, 2, 5, 4), rnd(3, 5)]),
    ("sdpa_bool_mask", "aten.scaled_dot_product_attention.default",
     lambda q, k, v: F.scaled_dot_product_attention(
         q, k, v, attn_mask=torch.tensor([[True, False, True], [True, True, False]])),
     [rnd(1, 2, 4), rnd(1, 3, 4), rnd(1, 3, 4)]),
    # resampling (F.interpolate)
    ("interp_nearest_2x", "aten.upsample_nearest2d.vec",
     lambda x: F.interpolate(x, scale_factor=2, mode="nearest"), [rnd(1, 2, 3, 5)]),
    ("interp_nearest_size", "aten.upsample_nearest2d.vec",
     lambda x: F.interpolate(x, size=(7, 4), mode="nearest"), [rnd(1, 2, 5, 6)]),
    ("interp_nearest_exact", None,
     lambda x: F.interpolate(x, size=(7, 4), mode="nearest-exact"), [rnd(1, 2, 5, 6)]),
    ("interp_bilinear", "aten.upsample_bilinear2d.vec",
     lambda x: F.interpolate(x, scale_factor=1.5, mode="bilinear"), [rnd(1, 2, 4, 6)]),
    ("interp_bilinear_down", "aten.upsample_bilinear2d.vec",
     lambda x: F.interpolate(x, size=(3, 1), mode="bilinear"), [rnd(2, 2, 7, 5)]),
    ("interp_bilinear_corners", "aten.upsample_bilinear2d.vec",
     lambda x: F.interpolate(x, size=(7, 9), mode="bilinear", align_corners=True),
     [rnd(1, 3, 4, 6)]),
    ("interp_bicubic", None,
     lambda x: F.interpolate(x, size=(7, 9), mode="bicubic"), [rnd(1, 2, 4, 6)]),
    ("interp_linear_1d", None,
     lambda x: F.interpolate(x, size=9, mode="linear"), [rnd(2, 3, 5)]),
    ("interp_nearest_3d", None,
     lambda x: F.interpolate(x, scale_factor=(2, 1, 3), mode="nearest"), [rnd(1, 2, 2, 3, 2)]),
    # norms
    ("vector_norm", "aten.linalg_vector_norm.default",
     lambda x: torch.linalg.vector_norm(x, dim=-1), [rnd(3, 4)]),
    ("vector_norm_p3", "aten.linalg_vector_norm.default",
     lambda x: torch.linalg.vector_norm(x, ord=3, dim=(0, 2), keepdim=True), [rnd(3, 4, 2)]),
    ("vector_norm_inf", "aten.linalg_vector_norm.default",
     lambda x: torch.linalg.vector_norm(x, ord=float("inf")), [rnd(3, 4)]),
    ("vector_norm_l1", "aten.linalg_vector_norm.default",
     lambda x: torch.linalg.vector_norm(x, ord=1, dim=0), [rnd(3, 4)]),
    ("normalize", None, lambda x: F.normalize(x, dim=1), [rnd(2, 5, 3)]),
    ("instance_norm", "aten._native_batch_norm_legit.no_stats",
     lambda x, w, b: F.instance_norm(x, weight=w, bias=b, eps=1e-4),
     [rnd(2, 3, 4, 5), rnd(3), rnd(3)]),
    ("instance_norm_plain", None, lambda x: F.instance_norm(x), [rnd(2, 3, 6)]),
    # elementwise
    ("trunc", "aten.trunc.default", lambda x: torch.trunc(x * 3), [rnd(7)]),
    ("erfc", "aten.erfc.default", torch.special.erfc, [rnd(7)]),
    ("hypot", "aten.hypot.default", torch.hypot, [rnd(6), rnd(6)]),
    # scatter
    ("scatter_src", "aten.scatter.src", lambda x, i, u: x.scatter(1, i, u),
     [rnd(3, 5), lambda g: torch.argsort(torch.rand(3, 5, generator=g), dim=1)[:, :2],
      rnd(3, 4)]),
    ("scatter_value", "aten.scatter.value", lambda x, i: x.scatter(0, i, 2.5),
     [rnd(4, 3), lambda g: torch.argsort(torch.rand(4, 3, generator=g), dim=0)[:2]]),
    ("scatter_add", "aten.scatter_add.default", lambda x, i, u: x.scatter_add(1, i, u),
     [rnd(3, 5), idx(5, 3, 4), rnd(3, 4)]),
    ("slice_scatter", "aten.slice_scatter.default",
     lambda x, u: torch.slice_scatter(x, u, dim=1, start=1, end=3), [rnd(3, 5), rnd(3, 2)]),
    ("slice_scatter_step", "aten.slice_scatter.default",
     lambda x, u: torch.slice_scatter(x, u, dim=0, step=2), [rnd(5, 3), rnd(3, 3)]),
    ("copy_broadcast", None, lambda x, y: x.clone().copy_(y), [rnd(3, 4), rnd(4)]),
    ("scatter_reduce_amax", "aten.scatter_reduce.two",
     lambda x, i, u: x.scatter_reduce(1, i, u, reduce="amax"), [rnd(3, 5), idx(5, 3, 4), rnd(3, 4)]),
    ("scatter_reduce_prod", "aten.scatter_reduce.two",
     lambda x, i, u: x.scatter_reduce(0, i, u, reduce="prod"), [rnd(4, 3), idx(4, 2, 3), rnd(2, 3)]),
    ("cumprod", "aten.cumprod.default", lambda x: torch.cumprod(x, 1), [rnd(3, 5)]),
    ("pad_crop", "aten.constant_pad_nd.default", lambda x: F.pad(x, (1, -2, -1, 2), value=0.5),
     [rnd(2, 4, 5)]),
    ("atan2", "aten.atan2.default", torch.atan2, [rnd(9), rnd(9)]),
    ("grid_sample", "aten.grid_sampler_2d.default",
     lambda x, g: F.grid_sample(x, g, mode="bilinear", padding_mode="border", align_corners=False),
     [rnd(1, 2, 4, 5), lambda g: torch.rand(1, 3, 4, 2, generator=g) * 2.4 - 1.2]),
    ("grid_sample_nearest", "aten.grid_sampler_2d.default",
     lambda x, g: F.grid_sample(x, g, mode="nearest", align_corners=True),
     [rnd(1, 2, 4, 5), lambda g: torch.rand(1, 3, 4, 2, generator=g) * 1.8 - 0.9]),
    ("adaptive_max_pool", "aten.adaptive_max_pool2d.default",
     lambda x: F.adaptive_max_pool2d(x, (2, 3)), [rnd(1, 2, 4, 6)]),
    ("adaptive_max_pool_global", None, lambda x: F.adaptive_max_pool2d(x, 1), [rnd(2, 3, 4, 5)]),
    ("copysign", "aten.copysign.Tensor", torch.copysign,
     [rnd(6), lambda g: torch.tensor([1.0, -1.0, 0.0, -0.0, 2.5, -3.0])]),
    ("lshift", None, lambda x: x << 2, [ints(6)]),
    ("rshift", None, lambda x, y: x >> y, [ints(6, lo=-40, hi=40), ints(6, lo=0, hi=4)]),
    ("diagonal", "aten.diagonal.default", lambda x: torch.diagonal(x, 1, 1, 2), [rnd(2, 3, 4)]),
    ("diagonal_neg", "aten.diagonal.default", lambda x: torch.diagonal(x, -1), [rnd(4, 3)]),
    ("einsum_trace", None, lambda x: torch.einsum("ii->i", x), [rnd(3, 3)]),
    ("unfold", "aten.unfold.default", lambda x: x.unfold(1, 3, 2), [rnd(2, 7, 3)]),
    ("sort", "aten.sort.default", lambda x: torch.sort(x, dim=1, descending=True).values,
     [rnd(3, 6)]),
    ("sort_indices", "aten.sort.default", lambda x: torch.sort(x).indices, [rnd(2, 7)]),
    ("argsort", None, lambda x: torch.argsort(x, dim=0), [rnd(5, 3)]),
    ("sort_stable_ties", "aten.sort.stable",
     lambda x: torch.sort(x, stable=True, descending=True).indices, [ints(4, 9, lo=0, hi=3)]),
    ("as_strided", "aten.as_strided.default",
     lambda x: torch.as_strided(x, (3, 2, 2), (4, 1, 2), 1), [rnd(4, 4)]),
    ("as_strided_windows", "aten.as_strided.default",
     lambda x: (x + 1).as_strided((2, 2, 2, 3), (12, 3, 6, 1)), [rnd(4, 6)]),
    # creation
    ("arange", "aten.arange.start_step", lambda x: x + torch.arange(1, 9, 2), [rnd(3, 4)]),
    ("full", "aten.full.default", lambda x: x * torch.full((3, 1), 2.0), [rnd(3, 4)]),
    ("zeros_like", None, lambda x: torch.zeros_like(x) + x * 2, [rnd(2, 2)]),
    ("ones", None, lambda x: torch.ones(3, dtype=torch.int64) + x, [ints(3)]),
]


def sweep_args(case_id, makers):
    g = torch.Generator().manual_seed(sum(map(ord, case_id)))
    return [m(g) for m in makers]


class Sweep(nn.Module):
    """Every sweep case in one module: one export, one import and one C build check them all."""

    def forward(self, *flat):
        outs, k = [], 0
        for _, _, fn, makers in SWEEP:
            outs.append(fn(*flat[k:k + len(makers)]))
            k += len(makers)
        return tuple(outs)


@pytest.fixture(scope="module")
def sweep():
    """(exported program, flat inputs, eager outputs, graph, report, interpreter outputs)."""
    args = tuple(a for case_id, _, _, makers in SWEEP for a in sweep_args(case_id, makers))
    module = Sweep()
    ep = torch.export.export(module, args)
    graph, report = import_torch(ep)
    ours = interpret(graph, {v.name: a.numpy() for v, a in zip(graph.inputs, args)})
    return ep, args, eager(module, args), report, ours


@pytest.mark.parametrize("case_id", [c[0] for c in SWEEP])
def test_aten_op_sweep(sweep, case_id):
    """Each case imported and run by the graph reference interpreter, against eager."""
    _, _, ref, report, ours = sweep
    k, (_, op, _, _) = next((k, c) for k, c in enumerate(SWEEP) if c[0] == case_id)
    if op is not None:
        assert op in report["aten_ops"], f"{op} not in the exported graph"
        assert op in supported_aten_ops()
    assert_close(ours[k], ref[k], case_id)


def test_aten_op_sweep_compiled(sweep):
    """The same cases compiled to C in one artifact and run by the runtime, against eager."""
    ep, args, ref, _, _ = sweep
    ours = deploy.compile(ep).load().run([a.numpy() for a in args])
    failures = []
    for (case_id, *_), o, r in zip(SWEEP, ours, ref):
        try:
            assert_close(o, r, case_id)
        except AssertionError as e:
            failures.append(f"{case_id}: {str(e).strip().splitlines()[0]}")
    assert not failures, "\n".join(failures)


# ---- errors, listing, dynamic dims, files --------------------------------------------------

class Unsupported(nn.Module):
    def forward(self, x):
        y = torch.cummax(x, dim=-1).values + torch.cummax(x * 2, dim=0).values
        return torch.special.i0(y) + torch.linalg.det(x)


def test_unsupported_ops_listed_at_once():
    with pytest.raises(UnsupportedAtenOpsError) as info:
        import_torch(Unsupported(), example_inputs=(torch.randn(3, 3),))
    err = info.value
    ops = {op: nodes for op, nodes, _ in err.rows}
    assert "aten.cummax.default" in ops and len(ops["aten.cummax.default"]) == 2
    assert "aten.i0.default" in ops
    assert len(ops) >= 3  # det decomposes into further unsupported ops, listed too
    assert isinstance(err, deploy.UnsupportedOpsError)
    assert "aten.cummax.default x2" in str(err)


def test_list_ops_marks_support():
    rows = list_ops(Unsupported(), example_inputs=(torch.randn(3, 3),))
    by_op = {op: ok for _, op, _, ok in rows}
    assert by_op["aten.cummax.default"] is False and by_op["aten.add.Tensor"] is True
    assert all(len(r) == 4 for r in rows)


def test_dynamic_batch_bound_and_reported():
    torch.manual_seed(0)
    module = MLP().eval()
    batch = torch.export.Dim("batch", min=1, max=64)
    ep = torch.export.export(module, (torch.randn(2, 16),), dynamic_shapes={"x": {0: batch}})
    graph, report = import_torch(ep, shapes={"x": (5, 16)})
    assert graph.inputs[0].shape == (5, 16)
    (name, info), = report["dynamic_dims"].items()
    assert report["bound_dims"] == {name: 5} and info["from"] == "--shape"
    assert info["range"] == [1, 64] and "bound" in report["dynamic_note"]
    # with no --shape the Dim stays symbolic, under its own name: one artifact, every batch
    art = deploy.compile(module, example_inputs=(torch.randn(3, 16),),
                         dynamic_shapes={"x": {0: batch}})
    assert art.manifest["provenance"]["bound_dims"] == {}
    mod = art.load()
    assert mod.input_specs[0].shape[0] == "batch"
    for n in (3, 1, 64):
        x = torch.randn(n, 16)
        assert_close(mod.run([x.numpy()])[0], eager(module, (x,))[0], f"dynamic batch {n}")
    with pytest.raises(deploy.InputError, match="batch=65 is outside the compiled range 1..64"):
        mod.run([torch.randn(65, 16).numpy()])


def test_dynamic_dim_out_of_range_is_an_error():
    batch = torch.export.Dim("batch", min=2, max=8)
    ep = torch.export.export(MLP().eval(), (torch.randn(2, 16),), dynamic_shapes=({0: batch},))
    with pytest.raises(deploy.ModelError, match="outside the range"):
        import_torch(ep, shapes={"x": (9, 16)})
    with pytest.raises(deploy.ModelError, match="only dynamic dims"):
        import_torch(ep, shapes={"x": (4, 15)})


def test_pt2_file_compiles(tmp_path):
    torch.manual_seed(0)
    module, x = MLP().eval(), torch.randn(3, 16)
    path = tmp_path / "mlp.pt2"
    torch.export.save(torch.export.export(module, (x,)), str(path))
    art = deploy.compile(str(path))
    assert art.manifest["provenance"]["source"] == str(path)
    assert_close(art.load().run({"x": x.numpy()})[0], eager(module, (x,))[0], "pt2")


def test_bad_inputs_are_model_errors(tmp_path):
    (tmp_path / "bad.pt2").write_bytes(b"not a program")
    with pytest.raises(deploy.ModelError, match="torch.export"):
        deploy.compile(str(tmp_path / "bad.pt2"))
    with pytest.raises(deploy.ModelError, match="example_inputs"):
        deploy.compile(MLP())


def test_docs_list_the_supported_ops():
    from deploy.frontends.torch.docs import ops_table
    doc = (__import__("pathlib").Path(__file__).resolve().parents[1] / "docs" / "torch.md")
    assert ops_table() in doc.read_text(), \
        "docs/torch.md is stale: python -m deploy.frontends.torch.docs --write"


def test_import_deploy_without_torch():
    """torch stays optional: importing deploy and compiling ONNX never imports torch."""
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import numpy as np, deploy\n"
        "from tests.util import make_model, helper\n"
        "m = make_model([helper.make_node('Relu', ['x'], ['y'])], [('x', np.float32, [2])],"
        " [('y', np.float32, [2])])\n"
        "out = deploy.compile(m).load().run({'x': np.array([-1, 2], np.float32)})[0]\n"
        "assert out.tolist() == [0, 2], out\n")
    root = str(__import__("pathlib").Path(__file__).resolve().parents[1])
    subprocess.run([sys.executable, "-c", code], check=True, cwd=root)


# ---- real models (random weights) ----------------------------------------------------------

def _hf_models():
    tf = pytest.importorskip("transformers")
    return {
        "bert": (lambda: tf.BertModel(tf.BertConfig(
            vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=64, max_position_embeddings=64)), lambda: (torch.randint(0, 100, (2, 8)),)),
        "gpt2": (lambda: tf.GPT2Model(tf.GPT2Config(
            vocab_size=100, n_embd=32, n_layer=2, n_head=4, n_positions=64, use_cache=False)),
            lambda: (torch.randint(0, 100, (2, 8)),)),
        "resnet": (lambda: tf.ResNetModel(tf.ResNetConfig(
            embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic")),
            lambda: (torch.randn(1, 3, 32, 32),)),
    }


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bert", "gpt2", "resnet"])
def test_transformers_models(name):
    torch.manual_seed(0)
    make, inputs = _hf_models()[name]
    module, args = make().eval(), inputs()
    art = deploy.compile(module, example_inputs=args)
    ours = art.load().run([a.numpy() for a in args])
    with torch.no_grad():
        ref = module(*args).to_tuple()
    for k, (o, r) in enumerate(zip(ours, ref)):
        assert_close(o, r, f"{name} output {k}")
