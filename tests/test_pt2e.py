"""PT2E-quantized torch programs (torchao's ``prepare_pt2e`` / ``convert_pt2e`` with
``X86InductorQuantizer``) run their convolutions and linears as integer kernels, and match
torch's own execution of the quantized program.

Tolerances: relative L2 against torch's eager run of the converted program <= 2e-2 (both round
each requantization; deploy's integer accumulation and torch's float one can land one step apart
at a rounding tie, about 1e-2 of such a small model's output), and the same argmax per row."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchao")

import deploy
from deploy.bench.int8 import int8_kernel_count
from deploy.bench.pt2e import quantize_pt2e

nn = torch.nn


class Block(nn.Module):
    """conv-bn-relu twice with a residual add and relu (a ResNet basic block)."""

    def __init__(self, c: int):
        super().__init__()
        self.a = nn.Sequential(nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU())
        self.b = nn.Sequential(nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c))

    def forward(self, x):
        return torch.relu(self.b(self.a(x)) + x)


def _cnn():
    torch.manual_seed(0)
    # 24 channels: one whole 16-column panel (vector epilogue) and a part one (scalar)
    m = nn.Sequential(nn.Conv2d(3, 24, 3, stride=2, padding=1), nn.BatchNorm2d(24), nn.ReLU(),
                      nn.MaxPool2d(2), Block(24), nn.Conv2d(24, 32, 1), nn.ReLU(),
                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10)).eval()
    for bn in (x for x in m.modules() if isinstance(x, nn.BatchNorm2d)):
        bn.running_mean.normal_(0, 0.1)
        bn.running_var.uniform_(0.5, 1.5)
    return m


class Mlp(nn.Module):
    """A transformer's feed-forward half: LayerNorm, Linear, GELU, Linear, residual."""

    def __init__(self, d: int = 64, h: int = 128):
        super().__init__()
        self.norm, self.up, self.down = nn.LayerNorm(d), nn.Linear(d, h), nn.Linear(h, d)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


def _quantized(module, shape, calib: int = 6, **options):
    gen = torch.Generator().manual_seed(1)
    example = (torch.randn(shape, generator=gen),)
    return quantize_pt2e(module, example, [(torch.randn(shape, generator=gen),)
                                           for _ in range(calib)], **options)


def _check(ep, shape, contractions: int, target: str = "host"):
    art = deploy.compile(ep, target=target)
    assert int8_kernel_count(art) == contractions
    mod = art.load()
    name = mod.input_specs[0].name
    for seed in (11, 12):
        x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
        with torch.no_grad():
            ref = ep.module()(torch.from_numpy(x)).numpy()
        got = mod.run({name: x})[0]
        err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
        assert err <= 2e-2, err
        assert (got.reshape(-1, got.shape[-1]).argmax(-1)
                == ref.reshape(-1, ref.shape[-1]).argmax(-1)).all()
    return art


@pytest.mark.parametrize("target", ["host", "x86_64-avx2"])
def test_pt2e_cnn_runs_integer_convolutions(target):
    ep = _quantized(_cnn(), (2, 3, 32, 32))
    art = _check(ep, (2, 3, 32, 32), contractions=5, target=target)  # 4 convs, the classifier
    notes = " ".join(k["note"] for k in art.manifest["kernels"])
    # each Conv + BN + ReLU requantizes in its kernel (Q(Relu(y)) with zero point 0 is Q(y)),
    # and the block's add + ReLU + quantize run in its second convolution's epilogue
    assert "Relu" not in notes and "_res" in notes, notes


def test_pt2e_linear_layers_run_integer_matmuls():
    ep = _quantized(Mlp(), (2, 8, 64))
    _check(ep, (2, 8, 64), contractions=2)


def test_pt2e_program_saved_as_pt2(tmp_path):
    ep = _quantized(_cnn(), (1, 3, 32, 32))
    path = tmp_path / "q.pt2"
    torch.export.save(ep, str(path))
    art = deploy.compile(str(path), target="host")
    assert int8_kernel_count(art) == 5


def test_pt2e_reduced_range_clamps_as_written():
    # 7-bit activations ([0, 127] in uint8): each quantize clamps inside the type, so it runs as
    # its own float chain; the contractions still read its bytes as integers
    ep = _quantized(_cnn(), (2, 3, 32, 32), reduce_range=True)
    art = _check(ep, (2, 3, 32, 32), contractions=5)
    assert "_res" not in " ".join(k["note"] for k in art.manifest["kernels"])


def test_pt2e_dynamic_quantization_runs_in_float():
    # choose_qparams computes each activation's scale as the program runs: the layers keep the
    # float decomposition (the int8 pass needs constant scales) and match torch's run
    ep = _quantized(Mlp(), (2, 8, 64), dynamic=True)
    targets = {str(n.target) for n in ep.graph.nodes}
    assert "quantized_decomposed.choose_qparams.tensor" in targets
    _check(ep, (2, 8, 64), contractions=0)


def test_pt2e_symbolic_batch_keeps_integer_matmuls():
    # one artifact for every batch size: the linears' rows are symbolic (the C kernel reads
    # them at run time), still integer kernels, and each size matches torch's run
    batch = torch.export.Dim("batch", min=1, max=64)
    gen = torch.Generator().manual_seed(2)
    x = torch.randn((4, 8, 64), generator=gen)
    ep = quantize_pt2e(Mlp(), (x,), [(torch.randn((4, 8, 64), generator=gen),)],
                       dynamic_shapes=({0: batch},))
    art = deploy.compile(ep, target="host")
    assert int8_kernel_count(art) == 2
    mod = art.load()
    for b in (1, 3, 9):
        xb = np.random.default_rng(b).standard_normal((b, 8, 64)).astype(np.float32)
        with torch.no_grad():
            ref = ep.module()(torch.from_numpy(xb)).numpy()
        got = mod.run({mod.input_specs[0].name: xb})[0]
        assert got.shape == ref.shape
        assert np.linalg.norm(got - ref) / np.linalg.norm(ref) <= 2e-2
