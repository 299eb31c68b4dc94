"""The gap between dependent kernels, with and without programmatic dependent launch: a chain of
``--count`` Triton kernels (``y = x * 1.0001 + 1`` over fp16, each reading the previous one's
output) captured in one CUDA graph, one launch's share of a replay (median of 15), for plain
launches, launches that wait (``griddepcontrol.wait`` first, ``launch_pdl``), and launches that
also signal their dependents at the top. Checks that the three give the same bytes. Needs torch
and triton on an sm_90 or later GPU.

    python -m deploy.bench.launch_chain [--count 60]
"""
from __future__ import annotations

import argparse

VARIANTS = (("plain", False, False), ("wait", True, False), ("wait + signal", True, True))


def _kernel():
    import triton
    import triton.language as tl
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

    @triton.jit
    def step(x, y, n, BLOCK: tl.constexpr, WAIT: tl.constexpr, SIGNAL: tl.constexpr):
        if WAIT:
            gdc_wait()
        if SIGNAL:
            gdc_launch_dependents()
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = i < n
        tl.store(y + i, tl.load(x + i, mask=m) * 1.0001 + 1.0, mask=m)
    return step


def chain_us(step, n: int, count: int, wait: bool, signal: bool):
    """(us per kernel, the chain's result) of one variant."""
    import torch
    import triton
    torch.manual_seed(0)
    a = torch.randn(n, device="cuda", dtype=torch.float16)
    b, a0 = torch.empty_like(a), a.clone()
    grid = (triton.cdiv(n, 1024),)

    def chain():
        x, y = a, b
        for _ in range(count):
            step[grid](x, y, n, BLOCK=1024, WAIT=wait, SIGNAL=signal, launch_pdl=wait,
                       num_warps=4)
            x, y = y, x
    chain()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        chain()
    a.copy_(a0)
    graph.replay()
    torch.cuda.synchronize()
    result = (a if count % 2 == 0 else b).clone()
    times = []
    for _ in range(15):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000 / count)
    return sorted(times)[7], result


def main(argv=None) -> None:
    import torch
    ap = argparse.ArgumentParser(prog="python -m deploy.bench.launch_chain",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=60)
    args = ap.parse_args(argv)
    step = _kernel()
    print("| elements | MB | " + " | ".join(f"{v[0]} us" for v in VARIANTS) + " | same |")
    print("|---:|---:|" + "---:|" * len(VARIANTS) + "---|")
    for n in (1 << 16, 1 << 20, 1 << 22, 1 << 24):
        res = [chain_us(step, n, args.count, wait, signal) for _, wait, signal in VARIANTS]
        same = all(torch.equal(res[0][1], r[1]) for r in res[1:])
        print(f"| {n} | {2 * n / 1e6:.1f} | " + " | ".join(f"{r[0]:.2f}" for r in res) +
              f" | {same} |")


if __name__ == "__main__":
    main()
