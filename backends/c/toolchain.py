"""The system C compiler: C sources -> one shared library (OpenMP), in parallel chunks."""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ...errors import CompileError

BASE_FLAGS = ["-O3", "-std=gnu11", "-fPIC", "-fopenmp", "-fno-math-errno", "-fno-trapping-math",
              "-w"]


# gcc 12 at -O3 with AVX-512 miscompiles selects in completely unrolled small loops (it reuses the
# first vector's mask for every masked load; tests/test_codegen_regressions.py has the pattern).
# Disabling that early complete-unroll pass avoids it at no measurable cost to our kernels.
GCC_FLAGS = ["-fdisable-tree-cunrolli"]


def _has_libmvec() -> bool:
    import platform
    libc, version = platform.libc_ver()
    return platform.machine() == "x86_64" and libc == "glibc" and \
        tuple(int(x) for x in version.split(".")[:2]) >= (2, 35)


# prelude.h declares libmvec's SIMD exp/log/erf/tanh on x86_64 glibc >= 2.35 (native builds;
# a cross compiler set through CC links libm only)
LIBS = ["-lmvec", "-lm"] if _has_libmvec() and not os.environ.get("CC") else ["-lm"]


def _is_gcc(cc: str) -> bool:
    try:
        out = subprocess.run([cc, "--version"], capture_output=True, text=True, check=False).stdout
    except OSError:
        return False
    return "Free Software Foundation" in out and "clang" not in out


def find_cc() -> str:
    for cc in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if cc and shutil.which(cc):
            return cc
    raise CompileError("no C compiler found (set CC, or install gcc or clang)")


def build_shared_library(sources: list[str], out_path: Path, flags: tuple[str, ...] = (),
                         jobs: int | None = None) -> Path:
    """Compile each source to an object in parallel, then link one shared library."""
    cc = find_cc()
    flags = tuple(flags) + (tuple(GCC_FLAGS) if _is_gcc(cc) else ())
    jobs = jobs or os.cpu_count() or 1
    with tempfile.TemporaryDirectory(prefix="deploy-cc-") as tmp:
        objs = []

        def one(k_src):
            k, src = k_src
            c_path, o_path = Path(tmp) / f"part{k}.c", Path(tmp) / f"part{k}.o"
            c_path.write_text(src)
            _run([cc, *BASE_FLAGS, *flags, "-c", str(c_path), "-o", str(o_path)], c_path)
            return o_path

        with ThreadPoolExecutor(max_workers=jobs) as pool:
            objs = list(pool.map(one, enumerate(sources)))
        _run([cc, "-shared", "-fopenmp", *map(str, objs), "-o", str(out_path), *LIBS], None)
    return out_path


def _run(cmd: list[str], src: Path | None) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        where = f" on {src.name}" if src else ""
        raise CompileError(f"C compiler failed{where} (a deploy bug; please report it):\n"
                           f"$ {' '.join(cmd)}\n{proc.stderr[-4000:]}")
