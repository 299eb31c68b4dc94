"""The machine's fp32 FMA peak (or bf16 or int8 dot-product peak): the floor CPU kernels are
judged by.

    python -m deploy.bench.peak [--threads 2] [--seconds 1.0] [--vector-bits 512] [--bf16 | --int8]

Compiles a register-only loop (independent FMA chains on vectors, nothing loaded or stored in
the loop; enough chains to cover the FMA latency on every current x86 core) with the system C
compiler and OpenMP, runs it on ``--threads`` threads for about ``--seconds``, and prints the
median GFLOP/s of 5 runs. A GFLOP/s figure of a model divided by this is its share of the peak.
``--bf16``: the same loop on AVX512-BF16's ``vdpbf16ps`` (a bf16 pair product per float32
lane: 64 FLOP per 512-bit instruction), the ceiling of ``--dtype bf16`` on CPUs without AMX.
``--int8``: AVX512-VNNI's ``vpdpbusd`` (four uint8 x int8 products summed into each int32 lane:
128 integer operations per 512-bit instruction), the ceiling of int8 QDQ models there.
The threads are bound to places (``proc_bind(spread)``): two unbound threads were seen sharing
one core of a 2-core machine, halving the figure.
"""
from __future__ import annotations

import argparse
import ctypes
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHAINS = 12  # independent accumulators per thread (latency 4 x 2 pipes = 8 needed on Zen 4)

SOURCE = r"""
#include <immintrin.h>
#include <omp.h>
typedef float vec __attribute__((vector_size(VBYTES)));
double fma_loop(long iters, int threads) {
  double total = 0;
  #pragma omp parallel num_threads(threads) proc_bind(spread) reduction(+:total)
  {
    vec acc[CHAINS], a, b;
    for (int k = 0; k < CHAINS; k++) acc[k] = (vec){} + (float)(k + omp_get_thread_num());
    a = (vec){} + 0.999999f; b = (vec){} + 1e-7f;
    for (long i = 0; i < iters; i++) {
      #pragma GCC unroll 16
      for (int k = 0; k < CHAINS; k++) acc[k] = STEP;
      __asm__ volatile("" : "+x"(a));
    }
    float s = 0;
    for (int k = 0; k < CHAINS; k++) for (int l = 0; l < VBYTES / 4; l++) s += acc[k][l];
    total += s;
  }
  return total;
}
"""


FMA = "acc[k] * a + b"
# bf16 pairs (the bits of a and b read as 32 bf16 each) into float32 lanes
DPBF16 = "(vec)_mm512_dpbf16_ps((__m512)acc[k], (__m512bh)a, (__m512bh)b)"
# four byte products per int32 lane (the bits of a as uint8, of b as int8)
DPBUSD = "(vec)_mm512_dpbusd_epi32((__m512i)acc[k], (__m512i)a, (__m512i)b)"


def build(vector_bits: int, out_dir: Path, bf16: bool = False, int8: bool = False) -> ctypes.CDLL:
    src, lib = out_dir / "peak.c", out_dir / "peak.so"
    step = DPBF16 if bf16 else DPBUSD if int8 else FMA
    src.write_text(SOURCE.replace("VBYTES", str(vector_bits // 8))
                   .replace("CHAINS", str(CHAINS)).replace("STEP", step))
    subprocess.run(["cc", "-O3", "-march=native", "-ffp-contract=fast", "-fopenmp", "-shared",
                    "-fPIC", str(src), "-o", str(lib)], check=True)
    fn = ctypes.CDLL(str(lib)).fma_loop
    fn.argtypes, fn.restype = [ctypes.c_long, ctypes.c_int], ctypes.c_double
    return fn


def measure(threads: int = 2, seconds: float = 1.0, vector_bits: int = 512,
            bf16: bool = False, int8: bool = False) -> float:
    """Median GFLOP/s (GOP/s with ``int8``) of 5 timed runs of about ``seconds`` each."""
    dot = bf16 or int8
    with tempfile.TemporaryDirectory() as d:
        fn = build(512 if dot else vector_bits, Path(d), bf16, int8)
        products = 512 // 16 if bf16 else 512 // 8 if int8 else vector_bits // 32
        flops_per_iter = 2 * CHAINS * products * threads
        iters = 1 << 16
        while True:  # calibrate to about `seconds`
            t0 = time.perf_counter()
            fn(iters, threads)
            dt = time.perf_counter() - t0
            if dt > seconds / 4:
                break
            iters *= 4
        iters = int(iters * seconds / dt)
        rates = []
        for _ in range(5):
            t0 = time.perf_counter()
            fn(iters, threads)
            rates.append(flops_per_iter * iters / (time.perf_counter() - t0) / 1e9)
        return statistics.median(rates)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m deploy.bench.peak", description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seconds", type=float, default=1.0)
    p.add_argument("--vector-bits", type=int, default=512, choices=(128, 256, 512))
    kind = p.add_mutually_exclusive_group()
    kind.add_argument("--bf16", action="store_true", help="vdpbf16ps (AVX512-BF16) instead of FMA")
    kind.add_argument("--int8", action="store_true", help="vpdpbusd (AVX512-VNNI) instead of FMA")
    a = p.parse_args(argv)
    rate = measure(a.threads, a.seconds, a.vector_bits, a.bf16, a.int8)
    what = ("bf16 dot-product (vdpbf16ps)" if a.bf16 else
            "int8 dot-product (vpdpbusd)" if a.int8 else "fp32 FMA")
    unit = "GOP/s" if a.int8 else "GFLOP/s"
    bits = 512 if a.bf16 or a.int8 else a.vector_bits
    print(f"{what} peak: {rate:.1f} {unit} on {a.threads} thread(s), {bits}-bit vectors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
