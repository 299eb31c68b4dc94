"""torch.export / torch.compile programs with dynamic dims compile to ONE symbolic artifact.

Each program is exported with ``torch.export.Dim``s, compiled once with no shapes, and run at
several sizes against the torch module itself (fp32, rtol 1e-4 / atol 1e-5).
"""
from __future__ import annotations

import logging

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
Dim = torch.export.Dim

import deploy
import deploy.compiler
import deploy.torch_backend  # registers backend="deploy"
from deploy.frontends.torch import import_torch
from deploy.frontends.torch.symbolic import to_sym
from deploy.graph_ir import sym
from deploy.graph_ir.sym import Sym

RTOL, ATOL = 1e-4, 1e-5


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 8)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class Block(nn.Module):
    """Pre-norm attention (softmax) and a GELU feed-forward; views use the runtime sizes."""

    def __init__(self, d=32, heads=4):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.ff = nn.Sequential(nn.Linear(d, 64), nn.GELU(), nn.Linear(64, d))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = torch.softmax(q @ k.transpose(-1, -2) * (d // self.heads) ** -0.5, dim=-1)
        x = x + self.proj((a @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.ff(self.ln2(x))


def check(mod, module, x):
    with torch.no_grad():
        ref = module(x).numpy()
    out = mod.run([x.numpy()])[0]
    assert out.shape == ref.shape
    np.testing.assert_allclose(out, ref, rtol=RTOL, atol=ATOL, err_msg=f"shape {tuple(x.shape)}")


@pytest.fixture(scope="module")
def mlp():
    torch.manual_seed(0)
    module = MLP().eval()
    ep = torch.export.export(module, (torch.randn(4, 16),),
                             dynamic_shapes={"x": {0: Dim("batch", max=64)}})
    return module, ep


def test_mlp_one_artifact_every_batch(mlp):
    module, ep = mlp
    art = deploy.compile(ep)
    assert art.manifest["symbols"] == ["batch"]
    assert art.manifest["dims"]["batch"] == [1, 64]
    assert art.manifest["provenance"]["bound_dims"] == {}
    mod = art.load()
    g = torch.Generator().manual_seed(1)
    for b in (1, 2, 7, 64, 3):
        check(mod, module, torch.randn(b, 16, generator=g))
    with pytest.raises(deploy.InputError, match="batch"):
        mod.run([np.zeros((65, 16), np.float32)])


def test_transformer_block_one_artifact_every_size():
    torch.manual_seed(0)
    module = Block().eval()
    ep = torch.export.export(module, (torch.randn(2, 8, 32),), dynamic_shapes={
        "x": {0: Dim("batch", max=64), 1: Dim("seq", max=128)}})
    art = deploy.compile(ep)
    assert art.manifest["symbols"] == ["batch", "seq"]
    assert art.manifest["dims"] == {"batch": [1, 64], "seq": [1, 128]}
    mod = art.load()
    g = torch.Generator().manual_seed(2)
    for b, t in ((1, 1), (2, 8), (3, 17), (1, 128), (5, 33)):
        check(mod, module, torch.randn(b, t, 32, generator=g))
    with pytest.raises(deploy.InputError, match="seq"):
        mod.run([np.zeros((2, 129, 32), np.float32)])


class Upsample(nn.Module):
    """A decoder step: a conv, 2x nearest upsampling, a conv over the larger map."""

    def __init__(self):
        super().__init__()
        self.conv, self.head = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 4, 3, padding=1)

    def forward(self, x):
        return self.head(nn.functional.interpolate(self.conv(x), scale_factor=2, mode="nearest"))


def test_nearest_upsampling_by_whole_factors_keeps_height_and_width_symbolic():
    torch.manual_seed(0)
    module = Upsample().eval()
    ep = torch.export.export(module, (torch.randn(1, 3, 8, 12),), dynamic_shapes={
        "x": {2: Dim("h", min=2, max=256), 3: Dim("w", min=2, max=256)}})
    art = deploy.compile(ep)
    assert art.manifest["symbols"] == ["h", "w"]
    assert "bound_symbols" not in art.manifest["provenance"]
    mod = art.load()
    g = torch.Generator().manual_seed(3)
    for hh, ww in ((2, 2), (8, 12), (31, 17)):
        check(mod, module, torch.randn(1, 3, hh, ww, generator=g))


class Decoder(nn.Module):
    """SegFormer's decode step: a strided feature map resized (bilinear) to the input's own
    height and width, then added to it."""

    def __init__(self):
        super().__init__()
        self.down, self.lat = nn.Conv2d(3, 6, 3, stride=2, padding=1), nn.Conv2d(3, 6, 1)

    def forward(self, x):
        y = nn.functional.interpolate(self.down(x), size=x.shape[2:], mode="bilinear")
        return self.lat(x) + y


def test_bilinear_resize_to_a_symbolic_size():
    torch.manual_seed(0)
    module = Decoder().eval()
    ep = torch.export.export(module, (torch.randn(1, 3, 8, 12),), dynamic_shapes={
        "x": {2: Dim("h", min=3, max=256), 3: Dim("w", min=3, max=256)}})  # (torch: h // 2 > 1)
    art = deploy.compile(ep)
    assert art.manifest["symbols"] == ["h", "w"]
    mod = art.load()
    g = torch.Generator().manual_seed(4)
    for hh, ww in ((3, 3), (8, 12), (31, 17)):
        check(mod, module, torch.randn(1, 3, hh, ww, generator=g))


def test_shapes_still_bind(mlp):
    module, ep = mlp
    art = deploy.compile(ep, shapes={"x": (5, 16)})
    assert "symbols" not in art.manifest
    assert art.manifest["provenance"]["bound_dims"] == {"batch": 5}
    mod = art.load()
    check(mod, module, torch.randn(5, 16))
    with pytest.raises(deploy.InputError):
        mod.run([np.zeros((4, 16), np.float32)])


def test_bind_by_name_and_report(mlp):
    _, ep = mlp
    with sym.using(sym.SymContext()):
        graph, report = import_torch(ep, bind={"batch": 8})
    assert graph.inputs[0].shape == (8, 16)
    assert report["bound_dims"] == {"batch": 8}
    assert report["dynamic_dims"]["batch"]["from"] == "dims"
    with sym.using(sym.SymContext()) as ctx:
        graph, report = import_torch(ep)
    assert graph.inputs[0].shape == (Sym.symbol("batch"), 16)
    assert report["bound_dims"] == {} and report["symbols"] == ["batch"]
    assert report["dynamic_dims"]["batch"]["range"] == [0, 64]  # as torch exported it
    assert ctx.ranges["batch"] == (1, 64)  # deploy's sizes are at least 1


def test_dims_option_binds(mlp):
    module, ep = mlp
    art = deploy.compile(ep, dims={"batch": 3})
    if "symbols" in art.manifest:
        pytest.xfail("compiler.import_model does not pass bind= to import_torch yet")
    assert art.manifest["provenance"]["bound_dims"] == {"batch": 3}
    check(art.load(), module, torch.randn(3, 16))


def test_export_lower_bound_and_loaded_names(tmp_path):
    ep = torch.export.export(MLP().eval(), (torch.randn(4, 16),),
                             dynamic_shapes={"x": {0: Dim("n", min=2, max=8)}})
    with sym.using(sym.SymContext()) as ctx:
        _, report = import_torch(ep)
    assert report["symbols"] == ["n"] and ctx.ranges["n"] == (2, 8)
    # a program loaded from a .pt2 file has lost the Dim's name: torch's symbol names the dim
    path = tmp_path / "mlp.pt2"
    torch.export.save(ep, str(path))
    with sym.using(sym.SymContext()) as ctx:
        graph, report = import_torch(str(path))
    (name,) = report["symbols"]
    assert name.startswith("s") and ctx.ranges[name] == (2, 8)
    assert graph.inputs[0].shape == (Sym.symbol(name), 16)


def test_sympy_sizes_convert():
    import sympy
    from torch.utils._sympy.functions import FloorDiv, Max, Min, ModularIndexing, PythonMod
    b, s = sympy.symbols("s0 s1", integer=True, positive=True)
    env = {b: Sym.symbol("batch"), s: Sym.symbol("seq")}
    B, S = env[b], env[s]
    assert to_sym(b * s * 32 + 7, env) == B * S * 32 + 7
    assert to_sym(FloorDiv(b * 64, 8), env) == 8 * B
    assert to_sym(FloorDiv(s + 1, 2), env) == sym.floordiv(S + 1, 2)
    assert to_sym(PythonMod(s, 4), env) == sym.mod(S, 4)
    assert to_sym(Max(1, s - 3), env) == sym.smax(1, S - 3)
    assert to_sym(Min(s, 128), env) == sym.smin(S, 128)
    assert to_sym(ModularIndexing(s, 2, 4), env) == sym.mod(sym.floordiv(S, 2), 4)
    assert to_sym(s ** 2, env) == S * S
    assert to_sym(b * 3, {b: 5, s: S}) == 15  # bound symbols are substituted


@pytest.mark.parametrize("name", ["mlp", "block"])
def test_torch_compile_dynamic_compiles_once(name, monkeypatch, caplog):
    """dynamic=True: one symbolic deploy artifact serves three sizes (for the block, batch and
    sequence both vary, and LayerNorm's eps reaches the backend as a 0-d tensor)."""
    calls = []
    real = deploy.compiler.compile
    monkeypatch.setattr(deploy.compiler, "compile",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    torch._dynamo.reset()
    torch.manual_seed(0)
    module = (MLP if name == "mlp" else Block)().eval()
    shape = (lambda b: (b, 16)) if name == "mlp" else (lambda b: (b, 2 * b + 1, 32))
    fast = torch.compile(module, backend="deploy", dynamic=True)
    g = torch.Generator().manual_seed(3)
    with caplog.at_level(logging.WARNING, logger="deploy.torch"), torch.no_grad():
        for b in (2, 5, 3):
            x = torch.randn(*shape(b), generator=g)
            np.testing.assert_allclose(fast(x).numpy(), module(x).numpy(), rtol=RTOL,
                                       atol=ATOL)
    assert not [r for r in caplog.records if "eagerly" in r.getMessage()], caplog.text
    assert len(calls) == 1, f"deploy compiled {len(calls)} times for 3 sizes"


def test_torch_compile_scalar_argument_runs_eagerly(caplog):
    class Shift(nn.Module):
        def forward(self, x, n: int):
            return x * 2 + n

    torch._dynamo.reset()
    fast = torch.compile(Shift(), backend="deploy", dynamic=True)
    with caplog.at_level(logging.WARNING, logger="deploy.torch"), torch.no_grad():
        for n in (3, 4):
            x = torch.randn(2, 3)
            torch.testing.assert_close(fast(x, n), x * 2 + n)
    lines = [r.getMessage() for r in caplog.records if "eagerly" in r.getMessage()]
    assert lines and "not a size of a tensor input" in lines[0], caplog.text
