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
import heapq
import importlib.util
import os
import pickle
import re
import struct
import subprocess
import sys
import tempfile
import threading
import warnings
from pathlib import Path

from ... import config
from ...errors import CompileError, NotImplementedYetError
from ..device_code import Binary
from ..device_code import GpuFunction as TritonFunction
from .exprs import PRELUDE


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
    """AOT-compile every function of ``source`` (the module text) for ``tgt`` (a ``Compiles``
    given them all at once)."""
    compiles = Compiles(tgt, jobs)
    try:
        for f in functions:
            compiles.add(f)
        return compiles.finish()
    finally:
        compiles.close()


class Compiles:
    """The Triton compiles of one build, started while the build still renders.

    ``add`` each function as soon as it is rendered. From the ``PARALLEL_MIN``-th on, worker
    processes start (one more per function added, up to ``jobs``; ``python -m`` this module: no
    fork of a process that may hold torch or triton state, no re-run of the caller's script).
    Each imports triton while the build renders on, then compiles one function at a time: the
    heaviest not yet taken (``_weight``), sent by a thread of this process that waits for it. The
    workers share this process's ``triton_key`` (the cache key's hash of triton's own files and
    500 MB library: 0.45 s per process), and each function is loaded on its own (the prelude
    and its source, at the line it has in the module), not the whole module per worker.
    Workers ``spares`` started earlier (``Spares``: while the graph passes ran) are used first,
    from the first function on. ``finish`` waits for every function (fewer than
    ``PARALLEL_MIN`` and no spares: compiled in this process) and returns name -> Binary;
    ``close`` stops the workers (call it in a ``finally``)."""

    def __init__(self, tgt, jobs: int | None = None, spares: Spares | None = None) -> None:
        triton_version()
        self.spares = spares
        self.target, self.target_name = gpu_target(tgt), tgt.name
        self.jobs = max(1, jobs or os.cpu_count() or 1)
        self._line = _prelude_lines()  # where the next function starts in the module
        self._count = 0
        self._pending: list[tuple] = []  # heap of (-weight, order, spec)
        self._done: dict[str, Binary] = {}
        self._failures: list[str] = []
        self._finishing = False
        self._cond = threading.Condition()
        self._workers: list[_Worker] = []
        self._key = _Key()

    def add(self, f: TritonFunction) -> None:
        spec = dict(_spec(f), line=self._line)
        self._line += f.source.count("\n") + 2  # the module joins functions with a blank line
        with self._cond:
            self._count += 1
            heapq.heappush(self._pending, (-_weight(spec), self._count, spec))
            self._cond.notify()
        spare = self.spares.take() if self.spares and len(self._workers) < self.jobs else None
        if spare or (self.jobs > 1 and self._count >= PARALLEL_MIN and
                     len(self._workers) < min(self.jobs, self._count)):
            self._workers.append(_Worker(self, spare))

    def finish(self) -> dict[str, Binary]:
        if not self._workers:  # a few functions: here
            specs = [spec for *_, spec in sorted(self._pending)]
            self._pending = []
            return _compile_specs(None, specs, self.target, self.target_name)
        with self._cond:
            self._finishing = True
            self._cond.notify_all()
        for w in self._workers:
            w.thread.join()
        if self._failures:
            raise CompileError(self._failures[0])
        return dict(self._done)

    def close(self) -> None:
        with self._cond:
            self._finishing = True
            self._failures.append("stopped")  # feeders take no more functions
            self._cond.notify_all()
        for w in self._workers:
            w.stop()

    def _next(self) -> dict | None:
        """The heaviest function no worker has taken; None once there will be none."""
        with self._cond:
            while not self._pending and not self._finishing and not self._failures:
                self._cond.wait()
            if self._failures or not self._pending:
                return None
            return heapq.heappop(self._pending)[2]

    def _record(self, reply: tuple) -> None:
        with self._cond:
            if reply[0] == "ok":
                self._done[reply[1]] = Binary(**reply[2])
            else:
                self._failures.append(reply[1])
                self._cond.notify_all()


class _Key:
    """This process's ``triton_key()``, computed by a thread (file reads and hashing release the
    interpreter lock) while the build renders."""

    def __init__(self) -> None:
        self.value: str | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            from triton.runtime.cache import triton_key
            self.value = triton_key()
        except Exception:  # noqa: BLE001  (each worker then computes its own)
            self.value = None

    def get(self) -> str | None:
        self.thread.join()
        return self.value


class Spares:
    """Compile worker processes started before the build knows its functions (``count``; by
    default one per core but one, which the graph passes keep): each imports triton and waits;
    ``Compiles`` takes them before it starts any, and ``close`` ends those it did not take."""

    def __init__(self, count: int | None = None) -> None:
        self.procs = [_start() for _ in range(max(1, count or (os.cpu_count() or 2) - 1))]

    def take(self) -> tuple | None:
        return self.procs.pop(0) if self.procs else None

    def close(self) -> None:
        for proc, err in self.procs:
            _end(proc, err)
        self.procs = []


def _start() -> tuple:
    """A compile worker process (``python -m`` this module) and the file its stderr goes to."""
    err = tempfile.TemporaryFile()  # noqa: SIM115  (closed when the worker ends: _end)
    proc = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=err)
    return proc, err


def _end(proc, err) -> None:
    with contextlib.suppress(OSError):
        proc.stdin.close()  # the worker exits at the end of its input
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    err.close()


