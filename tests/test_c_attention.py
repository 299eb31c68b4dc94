"""The fused attention template of the C backend (backends/c/attention.py): attention graphs
compiled for the host and compared with ONNX Runtime on fresh random inputs, across the shapes
that exercise its edges (query rows not a multiple of the row block, keys and head dims not a
multiple of the vector width, a value head dim wider than the query's, padding masks, causal
masks with an offset, the BSHD layout folded into the loads and stores)."""
from __future__ import annotations

import deploy
import numpy as np
import pytest
from deploy.targets import load_target

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


def _bf16(a):
    import ml_dtypes
    return np.asarray(a, np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


@pytest.mark.parametrize("b,h,sq,sk,d,dv,causal", [(1, 2, 37, 23, 15, 24, False),
                                                   (1, 1, 5, 130, 80, 24, False),
                                                   (2, 2, 20, 27, 16, 16, True)])
def test_bf16_attention_on_dot_products(b, h, sq, sk, d, dv, causal, tmp_path):
    """``--dtype bf16``: where compiled for AVX512-BF16 both products run on vdpbf16ps (k, v
    and q as bf16 pairs, an odd head dim's last pair and keys past the end zero, p rounded to
    bf16); its error against ONNX Runtime on bf16-rounded inputs stays within that of the
    float32-FMA build (a target without the feature) and under 1e-2."""
    keep = (np.arange(sk)[None, :] <= np.arange(sq)[:, None] + 7)[None, None] if causal else None
    model = attention_model(b, h, sq, sk, d, dv, where=keep)
    x = {k: _bf16(v) for k, v in qkv(b, h, sq, sk, d, dv).items()}
    ref = run_ort(model, x)[0]
    errs, outs = {}, {}
    for target in ("host", "x86_64-avx512"):
        dump = tmp_path / target
        art = deploy.compile(model, target=target, dtype="bf16", dump_dir=str(dump))
        assert templated(art) == 1
        assert "_mm512_dpbf16_ps(" in (dump / "kernels.c").read_text()  # (compiled in or not)
        outs[target] = art.load().run(x)[0]
        errs[target] = np.linalg.norm(outs[target] - ref) / np.linalg.norm(ref)
    assert errs["host"] < 1e-2 and errs["host"] <= 1.25 * errs["x86_64-avx512"] + 1e-3, errs
    if "avx512_bf16" in load_target("host").cpu_isa():  # p rounded to bf16: other numbers
        assert not np.array_equal(outs["host"], outs["x86_64-avx512"])
