"""Symbolic sizes as parameters of the generated Triton functions.

Before a kernel is rendered, every symbolic size in it is rewritten over parameter symbols:
a symbol ``seq`` becomes ``sz_seq``, and each opaque atom (``floordiv``, ``mod``, ``min``,
``max`` of sizes) becomes a parameter of its own (``sz_x0``), computed by the runtime. What is
left is a polynomial in the parameters, so ``str()`` of a size is valid Python for ``@triton.jit``
code (``(768*sz_seq)``), and the grid and scratch sizes the renderer derives from them
(``(sz_seq + 63)//64``, non-negative operands only) are stored as expressions the runtime
evaluates per call. A function's size parameters are ``int32`` (the runtime refuses sizes whose
tensors would pass 2**31 elements).
"""
from __future__ import annotations

import contextlib
import re

from ...graph_ir.sym import Sym, context, free_symbols, hint, to_json
from ...tensor_ir.kernel import Kernel, map_sizes


def cdiv(a, b):
    """ceil(a / b) for a non-negative size and a positive int, written with a non-negative
    numerator (a symbolic result renders as valid Triton and runtime code)."""
    return (a + b - 1) // b


class SizeParams:
    """The size parameters of one artifact: parameter name -> the size it holds (a symbol or an
    atom over the model's symbols)."""

    def __init__(self) -> None:
        self.params: dict[str, Sym] = {}
        self._atoms: dict[str, str] = {}

    def rename(self, k: Kernel) -> Kernel:
        return map_sizes(k, self.size)

    def size(self, d):
        if not isinstance(d, Sym):
            return d
        total = 0
        for mono, coeff in d.terms:
            term = coeff
            for atom in mono:
                term = term * Sym.symbol(self._param(atom))
            total = term + total
        return total

    def _param(self, atom) -> str:
        if isinstance(atom, str):
            if atom.startswith("sz_"):
                return atom  # renamed already
            name = f"sz_{atom}"
            self.params.setdefault(name, Sym.symbol(atom))
            return name
        key = str(atom)
        if key not in self._atoms:
            self._atoms[key] = f"sz_x{len(self._atoms)}"
            self.params[self._atoms[key]] = Sym.atom(atom)
        return self._atoms[key]

    @contextlib.contextmanager
    def hinted(self):
        """Heuristics see each parameter at its size's hint (``sz_seq`` at ``seq``'s, ``sz_x0``
        at its atom's), not at the default hint of an unknown symbol."""
        ctx = context()
        saved = dict(ctx.hints)
        ctx.hints.update({p: max(1, hint(e)) for p, e in self.params.items()})
        try:
            yield
        finally:
            ctx.hints.clear()
            ctx.hints.update(saved)

    def json(self) -> dict:
        """Parameter -> the expression over the model's symbols (the runtime's prefix form)."""
        return {p: to_json(e) for p, e in self.params.items()}


def used_params(text: str, params) -> list[str]:
    """The size parameters a generated function's source names, in a fixed order."""
    return [p for p in sorted(params) if re.search(rf"\b{p}\b", text)]


def size_json(x):
    """A launch size (grid entry, scratch bytes) for the manifest: an int, or the prefix form
    over parameter names."""
    return int(x) if not isinstance(x, Sym) else {"sym": to_json(x)}


def is_symbolic(x) -> bool:
    return isinstance(x, Sym) and bool(free_symbols(x))

