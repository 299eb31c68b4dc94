"""CUDA C -> cubin + PTX with NVRTC, deviceless (no GPU, no nvcc): ``cuda-bindings``'
``nvrtc`` module, the library itself from the ``nvidia-cuda-nvrtc`` wheel (found by
``cuda-pathfinder``, which cuda-bindings uses) or a CUDA toolkit on the library path.

Each function compiles as its own translation unit (the prelude and the function; in parallel
threads) to a cubin for the target's architecture and its PTX (the driver JIT-compiles it for
newer GPUs; a driver older than the NVRTC that wrote it refuses it), so an artifact holds each
function's code once. IEEE semantics: no fast math,
denormals kept, divisions and square roots correctly rounded (``-fmad`` contraction stays on,
as in nvcc's default). Compiled modules are cached under ``DEPLOY_CACHE_DIR`` (default
``~/.cache/deploy``), keyed by the source, architecture, options and NVRTC version.
"""
from __future__ import annotations

import hashlib
import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ...errors import CompileError, NotImplementedYetError
from ..device_code import Binary, GpuFunction
from .render import PRELUDE

INSTALL = "pip install cuda-bindings nvidia-cuda-nvrtc"
FORMAT = 2  # bump when what is cached for a source changes (2: PTX stamped portable_ptx)
OPTIONS = ("-default-device", "--std=c++17", "--ftz=false", "--prec-div=true",
           "--prec-sqrt=true", "--fmad=true")  # (-lineinfo for profiling: 3.5x larger cubins)


def nvrtc_version() -> tuple[int, int]:
    """(major, minor) of the NVRTC library; NotImplementedYetError saying what to install when
    it or its binding is missing."""
    try:
        from cuda.bindings import nvrtc
    except ImportError:
        raise NotImplementedYetError(
            f"the CUDA C code generator compiles with NVRTC, through the cuda-bindings package: "
            f"{INSTALL} (no GPU or nvcc needed)") from None
    try:
        err, major, minor = nvrtc.nvrtcVersion()
    except Exception as e:  # noqa: BLE001  (the binding raises when it cannot load the library)
        raise NotImplementedYetError(
            f"cuda-bindings found no NVRTC library ({type(e).__name__}: {e}); install it with "
            f"{INSTALL}") from None
    _check(nvrtc, err, "nvrtcVersion")
    return int(major), int(minor)


def compile_cuda(functions: list[GpuFunction], source: str, tgt,
                 jobs: int | None = None) -> dict[str, Binary]:
    """Compile ``functions`` for ``tgt.arch`` (``sm_90``): function name -> its Binary (cubin
    and PTX of that function alone). ``source`` (their module, ``CudaRenderer.module``) is the
    artifact's copy; each function compiles with the prelude only."""
    arch = tgt.arch
    if not re.fullmatch(r"sm_\d+a?", arch or ""):
        raise NotImplementedYetError(f"target {tgt.name}: CUDA C compiles for NVIDIA "
                                     f"architectures (sm_80, sm_90 ...), not {arch!r}")
    if not functions:
        return {}
    nvrtc_version()  # a missing NVRTC says what to install before any work
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(functions)))
    with ThreadPoolExecutor(jobs) as pool:  # NVRTC releases the GIL while it compiles
        images = list(pool.map(lambda f: compile_module(PRELUDE + "\n" + f.source, arch)[0], functions))
    out = {}
    for f, im in zip(functions, images):
        if f.name not in _entries(im["ptx"]):
            raise CompileError(f"NVRTC output for {arch} has no entry {f.name}")
        out[f.name] = Binary(im, f.shared, f.num_warps, len(f.args) + len(f.sizes),
                             meta={"codegen": "cuda"})
    return out


def compile_module(source: str, arch: str) -> tuple[dict[str, bytes], str]:
    """{"cubin": ..., "ptx": ...} of a translation unit for ``arch``, and its cache key."""
    version = nvrtc_version()
    key = hashlib.sha256(repr((source, arch, OPTIONS, version, FORMAT)).encode()).hexdigest()[:24]
    cached = _cache_read(key)
    if cached is not None:
        return cached, key
    images = _nvrtc_compile(source, arch)
    _cache_write(key, images)
    return images, key


