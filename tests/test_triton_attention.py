"""The fused flash-style attention template of the Triton backend (backends/triton/attention.py),
without a GPU: attention graphs and the tiny BERT / GPT-2 exports compiled for ``h100``, their
plan run under TRITON_INTERPRET=1 and compared with ONNX Runtime; patterns that differ fall back
to the generic templates; deviceless AOT compiles of the template for sm_90 and gfx942."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("triton")
pytest.importorskip("torch")  # the interpreter reads host memory through torch CPU tensors

import deploy
from deploy.backends.triton.interpret import InterpretDevice
from deploy.runtime.gpu import GpuModule

from tests.attention_graphs import NEG, attention_model, qkv
from tests.util import helper, make_model, run_ort  # noqa: F401


def interpreted(model, inputs, tmp_path, rtol=1e-4, atol=1e-5):
    art = deploy.compile(model, target="h100", aot=False)
    mod = GpuModule(art.save(tmp_path / "m.dpk"), device=InterpretDevice())
    ours, ref = mod.run(inputs), run_ort(model, inputs)
    for k, (a, b) in enumerate(zip(ours, ref)):
        assert a.shape == b.shape and a.dtype == b.dtype, f"output {k}"
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=f"output {k}")
    return art


def flash(art) -> list[dict]:
    return [s for k in art.manifest["kernels"] for s in k["schedule"]
            if s["template"] == "attention"]


def test_plain_attention(tmp_path):
    art = interpreted(attention_model(2, 3, 16, 16, 16), qkv(2, 3, 16, 16, 16), tmp_path)
    (s,) = flash(art)
    assert not s["causal"] and art.manifest["gpu"]["scratch_bytes"] == 0  # no score matrix
    assert len(art.manifest["gpu"]["kernels"]["k0"]["launches"]) == 1


def test_padding_mask_broadcast_over_heads_and_queries(tmp_path):
    b, h, s, d = 2, 2, 24, 16
    mask = np.zeros((b, 1, 1, s), np.float32)
    mask[0, ..., 15:] = NEG  # row 0 padded after 15 keys
    mask[1, ..., 20:] = -10000.0
    x = dict(qkv(b, h, s, s, d), mask=mask)
    art = interpreted(attention_model(b, h, s, s, d, mask=(b, 1, 1, s)), x, tmp_path)
    assert len(flash(art)) == 1


def test_causal_bias_skips_masked_blocks(tmp_path):
    s, d = 80, 16  # five query blocks: each stops at its diagonal
    bias = np.triu(np.full((s, s), NEG, np.float32), 1)[None, None]
    art = interpreted(attention_model(1, 2, s, s, d, bias=bias), qkv(1, 2, s, s, d), tmp_path)
    (f,) = flash(art)
    assert f["causal"] and f["BM"] == 16  # 2 heads: small query blocks fill the GPU
    assert "tl.minimum((pm + 1) * BM + 0, 80)" in art.members["gpu/kernels.py"].decode()


def test_causal_where_with_offset(tmp_path):
    sq, sk, d = 20, 27, 16  # keys = queries + 7 cached ones: masked iff j > i + 7
    keep = (np.arange(sk)[None, :] <= np.arange(sq)[:, None] + 7)[None, None]
    art = interpreted(attention_model(1, 2, sq, sk, d, where=keep), qkv(1, 2, sq, sk, d),
                      tmp_path)
    (f,) = flash(art)
    assert f["causal"]
    assert "+ 7, 27)" in art.members["gpu/kernels.py"].decode()


def test_non_causal_constant_bias_is_not_skipped(tmp_path):
    s, d = 20, 16
    bias = np.triu(np.full((s, s), NEG, np.float32), 1)[None, None].copy()
    bias[0, 0, 3, 12] = 0.0  # one key past the diagonal is kept: no frontier to stop at
    art = interpreted(attention_model(1, 2, s, s, d, bias=bias), qkv(1, 2, s, s, d), tmp_path)
    (f,) = flash(art)
    assert not f["causal"]


@pytest.mark.parametrize("d", [48, 80])
def test_odd_sequence_and_head_dim_bshd_layout(tmp_path, d):
    b, h, s = 2, 2, 37
    art = interpreted(attention_model(b, h, s, s, d, bshd=True), qkv(b, h, s, s, d, bshd=True),
                      tmp_path)
    (f,) = flash(art)
    assert (f["sq"], f["d"], f["BD"]) == (37, d, 64 if d == 48 else 128)


def test_cross_attention_different_lengths_and_value_dim(tmp_path):
    b, h, sq, sk, d, dv = 1, 2, 9, 33, 16, 24
    art = interpreted(attention_model(b, h, sq, sk, d, dv=dv), qkv(b, h, sq, sk, d, dv),
                      tmp_path)
    (f,) = flash(art)
    assert (f["sq"], f["sk"], f["dv"], f["BDV"]) == (sq, sk, dv, 32)


def test_fp16_attention_dots_in_half(tmp_path):
    b, h, s, d = 1, 2, 32, 16
    art = interpreted(attention_model(b, h, s, s, d, dtype=np.float16),
                      qkv(b, h, s, s, d, dtype=np.float16), tmp_path, rtol=1e-2, atol=2e-3)
    (f,) = flash(art)
    assert f["half"]
    assert "p.to(tl.float16)" in art.members["gpu/kernels.py"].decode()


@pytest.mark.parametrize("variant", ["probs_out", "softmax_over_queries"])
def test_other_patterns_fall_back_to_generic_templates(tmp_path, variant):
    b, h, s, d = 1, 2, 16, 16
    kw = {"probs_out": True} if variant == "probs_out" else {"axis": 2}
    art = interpreted(attention_model(b, h, s, s, d, **kw), qkv(b, h, s, s, d), tmp_path)
    assert not flash(art)


# ---- the exported models ---------------------------------------------------------------------

def _export(name, batch):
    pytest.importorskip("transformers")
    pytest.importorskip("onnxscript")
    from deploy.bench import models
    path = models.model_path(name, batch=batch, tiny=True)
    return path, models.random_inputs(models.input_specs(path), np.random.default_rng(3))


@pytest.mark.parametrize("name,dtype,causal", [("bert_base", None, False),
                                               ("gpt2_small", None, True),
                                               ("gpt2_small", "fp16", True)])
def test_tiny_transformers_use_the_flash_template(tmp_path, name, dtype, causal):
    path, inputs = _export(name, 1)
    art = deploy.compile(str(path), target="h100", aot=False, **({"dtype": dtype} if dtype else {}))
    fs = flash(art)
    assert len(fs) == 2  # one per layer
    assert all(f["causal"] is causal and f["half"] is (dtype is not None) for f in fs)
    mod = GpuModule(art.save(tmp_path / "m.dpk"), device=InterpretDevice())
    ours, ref = mod.run(inputs)[0], run_ort(str(path), inputs)[0]
    if dtype is None:
        np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-4)
    else:
        assert np.linalg.norm(ours - ref) / np.linalg.norm(ref) < 1e-2


# ---- deviceless ahead-of-time compiles --------------------------------------------------------

@pytest.mark.parametrize("target,kind", [("h100", "cubin"), ("mi300x", "hsaco")])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_aot_compiles_the_template(target, kind, dtype):
    s, d = 40, 48
    bias = np.triu(np.full((s, s), NEG, np.float32), 1)[None, None]
    art = deploy.compile(attention_model(1, 2, s, s, d, bias=bias, dtype=dtype), target=target)
    (launch,) = art.manifest["gpu"]["kernels"]["k0"]["launches"]
    assert launch["template"] == "attention" and kind in launch["binaries"]
    assert len(art.members[launch["binaries"][kind]]) > 0


# ---- on the GPU (marked ``gpu``: python -m pytest -q -m gpu tests/test_triton_attention.py) ----

def _on_device(model, inputs, tmp_path, rtol, atol, **options):
    art = deploy.compile(model, target="h100", **options)
    mod = deploy.load(art.save(tmp_path / "m.dpk"))
    ours, ref = mod.run(inputs), run_ort(model, inputs)
    for a, b in zip(ours, ref):
        np.testing.assert_allclose(a.astype(np.float32), b.astype(np.float32), rtol=rtol,
                                   atol=atol)
    return flash(art)


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["bert", "causal", "odd_d80", "fp16_causal", "tf32"])
def test_flash_attention_on_the_gpu(tmp_path, case):
    b, h, s, d, dtype, options = 2, 12, 128, 64, np.float32, {}
    kw, tol = {}, (1e-4, 1e-5)
    if case == "bert":
        mask = np.zeros((b, 1, 1, s), np.float32)
        mask[0, ..., 77:] = NEG
        kw["mask"] = (b, 1, 1, s)
    if case in ("causal", "fp16_causal"):
        s = 200  # not a multiple of any block
        kw["bias"] = np.triu(np.full((s, s), NEG, np.float32), 1)[None, None]
    if case == "odd_d80":
        s, d, kw["bshd"] = 77, 80, True
    if case == "fp16_causal":
        dtype, tol = np.float16, (1e-2, 2e-3)
    if case == "tf32":
        options, tol = {"precision": "tf32"}, (2e-2, 2e-3)
    x = qkv(b, h, s, s, d, bshd=kw.get("bshd", False), dtype=dtype)
    if case == "bert":
        x["mask"] = mask
    (f,) = _on_device(attention_model(b, h, s, s, d, dtype=dtype, **kw), x, tmp_path, *tol,
                      **options)
    assert f["causal"] is ("causal" in case)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["bert_base", "gpt2_small"])
def test_tiny_transformers_on_the_gpu(tmp_path, name):
    path, inputs = _export(name, 1)
    assert len(_on_device(str(path), inputs, tmp_path, 1e-4, 1e-4)) == 2
