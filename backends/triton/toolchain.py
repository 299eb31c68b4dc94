"""Ahead-of-time Triton compiles, with no GPU: ``triton.compile(ASTSource(...),
target=GPUTarget(...))`` gives a cubin and PTX (NVIDIA) or an hsaco (AMD) per function, plus the
metadata a launcher needs (warps, shared memory, scratch sizes).

The kernel ABI of the installed triton is recorded per function (``params``: how many kernel
parameters the binary takes, read off its PTX; triton 3.x appends scratch pointers after the
function's own arguments), so a runtime without triton can launch it.
"""
from __future__ import annotations

import hashlib
import importlib.util
import re
import sys
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import CompileError, NotImplementedYetError
from .render import TritonFunction


@dataclass
class Binary:
    """One compiled function: its binaries by kind and its launch metadata."""
    images: dict[str, bytes]  # "cubin", "ptx", "hsaco"
    shared: int
    num_warps: int
    params: int  # kernel parameters in the binary (the function's pointers + trailing scratch)
    global_scratch: int = 0  # bytes per program (0: the pointer is NULL)
    global_scratch_align: int = 1
    profile_scratch: int = 0
    meta: dict = field(default_factory=dict)


def triton_version() -> str:
    try:
        import triton
    except ImportError:
        raise NotImplementedYetError(
            "GPU targets need the `triton` package to compile (pip install triton; it installs "
            "and compiles on machines without a GPU)") from None
    return triton.__version__


def gpu_target(tgt):
    """The ``GPUTarget`` of a deploy target (``sm_90`` -> cuda 90, ``gfx942`` -> hip)."""
    from triton.backends.compiler import GPUTarget
    if tgt.vendor == "nvidia":
        digits = re.sub(r"\D", "", tgt.arch)
        return GPUTarget("cuda", int(digits), tgt.warp_size or 32)
    if tgt.vendor == "amd":
        return GPUTarget("hip", tgt.arch, tgt.warp_size or 64)
    raise NotImplementedYetError(f"target {tgt.name}: Triton compiles for vendors nvidia and "
                                 f"amd, not {tgt.vendor!r}")


def load_source(source: str, directory: Path):
    """Import generated source as a module (``@triton.jit`` reads functions' source files)."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    name = f"deploy_triton_{digest}"
    path = Path(directory) / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def compile_functions(functions: list[TritonFunction], source: str, tgt) -> dict[str, Binary]:
    """AOT-compile every function of ``source`` (the module text) for ``tgt``."""
    triton_version()
    import triton
    from triton.compiler import ASTSource
    target = gpu_target(tgt)
    out: dict[str, Binary] = {}
    with tempfile.TemporaryDirectory(prefix="deploy-triton-") as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        module = load_source(source, Path(tmp))
        for f in functions:
            attrs = {(k,): [["tt.divisibility", 16]] for k in range(len(f.args))}
            src = ASTSource(getattr(module, f.name), f.signature, f.constexprs, attrs)
            try:
                c = triton.compile(src, target=target,
                                   options={"num_warps": f.num_warps, "num_stages": f.num_stages})
            except Exception as e:  # triton raises many types
                raise CompileError(f"triton could not compile {f.name} ({f.template} template) "
                                   f"for {tgt.name}: {type(e).__name__}: {e}\n"
                                   f"--- source ---\n{f.source}") from e
            out[f.name] = _binary(c, f, target.backend)
    return out


def _binary(c, f: TritonFunction, backend: str) -> Binary:
    md = c.metadata
    if backend == "cuda":
        images = {"cubin": bytes(c.asm["cubin"]), "ptx": c.asm["ptx"].encode()}
        params = ptx_param_count(c.asm["ptx"], f.name)
    else:
        images = {"hsaco": bytes(c.asm["hsaco"])}
        params = len(f.args) + 2  # triton 3.x: global and profile scratch pointers
    return Binary(images, int(md.shared), int(md.num_warps), params,
                  int(getattr(md, "global_scratch_size", 0) or 0),
                  int(getattr(md, "global_scratch_align", 1) or 1),
                  int(getattr(md, "profile_scratch_size", 0) or 0))


def ptx_param_count(ptx: str, name: str) -> int:
    """Parameters of ``.entry name(...)`` in PTX text."""
    m = re.search(r"\.entry\s+" + re.escape(name) + r"\s*\((.*?)\)", ptx, re.DOTALL)
    if m is None:
        raise CompileError(f"PTX of {name} has no .entry {name}")
    return len(re.findall(r"\.param\b", m.group(1)))
