"""The CUDA C code generator (backends/cuda): kernels of real lowered graphs rendered with each
template and compiled by NVRTC to cubin and PTX for sm_80 and sm_90 on this machine (no GPU);
on a GPU (marked ``gpu``) the artifacts run through the driver API and match the references.

    python -m pytest -q tests/test_cuda_render.py              # CPU: render + NVRTC
    python -m pytest -q -m gpu tests/test_cuda_render.py       # also run them on the GPU

The GPU tests compile here too (NVRTC needs no GPU); ``DEPLOY_CUDA_PREBUILT=DIR`` runs the
artifacts of ``python -m tests.cuda_harness build DIR`` instead (a GPU machine without NVRTC).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("cuda.bindings", reason="CUDA C codegen needs cuda-bindings + NVRTC")

import deploy
from deploy.backends.cuda.codegen import CudaCodegen
from deploy.backends.cuda.render import CudaRenderer
from deploy.backends.cuda.toolchain import PTX_ISA, compile_cuda, nvrtc_version
from deploy.backends.triton.fuse import fuse_stages
from deploy.backends.triton.sizes import SizeParams
from deploy.backends.triton.toolchain import ptx_param_count
from deploy.compiler import lower_only
from deploy.errors import NotImplementedYetError
from deploy.targets import load_target

from tests import cuda_harness as H

try:
    nvrtc_version()
except NotImplementedYetError as e:  # cuda-bindings without its NVRTC library
    pytest.skip(str(e), allow_module_level=True)

CASES = {c.name: c for c in H.check_cases() if not c.name.startswith("zoo_")}

# case -> the templates its kernels must use (at least these)
TEMPLATES = {
    "ew_chain": {"pointwise"}, "softmax_rows": {"rows"},
    "softmax_long": {"reduction"}, "layernorm": {"rows"}, "matmul_f32": {"gemm"},
    "matmul_f16_tiles": {"gemm"}, "conv_f16": {"gemm"}, "scatter_add": {"serial"},
    "cumsum": {"serial"}, "reduce_axes": {"reduction", "pointwise"},
    "symbolic_batch": {"reduction"}, "attention_float16": {"gemm", "reduction"},
}


def templates(art) -> set[str]:
    return {s["template"] for k in art.manifest["kernels"] for s in k["schedule"]}


def source(art) -> str:
    return art.members["gpu/kernels.cu"].decode()


@pytest.mark.parametrize("target", ["h100", "a100"])
@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_templates_compile_to_cubin_and_ptx(name, target):
    case = CASES[name]
    art = deploy.compile(case.model, target=target, gpu_codegen="cuda", **case.options)
    assert templates(art) >= TEMPLATES[name]
    arch = load_target(target).arch
    bins = art.manifest["binaries"]
    assert {b["kind"] for b in bins} == {"cubin", "ptx"} and {b["arch"] for b in bins} == {arch}
    for launch in (x for k in art.manifest["gpu"]["kernels"].values() for x in k["launches"]):
        ptx = art.members[launch["binaries"]["ptx"]].decode()
        assert launch["params"] == len(launch["args"]) == ptx_param_count(ptx, launch["fn"])
        assert launch["block"][0] == 32 * launch["num_warps"]
        version = tuple(map(int, re.search(r"^\.version (\d+)\.(\d+)", ptx, re.MULTILINE).groups()))
        assert version <= PTX_ISA[arch]  # older drivers JIT it (toolchain.portable_ptx)
        assert art.members[launch["binaries"]["cubin"]][:4] == b"\x7fELF"


def test_fp16_gemm_takes_the_pipelined_tensor_core_template():
    src = source(deploy.compile(CASES["matmul_f16_tiles"].model, target="h100",
                                gpu_codegen="cuda"))
    assert "dp_cp_async16" in src and "dp_ldsm_x2_t" in src and "dp_mma_f16" in src
    conv = source(deploy.compile(CASES["conv_f16"].model, target="h100", gpu_codegen="cuda"))
    assert "dp_mma_f16" in conv and "dp_cp_async16(" not in conv.split("extern")[-1]


def test_fp32_gemm_uses_fma_tiles_and_bf16_uses_bf16_mma():
    f32 = source(deploy.compile(CASES["matmul_f32"].model, target="h100", gpu_codegen="cuda"))
    assert "fmaf(" in f32 and "dp_mma" not in f32.split("extern")[-1]
    bf = source(deploy.compile(CASES["matmul_bf16"].model, target="h100", gpu_codegen="cuda"))
    assert "dp_mma_bf16(acc_" in bf


def test_symbolic_sizes_are_int64_parameters():
    art = deploy.compile(CASES["symbolic_batch"].model, target="h100", gpu_codegen="cuda")
    gpu = art.manifest["gpu"]
    assert gpu["sizes"], "the batch symbol is a size parameter"
    launches = [x for k in gpu["kernels"].values() for x in k["launches"]]
    sized = [x for x in launches if any("size" in a for a in x["args"])]
    assert sized and all(x["types"][-1] == "i64" for x in sized)
    assert any(isinstance(g, dict) for x in sized for g in x["grid"])  # grid over the sizes
    assert re.search(r"int64_t sz_\w+_arg", source(art))


def test_row_reductions_combine_with_warp_shuffles_and_block_shared_memory():
    rows = source(deploy.compile(CASES["reduce_axes"].model, target="h100", gpu_codegen="cuda"))
    long = source(deploy.compile(CASES["softmax_long"].model, target="h100", gpu_codegen="cuda"))
    assert "dp_shfl_xor(" in rows and "red_smem_" not in rows.split("extern")[-1]
    assert "red_smem_" in long and "__syncthreads()" in long
    # every lane shuffles (a combine that reads its operand twice must not hold the shuffle)
    assert not re.search(r"DP_MAX\([^;]*dp_shfl_xor", rows + long)


def test_attention_renders_as_plain_stages():
    plan = lower_only(CASES["attention_float32"].model, "h100")
    k = plan.kernels[0]
    fused = fuse_stages(k)  # Triton's preparation fuses attention: CUDA C has no template
    renderer = CudaRenderer(load_target("h100"))
    assert "attention" in (renderer.supports(fused) or "")
    codegen = CudaCodegen(load_target("h100"), SizeParams())
    plain = codegen.prepare(k, None)
    assert codegen.supports(plain) is None and codegen.render(plain, None)


def test_functions_compile_alone_and_name_their_entry():
    tgt = load_target("h100")
    plan = lower_only(CASES["layernorm"].model, "h100")
    codegen = CudaCodegen(tgt, SizeParams())
    fns = codegen.render(codegen.prepare(plan.kernels[0], None), None)
    assert len({f.name for f in fns}) == len(fns) and all(f.codegen == "cuda" for f in fns)
    assert all(f.source.count(f.name) == 1 for f in fns)  # the build dedups by renaming
    out = compile_cuda(fns, codegen.module(fns), tgt)
    for f in fns:
        ptx = out[f.name].images["ptx"].decode()
        assert re.findall(r"\.entry\s+(\w+)", ptx) == [f.name]
        assert out[f.name].params == len(f.args) + len(f.sizes)


def test_ptxas_accepts_the_restamped_ptx(tmp_path):
    ptxas = shutil.which("ptxas") or next(
        (str(p) for p in Path("/usr/local").glob("cuda*/bin/ptxas")), None)
    if ptxas is None:
        pytest.skip("no ptxas on this machine")
    art = deploy.compile(CASES["matmul_f16_tiles"].model, target="a100", gpu_codegen="cuda")
    for name, data in art.members.items():
        if name.endswith(".ptx"):
            (tmp_path / "k.ptx").write_bytes(data)
            subprocess.run([ptxas, "-arch=sm_80", str(tmp_path / "k.ptx"), "-o",
                            str(tmp_path / "k.cubin")], check=True, capture_output=True)


def test_missing_nvrtc_says_what_to_install(monkeypatch):
    import builtins
    real = builtins.__import__

    def no_cuda(name, *args, **kwargs):
        if name.startswith("cuda"):
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_cuda)
    with pytest.raises(NotImplementedYetError, match="pip install cuda-bindings nvidia-cuda-nvrtc"):
        nvrtc_version()


# ---- on the GPU --------------------------------------------------------------------------------

PREBUILT = os.environ.get("DEPLOY_CUDA_PREBUILT")


@pytest.mark.gpu
@pytest.mark.parametrize("name", [c.name for c in H.check_cases()])
def test_runs_on_gpu_and_matches_reference(name, tmp_path):
    """fp32: relative L2 error <= 1e-5 against ONNX Runtime; fp16/bf16 outputs <= 2e-3 against
    numpy in fp32 from the same inputs (fp16 compiles of fp32 models: 1e-2)."""
    if PREBUILT:
        path, data = Path(PREBUILT) / f"{name}.dpk", np.load(Path(PREBUILT) / f"{name}.npz")
        feed = {k[3:]: data[k] for k in data.files if k.startswith("in_")}
        refs = [data[f"ref_{k}"] for k in range(sum(k.startswith("ref_") for k in data.files))]
        tol = json.loads((Path(PREBUILT) / "index.json").read_text())["check"][name]["tol"]
    else:
        case = {c.name: c for c in H.check_cases()}[name]
        art = deploy.compile(case.model, **{"target": "h100", **case.options}, gpu_codegen="cuda")
        path = art.save(tmp_path / "m.dpk")
        feed, tol = case.feed, case.tol
        refs = case.ref if case.ref is not None else H._ort(case.model, feed)
    outs = deploy.load(path).run(feed)
    assert len(outs) == len(refs)
    for k, (o, r) in enumerate(zip(outs, refs)):
        assert H.rel_l2(o, r) <= tol, f"output {k}: rel L2 {H.rel_l2(o, r):.2e} > {tol}"