def _nvrtc_compile(source: str, arch: str) -> dict[str, bytes]:
    from cuda.bindings import nvrtc
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), b"deploy_kernels.cu", 0, [], [])
    _check(nvrtc, err, "nvrtcCreateProgram")
    try:
        opts = [f"--gpu-architecture={arch}".encode(), *(o.encode() for o in OPTIONS)]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise CompileError(f"NVRTC could not compile the CUDA C module for {arch}:\n"
                               f"{_log(nvrtc, prog)}\n--- source ---\n{_numbered(source)}")
        ptx = portable_ptx(_read(nvrtc, prog, "PTX"), arch)
        return {"cubin": _read(nvrtc, prog, "CUBIN"), "ptx": ptx}
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


# The first PTX ISA version with each architecture (PTX ISA release notes). NVRTC stamps its own
# (13.5 writes 9.5), and a driver refuses PTX newer than itself (CUDA_ERROR_UNSUPPORTED_PTX_VERSION:
# seen with driver 580 / CUDA 13.0, which JIT-loads the same text stamped 8.0). The templates use
# nothing newer than their architecture's first version (mma.sync, cp.async, ldmatrix: 7.0), and an
# instruction a version lacks fails the driver's parse at load, where the cubin is tried next.
PTX_ISA = {"sm_80": (7, 0), "sm_86": (7, 1), "sm_87": (7, 4), "sm_89": (7, 8), "sm_90": (7, 8),
           "sm_90a": (8, 0)}


def portable_ptx(ptx: bytes, arch: str) -> bytes:
    """``ptx`` stamped with the oldest PTX ISA version that has ``arch`` (never a newer one), so
    drivers older than the NVRTC that wrote it JIT it."""
    floor = PTX_ISA.get(arch)
    m = re.search(rb"^\.version (\d+)\.(\d+)", ptx, re.MULTILINE)
    if floor is None or m is None or (int(m.group(1)), int(m.group(2))) <= floor:
        return ptx
    return ptx[:m.start()] + b".version %d.%d" % floor + ptx[m.end():]


def _read(nvrtc, prog, kind: str) -> bytes:
    err, size = getattr(nvrtc, f"nvrtcGet{kind}Size")(prog)
    _check(nvrtc, err, f"nvrtcGet{kind}Size")
    buf = b" " * size
    (err,) = getattr(nvrtc, f"nvrtcGet{kind}")(prog, buf)
    _check(nvrtc, err, f"nvrtcGet{kind}")
    return buf.rstrip(b"\0") if kind == "PTX" else buf


def _log(nvrtc, prog) -> str:
    _, size = nvrtc.nvrtcGetProgramLogSize(prog)
    buf = b" " * size
    nvrtc.nvrtcGetProgramLog(prog, buf)
    return buf.rstrip(b"\0").decode(errors="replace").strip()


def _check(nvrtc, err, what: str) -> None:
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        _, name = nvrtc.nvrtcGetErrorString(err)
        raise CompileError(f"NVRTC: {what} failed: {name.decode() if name else err}")


def _numbered(source: str) -> str:
    return "\n".join(f"{k + 1:5d}  {line}" for k, line in enumerate(source.splitlines()))


def _entries(ptx: bytes) -> set[str]:
    return set(re.findall(r"\.entry\s+(\w+)", ptx.decode(errors="replace")))


# ---- cache ---------------------------------------------------------------------------------------

def _cache_dir() -> Path:
    root = os.environ.get("DEPLOY_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache",
                                                              "deploy")
    return Path(root) / "cuda"


def _cache_read(key: str) -> dict[str, bytes] | None:
    d = _cache_dir()
    try:
        return {kind: (d / f"{key}.{kind}").read_bytes() for kind in ("cubin", "ptx")}
    except OSError:
        return None


def _cache_write(key: str, images: dict[str, bytes]) -> None:
    d = _cache_dir()
    try:
        d.mkdir(parents=True, exist_ok=True)
        for kind, data in images.items():
            tmp = d / f"{key}.{kind}.{os.getpid()}"
            tmp.write_bytes(data)
            tmp.replace(d / f"{key}.{kind}")
    except OSError:
        pass  # a read-only home: compile every time
