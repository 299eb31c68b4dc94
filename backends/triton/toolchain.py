"""Ahead-of-time Triton compiles, with no GPU: ``triton.compile(ASTSource(...),
target=GPUTarget(...))`` gives a cubin and PTX (NVIDIA) or an hsaco (AMD) per function, plus the
metadata a launcher needs (warps, shared memory, scratch sizes).

The kernel ABI of the installed triton is recorded per function (``params``: how many kernel
parameters the binary takes, read off its PTX; triton 3.x appends scratch pointers after the
function's own arguments), so a runtime without triton can launch it.

Binaries carry no line information (``TRITON_DISABLE_LINE_INFO`` while compiling, unless
``DEPLOY_GPU_LINEINFO=1``): the machine code is the same (``cuobjdump -sass`` and the launch
metadata of all 108 functions of BERT-base and GPT-2 small, symbolic and static, compared equal),
the cubins are about 3x smaller (the PTX 1.5-2x) and each compile 5-7% shorter (BERT-base's
functions compiled alternately with and without, on the 2-core machine). The CUDA C path
leaves ``-lineinfo`` out for the same reason.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.util
import os
import pickle
import re
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

from ... import config
from ...errors import CompileError, NotImplementedYetError
from ..device_code import Binary
from ..device_code import GpuFunction as TritonFunction


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


PARALLEL_MIN = 8  # functions below which worker processes cost more than they save


def compile_functions(functions: list[TritonFunction], source: str, tgt,
                      jobs: int | None = None) -> dict[str, Binary]:
    """AOT-compile every function of ``source`` (the module text) for ``tgt``; many functions
    are shared among worker processes (``python -m`` this module: no fork of a process that may
    hold torch or triton state, no re-run of the caller's script). Each worker claims the next
    function as it finishes one (a counter file under a lock), heaviest templates first, so a
    few slow GEMMs do not leave the other workers idle at the end."""
    triton_version()
    target = gpu_target(tgt)
    specs = sorted((_spec(f) for f in functions), key=_weight)
    jobs = min(jobs or os.cpu_count() or 1, len(specs))
    if jobs <= 1 or len(specs) < PARALLEL_MIN:
        return _compile_specs(source, specs, target, tgt.name)
    with tempfile.TemporaryDirectory(prefix="deploy-claims-") as tmp:
        counter = os.path.join(tmp, "next")
        Path(counter).write_text("0")
        procs = []
        for _ in range(jobs):
            p = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            p.stdin.write(pickle.dumps((source, specs, target, tgt.name, counter)))
            p.stdin.close()
            procs.append(p)
        out: dict[str, Binary] = {}
        failures = []
        for p in procs:
            data, err = p.stdout.read(), p.stderr.read()
            p.wait()
            if p.returncode != 0:
                failures.append(err.decode(errors="replace").strip()[-4000:])
                continue
            out.update({name: Binary(**fields) for name, fields in pickle.loads(data).items()})
    if failures:
        raise CompileError(failures[0])
    return out


HEAVY = {"attention": 0, "gemm": 1}  # templates that compile slowest, started first


def _weight(spec: dict) -> tuple[int, int]:
    return HEAVY.get(spec["template"], len(HEAVY)), -spec["num_stages"] * spec["num_warps"]


def _claims(counter: str, count: int):
    """Indices ``0 .. count-1``, each given to exactly one of the processes sharing
    ``counter`` (read and advanced under an exclusive lock)."""
    import fcntl
    with open(counter, "r+") as f:
        while True:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                f.seek(0)
                i = int(f.read() or 0)
                f.seek(0)
                f.write(str(i + 1))
                f.truncate()
                f.flush()
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)
            if i >= count:
                return
            yield i


def _worker() -> None:
    """Compile the specs this process claims (pickled on stdin with the counter's path);
    pickle {name: Binary fields} to stdout."""
    source, specs, target, name, counter = pickle.loads(sys.stdin.buffer.read())
    try:
        result = _compile_specs(source, specs, target, name, _claims(counter, len(specs)))
    except CompileError as e:
        sys.stderr.write(str(e))
        sys.exit(3)
    sys.stdout.buffer.write(pickle.dumps({k: dataclasses.asdict(b) for k, b in result.items()}))


def _spec(f: TritonFunction) -> dict:
    return {"name": f.name, "signature": f.signature, "constexprs": f.constexprs,
            "nargs": len(f.args), "num_warps": f.num_warps, "num_stages": f.num_stages,
            "template": f.template, "source": f.source}


@contextlib.contextmanager
def line_info():
    """Triton's compiles in the block keep line information only under
    ``DEPLOY_GPU_LINEINFO=1`` (an environment variable, so that Triton's cache keys see it)."""
    name = "TRITON_DISABLE_LINE_INFO"
    before = os.environ.get(name)
    os.environ[name] = "0" if config.gpu_line_info() else "1"
    try:
        yield
    finally:
        if before is None:
            del os.environ[name]
        else:
            os.environ[name] = before


def _compile_specs(source: str, specs: list[dict], target, target_name: str,
                   order=None) -> dict[str, Binary]:
    """Compile ``specs`` (those at the indices ``order`` yields: all by default)."""
    import triton
    from triton.compiler import ASTSource
    out: dict[str, Binary] = {}
    with tempfile.TemporaryDirectory(prefix="deploy-triton-") as tmp, warnings.catch_warnings(), \
            line_info():
        warnings.simplefilter("ignore")
        module = load_source(source, Path(tmp))
        for f in (specs[i] for i in order) if order is not None else specs:
            attrs = {(k,): [["tt.divisibility", 16]] for k in range(f["nargs"])}
            src = ASTSource(getattr(module, f["name"]), f["signature"], f["constexprs"], attrs)
            try:
                c = triton.compile(src, target=target, options={"num_warps": f["num_warps"],
                                                                "num_stages": f["num_stages"]})
            except Exception as e:  # noqa: BLE001  (triton raises many types)
                raise CompileError(f"triton could not compile {f['name']} ({f['template']} "
                                   f"template) for {target_name}: {type(e).__name__}: {e}\n"
                                   f"--- source ---\n{f['source']}") from None
            out[f["name"]] = _binary(c, f["name"], f["nargs"], target.backend)
    return out


def _binary(c, name: str, nargs: int, backend: str) -> Binary:
    md = c.metadata
    if backend == "cuda":
        images = {"cubin": bytes(c.asm["cubin"]), "ptx": c.asm["ptx"].encode()}
        params = ptx_param_count(c.asm["ptx"], name)
    else:
        images = {"hsaco": bytes(c.asm["hsaco"])}
        params = nargs + 2  # triton 3.x: global and profile scratch pointers
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


if __name__ == "__main__":
    _worker()
