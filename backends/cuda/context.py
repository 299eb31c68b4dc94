"""What the CUDA C templates share: the stage being rendered (``StageContext``: its scalar
renderer, index type and helpers) and what a template returns (``Body``), assembled here into
a ``GpuFunction`` with its parameters, view pointers and size parameters."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from ...tensor_ir.expr import Expr, Load, walk
from ...tensor_ir.kernel import Buffer, Kernel, Stage
from ..device_code import GpuFunction
from ..triton.exprs import PTR_TYPE
from .scalar import CudaScalar, ident, storage_type
from .sizes import cu_size


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def cdiv(a, b: int):
    """ceil(a / b) with a non-negative numerator (valid as C and for the runtime's sizes)."""
    return (a + b - 1) // b


@dataclass
class Body:
    """What a template renders: the function's statements and how to launch it."""
    lines: list[str]
    grid: tuple  # blocks along x (ints or sizes over the sz_* parameters)
    threads: int
    template: str
    shared: int = 0  # dynamic shared memory bytes
    meta: dict = field(default_factory=dict)


class StageContext:
    """One stage being rendered. ``sizes``: the artifact's size parameters (name -> size);
    ``index_type``: the C type of indices (``int``, or ``int64_t`` for tensors past 2**31)."""

    def __init__(self, k: Kernel, st: Stage, name: str, buffers: dict[str, Buffer],
                 index_type: str, sizes: dict, target=None, allow_tf32: bool = False,
                 tuned: dict | None = None, stages: list[Stage] | None = None):
        self.kernel, self.stage, self.name = k, st, name
        self.stages = stages or [st]  # what the function computes (a rows kernel: every stage)
        self.buffers = buffers
        self.idx = index_type
        self.sizes = sizes
        self.target = target
        self.allow_tf32 = allow_tf32
        self.tuned = tuned
        self.scalar = CudaScalar(buffers, index_type)

    # ---- helpers for templates ---------------------------------------------------------------
    def root(self, name: str) -> str:
        """The kernel buffer whose memory ``name`` (a buffer or a view of one) is."""
        bases = {view.name: base for view, base in self.kernel.aliases}
        while name in bases:
            name = bases[name]
        return name

    def decompose(self, lines: list[str], flat: str, vars_, extents, ind: str) -> None:
        """Declare ``vars_`` (row-major over ``extents``) from the flat index ``flat``."""
        stride = 1
        decls = []
        for k in reversed(range(len(vars_))):
            v, e = vars_[k], extents[k]
            if e == 1:
                value = "0"
            else:
                q = flat if stride == 1 else f"({flat} / {cu_size(stride)})"
                value = q if k == 0 else f"({q} % {cu_size(e)})"
            decls.append(f"{ind}const {self.idx} {v.name} = {value};")
            stride = stride * e
        lines.extend(reversed(decls))

    def expr(self, e: Expr, lines: list[str], ind: str) -> str:
        return self.scalar.expr(e, lines, ind)

    def store(self, value: str) -> str:
        """The statement storing ``value`` at the stage's point (its variables declared)."""
        return self.scalar._store(self.stage, self.buffers[self.stage.out], value)

    # ---- the function ------------------------------------------------------------------------
    def function(self, body: Body, s: int) -> GpuFunction:
        """``body`` as a ``__global__`` function: buffer pointers (those its text names, in the
        kernel's order), then the int64 size parameters it names."""
        text = "\n".join(body.lines)
        k = self.kernel
        used = [n for n in self.buffers if re.search(rf"\b{ident(n)}\b", text)]
        roots = {self.root(n) for n in used}
        args = [b.name for b in (*k.inputs, *k.outputs, *k.temps) if b.name in roots]
        params = [self._pointer(name, restrict=True) + " " + ident(name) for name in args]
        decls = [f"  {self._pointer(n)} {ident(n)} = ({self._pointer(n)}){ident(self.root(n))};"
                 for n in used if self.root(n) != n]
        sizes = [p for p in sorted(self.sizes) if re.search(rf"\b{p}\b", text)]
        params += [f"int64_t {p}_arg" for p in sizes]
        decls += [f"  const {self.idx} {p} = ({self.idx}){p}_arg;" for p in sizes]
        header = (f'extern "C" __global__ void __launch_bounds__({body.threads}) '
                  f'{self.name}({", ".join(params)}) {{')
        note = f"/* {k.note}: stage {s}, {body.template} */\n" if k.note else ""
        source = note + header + "\n" + "\n".join(decls + body.lines) + "\n}\n"
        signature = {ident(n): PTR_TYPE[self.buffers[n].dtype] for n in args}
        signature.update({p: "i64" for p in sizes})
        grid = tuple(body.grid) + (1,) * (3 - len(body.grid))
        return GpuFunction(self.name, source, args, signature, {}, grid, body.threads // 32, 1,
                           body.template, s, dict(body.meta), sizes=sizes, codegen="cuda",
                           shared=body.shared)

    def _pointer(self, name: str, restrict: bool = False) -> str:
        """The pointer type of buffer ``name``: const unless the stage writes its memory;
        ``__restrict__`` (a parameter) unless its memory may be both read and written: the
        written buffer when the stage reads it, and a kernel input and output that the memory
        plan may place at one address (``memory.inplace_pairs``: same shape and dtype)."""
        written = self._written()
        const = "" if self.root(name) in written else "const "
        shared = self._may_share(written) | (written if self._reads_written(written) else set())
        qual = " __restrict__" if restrict and self.root(name) not in shared else ""
        return f"{const}{storage_type(self.buffers[name].dtype)}*{qual}"

    def _written(self) -> set[str]:
        return {self.root(st.out) for st in self.stages}

    def _reads_written(self, written: set[str]) -> bool:
        return any(isinstance(x, Load) and self.root(x.buf) in written for st in self.stages
                   for e in (st.body, *(st.store_index or ())) for x in walk(e))

    def _may_share(self, written: set[str]) -> set[str]:
        """Written outputs and the inputs the memory plan may overwrite with them."""
        out = set()
        for name in written:
            buf = self.buffers[name]
            partners = {b.name for b in self.kernel.inputs
                        if tuple(b.shape) == tuple(buf.shape) and b.dtype is buf.dtype}
            out |= partners | {name} if partners else set()
        return out
