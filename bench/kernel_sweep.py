"""Launch configurations of single GPU kernels, side by side (JIT, on the GPU): how the Triton
backend's defaults were chosen.

    python -m deploy.bench.kernel_sweep attention ARTIFACT    # the first attention kernel
    python -m deploy.bench.kernel_sweep rows ARTIFACT         # the first LayerNorm-style kernel
    python -m deploy.bench.kernel_sweep gemm [--m 4096]       # BERT-base's GEMM shapes

``attention`` and ``rows`` take the artifact's generated source (``gpu/kernels.py``) and time its
first kernel of that template on random operands under each variant: query x key blocks, warps
and pipeline stages for attention (the query-block count is rewritten into the program's
index arithmetic), rows per program and warps for rows. ``gemm`` times, for each of BERT-base's
four GEMM shapes with their epilogues, cuBLAS (``torch.addmm``) against a persistent
Triton GEMM loading through TMA descriptors (with and without warp specialization) and one
loading through pointers, over tile configurations. Every time is one launch's share of a CUDA graph of 50 launches (median of 7
replays): no launch overhead, operands resident in L2 as inside a model's graph. Needs torch
and triton with an NVIDIA GPU (TMA: Hopper).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import tempfile
import zipfile


def graph_us(fn, n: int = 50) -> float:
    """Median time of one ``fn()`` inside a captured graph of ``n`` calls, in microseconds."""
    import torch
    fn()
    torch.cuda.synchronize()
    with torch.cuda.stream(torch.cuda.Stream()):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(n):
            fn()
    times = []
    for _ in range(7):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / n * 1000)
    return sorted(times)[3]


# ---- one kernel of an artifact ------------------------------------------------------------------

def _module(source: str):
    path = os.path.join(tempfile.mkdtemp(), "kernels.py")  # @triton.jit needs a source file
    with open(path, "w") as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location("kernels", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _operands(manifest: dict, symbol: str, launch: dict) -> list:
    import torch
    step = next(s for s in manifest["steps"] if s.get("symbol") == symbol)
    out = []
    for ref in launch["args"]:
        vid = step["inputs"][ref["in"]] if "in" in ref else step["outputs"][ref["out"]]
        value = manifest["values"][str(vid)]
        dtype = getattr(torch, value["dtype"])
        if dtype.is_floating_point:
            out.append(torch.randn(value["shape"], device="cuda").to(dtype))
        else:
            out.append(torch.randint(0, 2, value["shape"], device="cuda").to(dtype))
    return out


def sweep_kernel(path: str, template: str, variants) -> None:
    """``variants(schedule) -> [(constexpr overrides, warps, stages, grid, source rewrite)]``."""
    with zipfile.ZipFile(path) as z:
        manifest = json.loads(z.read("manifest.json"))
        source = z.read("gpu/kernels.py").decode()
    kernel = next(k for k in manifest["kernels"] if k["schedule"][0]["template"] == template)
    sched, symbol = kernel["schedule"][0], kernel["symbol"]
    launch = manifest["gpu"]["kernels"][symbol]["launches"][0]
    args = _operands(manifest, symbol, launch)
    print(f"{symbol} ({kernel['note'][:70]}): default {launch['constexprs']} "
          f"w{launch['num_warps']} s{sched.get('num_stages', 1)} grid {launch['grid']}")
    rows = []
    for consts, warps, stages, grid, rewrite in variants(sched):
        fn = getattr(_module(rewrite(source) if rewrite else source), launch["fn"])
        params = dict(launch["constexprs"], **consts)

        def call(fn=fn, params=params, warps=warps, stages=stages, grid=grid):
            fn[tuple(grid)](*args, **params, num_warps=warps, num_stages=stages)
        try:
            rows.append((graph_us(call), params, warps, stages, grid))
        except Exception as e:  # noqa: BLE001  (a configuration that does not compile or fit)
            print(f"  {params} w{warps} s{stages}: {type(e).__name__}: {str(e)[:100]}")
    for us, params, warps, stages, grid in sorted(rows, key=lambda r: r[0]):
        print(f"  {us:8.2f} us  {params} w{warps} s{stages} grid {grid[0]}")


def attention_variants(sched: dict):
    old = -(-sched["sq"] // sched["BM"])
    rows = sched["grid"][0] // old
    for bm in (128, 64, 32):
        blocks = -(-sched["sq"] // bm)

        def rewrite(src, blocks=blocks, fn=sched["fn"]):
            at = src.index(f"def {fn}(")
            end = src.find("@triton.jit", at)
            end = len(src) if end < 0 else end
            body = src[at:end].replace(f"pm = {old - 1} - pid % {old}",
                                       f"pm = {blocks - 1} - pid % {blocks}")
            body = body.replace(f"po = pid // {old}", f"po = pid // {blocks}")
            return src[:at] + body + src[end:]
        for bn in (16, 32, 64):
            for warps in (4, 8):
                for stages in (1, 2, 3):
                    yield {"BM": bm, "BN": bn}, warps, stages, [rows * blocks, 1, 1], rewrite


def rows_variants(sched: dict):
    n = sched["grid"][0] * sched["XBLOCK"]
    for xb in (1, 2, 4, 8, 16):
        for warps in (1, 2, 4, 8):
            yield {"XBLOCK": xb}, warps, 1, [-(-n // xb), 1, 1], None


# ---- GEMMs: TMA descriptors against pointers and cuBLAS ---------------------------------------

BERT_GEMMS = [("QKV + bias", 2304, 768, 0), ("output + bias + residual", 768, 768, 2),
              ("FFN1 + bias + GELU", 3072, 768, 1), ("FFN2 + bias + residual", 768, 3072, 2)]
TILES = [(128, 128, 64, 4, 4), (128, 128, 64, 4, 3), (128, 256, 64, 8, 3), (128, 128, 64, 8, 4),
         (64, 128, 64, 4, 4), (128, 128, 128, 8, 3), (128, 256, 64, 8, 4), (256, 128, 64, 8, 3)]


def sweep_gemms(m: int) -> None:
    import torch
    import triton
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8,
                                                                  device="cuda"))
    for name, n, k, epi in BERT_GEMMS:
        _sweep_gemm(name, m, n, k, epi)


def _sweep_gemm(name: str, m: int, n: int, k: int, epi: int) -> None:
    import torch

    from .tma_gemm import gemm_ptr, gemm_tma
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    b = torch.randn(k, n, device="cuda", dtype=torch.float16) / k ** 0.5
    bias = torch.randn(n, device="cuda", dtype=torch.float16)
    res = torch.randn(m, n, device="cuda", dtype=torch.float16)
    c = torch.empty(m, n, device="cuda", dtype=torch.float16)
    flop = 2 * m * n * k
    us = graph_us(lambda: torch.addmm(bias, a, b))
    print(f"{name} ({m} x {n} x {k}): cuBLAS addmm (no epilogue beyond bias) {us:.1f} us, "
          f"{flop / us / 1e6:.0f} TFLOP/s")
    rows = []
    for bm, bn, bk, warps, stages in TILES:
        tiles = -(-m // bm) * -(-n // bn)
        for kind, fn, grid, ws in (("tma", gemm_tma, min(tiles, sms), {}),
                                   ("tma-ws", gemm_tma, min(tiles, sms), {"WS": True}),
                                   ("ptr", gemm_ptr, tiles, {})):
            def call(fn=fn, grid=grid, bm=bm, bn=bn, bk=bk, warps=warps, stages=stages, ws=ws):
                fn[(grid,)](a, b, bias, res, c, m, n, k, bm, bn, bk, grid, epi, **ws,
                            num_warps=warps, num_stages=stages)
            try:
                rows.append((graph_us(call), kind, bm, bn, bk, warps, stages, grid))
            except Exception as e:  # noqa: BLE001  (out of shared memory, say)
                print(f"  {kind} {bm}x{bn}x{bk} w{warps} s{stages}: {type(e).__name__}")
    for us, kind, bm, bn, bk, warps, stages, grid in sorted(rows)[:10]:
        print(f"  {us:7.1f} us {flop / us / 1e6:4.0f} TFLOP/s  {kind} {bm}x{bn}x{bk} "
              f"w{warps} s{stages} grid {grid}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m deploy.bench.kernel_sweep",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=["attention", "rows", "gemm"])
    ap.add_argument("artifact", nargs="?", help="a GPU artifact (attention, rows)")
    ap.add_argument("--m", type=int, default=4096, help="GEMM rows (batch x sequence)")
    args = ap.parse_args(argv)
    if args.what == "gemm":
        sweep_gemms(args.m)
        return
    if not args.artifact:
        ap.error(f"{args.what} needs an artifact")
    sweep_kernel(args.artifact, args.what,
                 attention_variants if args.what == "attention" else rows_variants)


if __name__ == "__main__":
    main()
