"""``bench/fp8_error.py``: e4m3 fake quantization against ml_dtypes, and the error table."""
import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from deploy.bench.fp8_error import errors, fake_e4m3, round_weight


def test_fake_quantization_rounds_as_ml_dtypes_does():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(4096) * 3).astype(np.float32)
    x[:4] = [1000.0, -1000.0, 0.0, 1e-9]  # saturation and the smallest values
    scale = np.float32(0.5)
    ref = np.clip(x / scale, -448, 448).astype(ml_dtypes.float8_e4m3fn).astype(np.float32) * scale
    got = fake_e4m3(torch.from_numpy(x), torch.tensor(scale)).numpy()
    np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("how", ["column", "block16"])
def test_weight_rounding_stays_within_half_a_step(how):
    w = torch.randn(64, 128)
    wq = round_weight(w, how)
    normal = w.abs() > w.abs().amax() / 448 * 2 ** -6 * 64  # well inside e4m3's normal range
    assert torch.all((wq - w).abs()[normal] <= w.abs()[normal] * 2 ** -4)
    assert not torch.equal(wq, w)


def test_error_table_on_a_tiny_transformer():
    table = {(w, x): e for w, x, e in errors("bert_base", batch=1, tiny=True)}
    assert table["float32", "float32"] == 0.0
    assert 1e-3 < table["column", "tensor"] < 0.3
    # rounding both operands costs more than rounding the weights alone
    assert table["column", "tensor"] > table["column", "float32"]
