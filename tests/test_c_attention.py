"""The fused attention template of the C backend (backends/c/attention.py): attention graphs
compiled for the host and compared with ONNX Runtime on fresh random inputs, across the shapes
that exercise its edges (query rows not a multiple of the row block, keys and head dims not a
multiple of the vector width, a value head dim wider than the query's, padding masks, causal
masks with an offset, the BSHD layout folded into the loads and stores)."""
from __future__ import annotations

import deploy
import numpy as np
import pytest

from tests.attention_graphs import NEG, attention_model, qkv
from tests.util import run_ort


def compiled(model, inputs, rtol=1e-4, atol=1e-5):
    art = deploy.compile(model, target="host")
    ours, ref = art.load().run(inputs), run_ort(model, inputs)
    for k, (a, b) in enumerate(zip(ours, ref)):
        assert a.shape == b.shape and a.dtype == b.dtype, f"output {k}"
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=f"output {k}")
    return art


def templated(art) -> int:
    return sum(s.get("template") == "attention" for k in art.manifest["kernels"]
               for s in k["schedule"])


@pytest.mark.parametrize("b,h,sq,sk,d,dv", [(2, 3, 16, 16, 16, 16), (1, 2, 37, 37, 48, 48),
                                             (1, 1, 5, 23, 80, 24), (2, 2, 9, 130, 16, 96)])
def test_shapes(b, h, sq, sk, d, dv):
    art = compiled(attention_model(b, h, sq, sk, d, dv), qkv(b, h, sq, sk, d, dv))
    assert templated(art) == 1
    (kernel,) = [k for k in art.manifest["kernels"] if any(
        s.get("template") == "attention" for s in k["schedule"])]
    assert kernel["work"] == b * h * sq * sk * (d + dv)  # multiply-adds of q k^T and p v


def test_padding_mask_and_bshd_layout():
    b, h, s, d = 2, 2, 24, 16
    mask = np.zeros((b, 1, 1, s), np.float32)
    mask[0, ..., 15:] = NEG
    mask[1, ..., 20:] = -10000.0
    x = dict(qkv(b, h, s, s, d, bshd=True), mask=mask)
    art = compiled(attention_model(b, h, s, s, d, mask=(b, 1, 1, s), bshd=True), x)
    assert templated(art) == 1


@pytest.mark.parametrize("sq,sk,off", [(33, 33, 0), (20, 27, 7)])
def test_causal(sq, sk, off):
    keep = (np.arange(sk)[None, :] <= np.arange(sq)[:, None] + off)[None, None]
    art = compiled(attention_model(1, 2, sq, sk, 16, where=keep), qkv(1, 2, sq, sk, 16))
    assert templated(art) == 1


def test_probabilities_read_elsewhere_keep_the_generic_stages():
    model = attention_model(1, 2, 8, 8, 16, probs_out=True)
    art = compiled(model, qkv(1, 2, 8, 8, 16))
    assert templated(art) == 0


def test_run_time_causal_mask_skips_trailing_keys(tmp_path):
    # a causal mask that is an input (as symbolic sizes leave GPT-2's: computed as the plan
    # runs) is checked per row in the kernel; the rows below must not skip: row 0 masks every
    # key, row 3's last unmasked key is neither masked nor kept (-25000), row 5 keeps its keys
    b, h, s, d = 1, 2, 19, 16
    mask = np.where(np.arange(s)[None, :] <= np.arange(s)[:, None], 0.0, NEG).astype(np.float32)
    mask[0] = NEG
    mask[3, 4] = -25000.0
    mask[5] = 0.0
    x = dict(qkv(b, h, s, s, d), mask=mask[None, None])
    dump = tmp_path / "dump"
    art = deploy.compile(attention_model(b, h, s, s, d, mask=(b, 1, s, s)), target="host",
                         dump_dir=str(dump))
    ours, ref = art.load().run(x), run_ort(attention_model(b, h, s, s, d, mask=(b, 1, s, s)), x)
    np.testing.assert_allclose(ours[0], ref[0], rtol=1e-4, atol=1e-5)
    assert templated(art) == 1
    assert "if (!masked_) break;" in (dump / "kernels.c").read_text()
