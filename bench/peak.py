"""The machine's fp32 FMA peak: the floor against which CPU kernels are judged.

    python -m deploy.bench.peak [--threads 2] [--seconds 1.0] [--vector-bits 512]

Compiles a register-only loop (independent FMA chains on vectors, nothing loaded or stored in
the loop; enough chains to cover the FMA latency on every current x86 core) with the system C
compiler and OpenMP, runs it on ``--threads`` threads for about ``--seconds``, and prints the
median GFLOP/s of 5 runs. A GFLOP/s figure of a model divided by this is its share of the peak.
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
  #pragma omp parallel num_threads(threads) reduction(+:total)
  {
    vec acc[CHAINS], a, b;
    for (int k = 0; k < CHAINS; k++) acc[k] = (vec){} + (float)(k + omp_get_thread_num());
    a = (vec){} + 0.999999f; b = (vec){} + 1e-7f;
    for (long i = 0; i < iters; i++) {
      #pragma GCC unroll 16
      for (int k = 0; k < CHAINS; k++) acc[k] = acc[k] * a + b;
      __asm__ volatile("" : "+x"(a));
    }
    float s = 0;
    for (int k = 0; k < CHAINS; k++) for (int l = 0; l < VBYTES / 4; l++) s += acc[k][l];
    total += s;
  }
  return total;
}
"""


def build(vector_bits: int, out_dir: Path) -> ctypes.CDLL:
    src, lib = out_dir / "peak.c", out_dir / "peak.so"
    src.write_text(SOURCE.replace("VBYTES", str(vector_bits // 8))
                   .replace("CHAINS", str(CHAINS)))
    subprocess.run(["cc", "-O3", "-march=native", "-ffp-contract=fast", "-fopenmp", "-shared",
                    "-fPIC", str(src), "-o", str(lib)], check=True)
    fn = ctypes.CDLL(str(lib)).fma_loop
    fn.argtypes, fn.restype = [ctypes.c_long, ctypes.c_int], ctypes.c_double
    return fn


def measure(threads: int = 2, seconds: float = 1.0, vector_bits: int = 512) -> float:
    """Median GFLOP/s of 5 timed runs of about ``seconds`` each."""
    with tempfile.TemporaryDirectory() as d:
        fn = build(vector_bits, Path(d))
        flops_per_iter = 2 * CHAINS * (vector_bits // 32) * threads
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
    a = p.parse_args(argv)
    rate = measure(a.threads, a.seconds, a.vector_bits)
    print(f"fp32 FMA peak: {rate:.1f} GFLOP/s on {a.threads} thread(s), {a.vector_bits}-bit vectors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