class _Worker:
    """One compile process and the thread here that sends it functions and reads the results
    (messages: length-prefixed pickles on its stdin and stdout)."""

    def __init__(self, owner: Compiles, started: tuple | None = None) -> None:
        self.owner = owner
        self.proc, self.err = started or _start()
        self.thread = threading.Thread(target=self._feed, daemon=True)
        self.thread.start()

    def _feed(self) -> None:
        owner = self.owner
        try:
            _send(self.proc.stdin, (owner.target, owner.target_name, owner._key.get()))
            while (spec := owner._next()) is not None:
                _send(self.proc.stdin, spec)
                reply = _receive(self.proc.stdout)
                if reply is None:
                    raise CompileError(f"a Triton compile worker ended while compiling "
                                       f"{spec['name']}: {self._stderr()}")
                owner._record(reply)
        except CompileError as e:
            owner._record(("error", str(e)))
        except OSError as e:  # the worker could not start or ended early
            owner._record(("error", f"a Triton compile worker failed ({e}): {self._stderr()}"))
        finally:
            _end(self.proc, self.err)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.thread.join()

    def _stderr(self) -> str:
        self.err.seek(0)
        return self.err.read().decode(errors="replace").strip()[-4000:] or "(no output)"


def _send(pipe, obj) -> None:
    data = pickle.dumps(obj)
    pipe.write(struct.pack("<Q", len(data)) + data)
    pipe.flush()


def _receive(pipe):
    """The next message, or None at the end of the pipe."""
    head = pipe.read(8)
    if len(head) < 8:
        return None
    (size,) = struct.unpack("<Q", head)
    data = pipe.read(size)
    return pickle.loads(data) if len(data) == size else None


def _weight(spec: dict) -> float:
    """A function's compile time, relative: a GEMM or attention grows with its tile and (GEMMs)
    its epilogue's source; fitted on deviceless sm_90 compiles of BERT-base, GPT-2 small and
    ResNet-50, symbolic and static (253 functions, 0.07-4 s each)."""
    c, n = spec["constexprs"], len(spec["source"])
    if spec["template"] == "gemm":
        return 0.3 + c.get("BM", 16) * c.get("BN", 16) / 16384 * (1 + n / 1500)
    if spec["template"] == "attention":
        return 0.5 + c.get("BM", 16) * c.get("BN", 16) / 4096
    return 0.1 + n / 5000


def _serve() -> None:
    """A compile worker: the target (and the parent's ``triton_key``), then functions one by
    one on stdin; for each, ("ok", name, Binary fields) or ("error", message) on stdout."""
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything printed by triton or ptxas goes to stderr, not into the replies
    import triton.compiler  # while the parent renders
    inp = sys.stdin.buffer
    header = _receive(inp)
    if header is None:
        return
    target, target_name, key = header
    if key is not None:
        import triton.runtime.cache
        triton.runtime.cache.triton_key = lambda: key  # as triton's own warm-up pool does
    while (spec := _receive(inp)) is not None:
        try:
            b = _compile_specs(None, [spec], target, target_name)[spec["name"]]
            reply = ("ok", spec["name"], dataclasses.asdict(b))
        except CompileError as e:
            reply = ("error", str(e))
        _send(out, reply)


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


def _compile_specs(source: str | None, specs: list[dict], target, target_name: str
                   ) -> dict[str, Binary]:
    """Compile ``specs``: functions of the module ``source``, or with ``source`` None each
    loaded on its own (``_load_one``)."""
    import triton
    from triton.compiler import ASTSource
    out: dict[str, Binary] = {}
    with tempfile.TemporaryDirectory(prefix="deploy-triton-") as tmp, warnings.catch_warnings(), \
            line_info():
        warnings.simplefilter("ignore")
        module = load_source(source, Path(tmp)) if source is not None else None
        for f in specs:
            fn = getattr(module or _load_one(f, Path(tmp)), f["name"])
            attrs = {(k,): [["tt.divisibility", 16]] for k in range(f["nargs"])}
            src = ASTSource(fn, f["signature"], f["constexprs"], attrs)
            try:
                c = triton.compile(src, target=target, options={"num_warps": f["num_warps"],
                                                                "num_stages": f["num_stages"]})
            except Exception as e:  # noqa: BLE001  (triton raises many types)
                cause = e.__cause__ or e.__context__  # (a CompilationError's own reason)
                why = f"\ncaused by {type(cause).__name__}: {cause}" if cause else ""
                raise CompileError(f"triton could not compile {f['name']} ({f['template']} "
                                   f"template) for {target_name}: {type(e).__name__}: {e}{why}\n"
                                   f"--- source ---\n{f['source']}") from None
            out[f["name"]] = _binary(c, f["name"], f["nargs"], target.backend)
    return out


def _prelude_lines() -> int:
    """The line a module's first function starts at (``TritonRenderer.module``)."""
    return PRELUDE.count("\n") + 3


def _load_one(spec: dict, directory: Path):
    """A module of the prelude and one function, the function at the line it has in the whole
    module (``spec["line"]``): the same code, line numbers (hence Triton's cache key) and
    line information as the whole module gives, without reading every other function."""
    pad = max(2, spec.get("line", 0) - PRELUDE.count("\n") - 1)
    return load_source(PRELUDE + "\n" * pad + spec["source"], directory)


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
    _serve()
