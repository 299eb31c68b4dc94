"""The int8 ``sdot`` path (Armv8.2-A's int8 x int8 dot product, backends/c/qgemm.h path 5) on
real Arm instructions: a C harness around the generated prelude and ``qgemm.h`` runs one 3 x 3
convolution (uint8 activations with a zero point, padding, int8 weights with zero points per
output channel, so the flipped row bytes, the k padding and the row-sum term all count) through
``dp_qgemm`` and checks every output against the exact integers it computes itself. Built twice:
natively (the products in C: the same code that tests/test_int8.py runs through whole models)
and, where a cross compiler and qemu are installed (``gcc-aarch64-linux-gnu``, ``qemu-user``),
for ``-march=armv8.2-a+dotprod`` and run under ``qemu-aarch64``, where ``vdotq_s32`` does the
products. The harness packs the weights as backends/c/qgemm.py does for ``sdot``."""
from __future__ import annotations

import shutil
import subprocess

import pytest
from deploy.backends.c.render import PRELUDE, QGEMM_H

HARNESS = r"""
#include <stdio.h>
#include <stdlib.h>
enum { IMG = 2, IH = 6, IW = 5, C = 20, KH = 3, KW = 3, N = 40, K = KH * KW * C };
enum { KP = (K + 3) / 4 * 4, NP = (N + 15) / 16 * 16, M = IMG * IH * IW };

int main(void) {
  static uint8_t x[IMG * IH * IW * C];
  static int8_t w[K][N], packed[NP / 16][KP / 4][16][4];
  static int32_t corr[NP], zw[NP], bias[N];
  static float mult[NP], off[NP], out[M * N];
  const int32_t x_zp = 100, zx = x_zp - 128;  /* the kernel reads uint8 x as int8 x ^ 0x80 */
  unsigned s = 12345u;
  for (int i = 0; i < IMG * IH * IW * C; i++) x[i] = (uint8_t)((s = s * 1103515245u + 12345u) >> 16);
  for (int k = 0; k < K; k++)
    for (int n = 0; n < N; n++) w[k][n] = (int8_t)((s = s * 1103515245u + 12345u) >> 16);
  for (int n = 0; n < NP; n++) { mult[n] = 1.0f; off[n] = 0.0f; corr[n] = 0; zw[n] = 0; }
  for (int n = 0; n < N; n++) {
    zw[n] = n % 7 - 3;
    bias[n] = n * 37 - 500;
    int64_t colsum = 0;
    for (int k = 0; k < K; k++) colsum += w[k][n];
    corr[n] = (int32_t)(bias[n] - (int64_t)zx * colsum + (int64_t)KP * zx * zw[n]);
  }
  for (int k = 0; k < KP; k++)
    for (int n = 0; n < NP; n++)
      packed[n / 16][k / 4][n % 16][k % 4] = k < K && n < N ? w[k][n] : 0;
  const dp_qgeom g = {.m = M, .n = N, .kp = KP, .np = NP, .oh = IH, .ow = IW, .ih = IH, .iw = IW,
                      .c = C, .kh = KH, .kw = KW, .sh = 1, .sw = 1, .ph = 1, .pw = 1, .dh = 1,
                      .dw = 1, .xs_img = IH * IW * C, .xs_h = IW * C, .xs_w = C, .xs_c = 1,
                      .os_img = IH * IW * N, .os_pix = N, .os_ch = 1, .x_zp = x_zp,
                      .x_signed = 0, .out_kind = 0, .path = 5};
  dp_qgemm(&g, x, packed, corr, mult, off, zw, NULL, out);
  int bad = 0;
  for (int img = 0; img < IMG; img++)
    for (int oy = 0; oy < IH; oy++)
      for (int ox = 0; ox < IW; ox++)
        for (int n = 0; n < N; n++) {
          int64_t acc = bias[n];
          for (int ky = 0; ky < KH; ky++)
            for (int kx = 0; kx < KW; kx++)
              for (int c = 0; c < C; c++) {
                const int iy = oy - 1 + ky, ix = ox - 1 + kx;
                const int32_t a = iy < 0 || iy >= IH || ix < 0 || ix >= IW ? x_zp
                                  : x[((img * IH + iy) * IW + ix) * C + c];
                acc += (int64_t)(a - x_zp) * (w[(ky * KW + kx) * C + c][n] - zw[n]);
              }
          const float got = out[((img * IH + oy) * IW + ox) * N + n];
          if (got != (float)acc && bad++ < 5)
            printf("out[%d,%d,%d,%d] = %.1f, expected %lld\n", img, oy, ox, n, got, (long long)acc);
        }
  printf("%d of %d outputs wrong\n", bad, M * N);
  return bad != 0;
}
"""


def _build_and_run(tmp_path, cc: list[str], run: list[str]) -> str:
    src, exe = tmp_path / "sdot.c", tmp_path / "sdot"
    src.write_text(PRELUDE + "\n" + QGEMM_H + "\n" + HARNESS)
    subprocess.run([*cc, "-O2", "-fopenmp", str(src), "-o", str(exe), "-lm"], check=True,
                   capture_output=True, text=True)
    done = subprocess.run([*run, str(exe)], check=False, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_sdot_products_in_c_are_exact(tmp_path):
    out = _build_and_run(tmp_path, ["cc"], [])
    assert out.startswith("0 of 2400 outputs wrong"), out


@pytest.mark.skipif(not (shutil.which("aarch64-linux-gnu-gcc") and shutil.which("qemu-aarch64")),
                    reason="needs gcc-aarch64-linux-gnu and qemu-user")
def test_sdot_on_armv8_dot_product_instructions_is_exact(tmp_path):
    out = _build_and_run(tmp_path, ["aarch64-linux-gnu-gcc", "-march=armv8.2-a+dotprod"],
                         ["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu"])
    assert out.startswith("0 of 2400 outputs wrong"), out
    asm = subprocess.run(["aarch64-linux-gnu-gcc", "-march=armv8.2-a+dotprod", "-O2", "-S",
                          "-fopenmp", "-o", "-", str(tmp_path / "sdot.c")],
                         capture_output=True, text=True, check=True).stdout
    assert "sdot\t" in asm or "sdot " in asm  # the products are the dot-product instruction
