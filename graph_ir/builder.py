"""Builder: the one way frontends and passes create nodes.

``emit`` normalizes attributes, infers output types from the op table, and folds the node into a
constant when every input is constant (through the op's numpy reference: the same code the
interpreter runs). Shape computations of static-shaped models (Shape -> Gather -> Concat ->
Reshape) therefore become constants as they are built.
"""
from __future__ import annotations

import numpy as np

from .graph import Graph, Node, Value
from .ops import Kind, OpDef, get
from .sym import SymbolicError, context, free_symbols
from .symfold import fold_symbolic, is_symbolic_array, settle
from .types import DType, TensorType

FOLD_LIMIT = 1 << 22  # folded constants beyond this size only where the inputs are as large


def fold_fits(out_types, in_arrays) -> bool:
    """Fold unless it would blow constants up: results up to FOLD_LIMIT elements, or no larger
    than the constant inputs (a weight's transpose or cast folds whatever its size)."""
    budget = max(FOLD_LIMIT, sum(int(a.size) for a in in_arrays if a is not None))
    return all(t.is_static for t in out_types) and sum(t.numel for t in out_types) <= budget


class Builder:
    def __init__(self, name: str = "graph", fold: bool = True):
        self.name = name
        self.fold = fold
        self.inputs: list[Value] = []
        self.nodes: list[Node] = []
        self.constants: dict[Value, np.ndarray] = {}
        # shape values: int64 tensors known at compile time as expressions (symfold.py)
        self.sym_values: dict[Value, np.ndarray] = {}
        # deferred constants: values known at compile time whose folding waits for the `fold`
        # pass, so that earlier passes still see how they were made (a quantized weight's
        # DequantizeLinear, kept for the `int8` pass); nodes of them are deferred too
        self.deferred: set[Value] = set()
        self._names: set[str] = set()

    # ---- values ---------------------------------------------------------------------------
    def fresh(self, hint: str) -> str:
        base = hint or "v"
        name, k = base, 0
        while name in self._names:
            k += 1
            name = f"{base}_{k}"
        self._names.add(name)
        return name

    def input(self, name: str, type_: TensorType) -> Value:
        v = Value(self.fresh(name), type_)
        self.inputs.append(v)
        return v

    def const(self, array, name: str = "const", dtype: DType | None = None) -> Value:
        arr = np.asarray(array, dtype=None if dtype is None else dtype.np)
        if dtype is None:
            dtype = DType.from_np(arr.dtype)
        arr = np.ascontiguousarray(arr).reshape(arr.shape)  # keeps 0-d arrays 0-d
        arr.setflags(write=False)
        v = Value(self.fresh(name), TensorType(tuple(int(d) for d in arr.shape), dtype))
        self.constants[v] = arr
        return v

    def sym_const(self, array: np.ndarray, name: str = "shape") -> Value:
        """A shape value (an object array of ints and ``Sym``); one with no symbol left is an
        ordinary int64 constant."""
        array = settle(np.asarray(array, dtype=object))
        if not is_symbolic_array(array):
            return self.const(array, name)
        v = Value(self.fresh(name), TensorType(tuple(int(d) for d in array.shape), DType.int64))
        self.sym_values[v] = array
        return v

    def is_known(self, v: Value | None) -> bool:
        """``v`` is a constant, or a deferred one (known at compile time, folded later)."""
        return v is not None and (v in self.deferred or self.value_of(v) is not None)

    def value_of(self, v: Value | None) -> np.ndarray | None:
        """The compile-time value of ``v`` (a constant, or a shape value as an object array of
        ints and ``Sym``), or None when it is only known at run time."""
        if v is None:
            return None
        got = self.constants.get(v)
        return self.sym_values.get(v) if got is None else got

    # ---- nodes ----------------------------------------------------------------------------
    def emit(self, op: OpDef | str, inputs, name: str = "", out_names=None, **attrs) -> list[Value]:
        op = get(op) if isinstance(op, str) else op
        inputs = tuple(inputs)
        attrs = op.normalize_attrs(attrs)
        types = op.infer([None if v is None else v.type for v in inputs], attrs)
        node_name = self.fresh(name or op.name.lower()) if name else self.fresh(op.name.lower())
        if op.kind is Kind.HOST:
            types = self._runtime_dims(types, node_name)
        out_names = out_names or [f"{node_name}_out{k}" if len(types) > 1 else node_name
                                  for k in range(len(types))]
        if any(v in self.sym_values for v in inputs if v is not None):
            return self._fold_symbolic(op, inputs, attrs, out_names, types)
        if any(v in self.deferred for v in inputs if v is not None) and all(
                v is None or v in self.deferred or v in self.constants for v in inputs):
            outs = tuple(Value(self.fresh(n), t) for n, t in zip(out_names, types))
            self.nodes.append(Node(op, inputs, outs, attrs, node_name))
            self.deferred.update(outs)
            return list(outs)
        if self.fold and self._foldable(op, inputs, types):
            arrays = op.reference([self.value_of(v) for v in inputs], attrs)
            return [self.const(a, n, t.dtype) for a, n, t in zip(arrays, out_names, types)]
        outs = tuple(Value(self.fresh(n), t) for n, t in zip(out_names, types))
        self.nodes.append(Node(op, inputs, outs, attrs, node_name))
        return list(outs)

    def _runtime_dims(self, types: list[TensorType], node_name: str) -> list[TensorType]:
        """A host op's data-dependent dims (str names in its shape rule) as fresh symbols that
        the runtime reads off the op's outputs once it has run; kernels after it take them as
        size arguments like the input symbols.

        Before: ``NonZero(x): int64[2, "nonzero_count"]``.
        After: ``int64[2, nonzero_count]`` with ``nonzero_count`` a ``Sym`` in
        ``sym.context().runtime`` (range 0..)."""
        ctx, taken = context(), {s for v in self.inputs for d in v.shape for s in free_symbols(d)}
        out = []
        for k, t in enumerate(types):
            dims = []
            for a, d in enumerate(t.shape):
                if isinstance(d, str):
                    d = ctx.runtime_symbol(d, f"dim {a} of output {k} of host op '{node_name}'",
                                           taken)
                dims.append(d)
            out.append(TensorType(tuple(dims), t.dtype))
        return out

    def _fold_symbolic(self, op, inputs, attrs, out_names, types) -> list[Value]:
        """An op over shape values folds at compile time or raises SymbolicError."""
        runtime = [v for v in inputs if v is not None and self.value_of(v) is None]
        if runtime:  # run-time data reads the shape values: they become tensors
            inputs = tuple(self.materialize(v) for v in inputs)
            return self.emit(op, inputs, out_names=out_names, **attrs)
        try:
            arrays = fold_symbolic(op, [self.value_of(v) for v in inputs], attrs)
        except SymbolicError as e:
            # a size a host op's output tells cannot be bound at compile time: compute with it
            # at run time instead (input symbols are bound by the compiler and compiled again)
            if not e.symbols or not set(e.symbols) <= context().runtime.keys():
                raise
            inputs = tuple(self.materialize(v) for v in inputs)
            return self.emit(op, inputs, out_names=out_names, **attrs)
        return [self.sym_const(a, n) if is_symbolic_array(a) else self.const(a, n, t.dtype)
                for a, n, t in zip(arrays, out_names, types)]

    def materialize(self, v: Value | None) -> Value | None:
        """A shape value as a node computing it at run time (``SymValue``); others as they
        are."""
        if v is None or v not in self.sym_values:
            return v
        arr = self.sym_values[v]
        node = Node(get("SymValue"), (), (v,), {"values": tuple(arr.reshape(-1)),
                                               "shape": tuple(arr.shape)}, self.fresh("symvalue"))
        self.nodes.append(node)
        del self.sym_values[v]
        return v

    def op(self, op: OpDef | str, *inputs, name: str = "", **attrs) -> Value:
        """Emit a single-output op and return its value."""
        outs = self.emit(op, inputs, name=name, **attrs)
        if len(outs) != 1:
            raise ValueError(f"{op} has {len(outs)} outputs; use emit()")
        return outs[0]

    def _foldable(self, op: OpDef, inputs, types) -> bool:
        if not all(v is None or v in self.constants for v in inputs):
            return False
        if any(t.dtype.is_host_value for t in types):  # a sequence is no constant tensor
            return False
        return fold_fits(types, [self.constants.get(v) for v in inputs if v is not None])

    def finish(self, outputs: list[Value], names: list[str] | None = None) -> Graph:
        return Graph(list(self.inputs), list(outputs), list(self.nodes), dict(self.constants),
                     self.name, list(names or []))
