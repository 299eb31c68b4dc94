"""``torch.compile(model, backend="deploy")``: compile each captured FX graph with deploy.

A driver of the whole compiler (like ``onnx_backend.py``), so it sits at the package top level.
Importing it (or installing the package, through the ``torch_dynamo_backends`` entry point)
registers the backend.

Dynamo hands the backend one FX graph per captured region with example inputs. The graph is
re-exported to ATen with ``torch.export`` and compiled for the host:

- With dynamic shapes (``dynamic=True``, or dynamo's automatic dynamic shapes after a size
  changed) the tensor inputs carry symbolic dims and the graph takes those sizes as extra
  ``SymInt`` arguments. The sizes are read off the tensors instead, each symbolic dim becomes a
  ``torch.export.Dim``, and deploy compiles ONE symbolic artifact that runs at every size.
- Otherwise (or when the symbolic export or compile fails, or the artifact refuses a size) the
  shapes are specialized to the inputs; another input signature compiles again (cached).

A graph that deploy cannot compile (unsupported ATen ops, symbolic-int arguments that are not
sizes of tensor inputs) runs eagerly, and one log line says why, naming the ops.
"""
from __future__ import annotations

import logging

import numpy as np
import torch

from .errors import DeployError, InputError, UnsupportedOpsError

log = logging.getLogger("deploy.torch")


def _signature(tensors) -> tuple:
    return tuple((tuple(a.shape), a.dtype) for a in tensors)


class _Number(float):
    """A module's float attribute that dynamo passed as a 0-d tensor (``dynamic=True`` leaves
    floats unspecialized): the graph calls ``.item()`` on it, and gets the value back."""

    def item(self) -> float:
        return float(self)


class _FromTensors(torch.nn.Module):
    """The captured graph called with tensors only. ``layout``: per graph input, ``("in", k)``
    for tensor k, ``("size", k, d)`` for dim d of tensor k (a size argument, read off the
    tensor it measures), ``("const", value)`` for a module attribute fixed at its value."""

    def __init__(self, gm: torch.fx.GraphModule, layout):
        super().__init__()
        self.gm, self.layout = gm, layout

    def forward(self, *tensors):
        return self.gm(*(tensors[e[1]] if e[0] == "in" else tensors[e[1]].shape[e[2]]
                         if e[0] == "size" else e[1] for e in self.layout))


def _is_attribute(source) -> bool:
    """A source that reads a module attribute (``self.ln.eps``), not a forward() argument."""
    while source is not None:
        if "Attr" in type(source).__name__ or "NNModule" in type(source).__name__:
            return True
        source = getattr(source, "base", None)
    return False


def _layout(gm, example_inputs):
    """(layout, tensor examples, dynamic_shapes) for a graph whose non-tensor inputs are all
    sizes of its tensor inputs (or module attributes); None and the reason otherwise."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    tensors, fakes, layout = [], [], []
    for node, x in zip(placeholders, example_inputs):
        arg = node.meta.get("grapharg")
        if isinstance(x, torch.Tensor) and getattr(arg, "pass_arg_as_tensor", False):
            # a Python number dynamo wrapped in a tensor: a module attribute is fixed at its
            # value; an argument of forward() varies per call and runs eagerly
            if not _is_attribute(arg.source) or x.numel() != 1 or \
                    any(u.op != "call_method" or u.target != "item" for u in node.users):
                return None, f"the number argument {node.name} varies per call"
            layout.append(("const", _Number(x.item()) if x.is_floating_point() else x.item()))
        elif isinstance(x, torch.Tensor):
            layout.append(("in", len(tensors)))
            tensors.append(x)
            fake = node.meta.get("example_value")
            fakes.append(fake if isinstance(fake, torch.Tensor) else x)
        else:
            layout.append(("size", x))
    where = {}  # sympy symbol -> (tensor, dim) where it is a whole dim
    for k, fake in enumerate(fakes):
        for d, size in enumerate(fake.shape):
            if isinstance(size, torch.SymInt) and size.node.expr.is_Symbol:
                where.setdefault(size.node.expr, (k, d))
    for i, entry in enumerate(layout):
        if entry[0] != "size":
            continue
        x = entry[1]
        if not (isinstance(x, torch.SymInt) and x.node.expr in where):
            return None, (f"the {type(x).__name__} argument {placeholders[i].name} is not a size "
                          "of a tensor input")
        layout[i] = ("size", *where[x.node.expr])
    return (layout, tensors, _dims(fakes)), None


def _dims(fakes) -> tuple:
    """A ``torch.export`` dynamic_shapes spec: one ``Dim`` per symbol (named after it, shared
    where the same symbol recurs), ``Dim.AUTO`` for a dim that is an expression."""
    from .frontends.torch.symbolic import bound_of
    made = {}
    specs = []
    for fake in fakes:
        spec = {}
        for d, size in enumerate(fake.shape):
            if not isinstance(size, torch.SymInt):
                continue
            expr = size.node.expr
            if expr.is_Symbol:
                if expr not in made:
                    vr = size.node.shape_env.var_to_range.get(expr)
                    hi = bound_of(vr.upper) if vr is not None else None
                    made[expr] = torch.export.Dim(str(expr), max=hi) if hi else \
                        torch.export.Dim(str(expr))
                spec[d] = made[expr]
            elif not expr.is_Integer:
                spec[d] = torch.export.Dim.AUTO
        specs.append(spec or None)
    return tuple(specs)


class DeployCompiled:
    """The callable returned to dynamo: runs a deploy artifact. With dynamic shapes one symbolic
    artifact serves every size (``self.symbolic``); otherwise one artifact per input signature
    (``self.cache``)."""

    def __init__(self, gm: torch.fx.GraphModule, target: str, options: dict, layout=None):
        self.gm, self.target, self.options = gm, target, options
        self.layout = layout  # None: the graph's inputs are its tensors, as they come
        self.cache: dict[tuple, object] = {}
        self.symbolic = None

    def _module(self):
        return self.gm if self.layout is None else _FromTensors(self.gm, self.layout)

    def compile_for(self, tensors, dynamic_shapes=None):
        from .compiler import compile as deploy_compile
        spec = None if dynamic_shapes is None else (dynamic_shapes,)  # forward(*tensors)
        # a fresh tracing context: inside dynamo's, the export's symbols would leak into the
        # guards of the frame being compiled
        with torch._guards.tracing(None):
            ep = torch.export.export(self._module(), tuple(tensors), dynamic_shapes=spec,
                                     strict=False)
        art = deploy_compile(ep, target=self.target, **self.options)
        out_node = next(n for n in ep.graph.nodes if n.op == "output")
        dtypes = [getattr(n.meta.get("val"), "dtype", None) if isinstance(n, torch.fx.Node)
                  else None for n in out_node.args[0]]
        return art.load(), ep.call_spec.out_spec, dtypes

    def __call__(self, *args):
        tensors = args if self.layout is None else \
            [a for a, e in zip(args, self.layout) if e[0] == "in"]
        arrays = [_to_numpy(a) for a in tensors]
        entry = self.cache.get(_signature(tensors))
        if entry is None and self.symbolic is not None:
            try:
                return self._run(self.symbolic, arrays)
            except InputError as e:  # a size the symbolic artifact refuses: specialize
                log.info("deploy: symbolic artifact refused these sizes (%s); compiling them "
                         "as fixed shapes", str(e).splitlines()[0])
        if entry is None:
            entry = self.cache[_signature(tensors)] = self.compile_for(tensors)
        return self._run(entry, arrays)

    @staticmethod
    def _run(entry, arrays):
        mod, out_spec, dtypes = entry
        outs = mod.run(arrays)
        tensors = [_to_torch(o, dt) for o, dt in zip(outs, dtypes)]
        return torch.utils._pytree.tree_unflatten(tensors, out_spec)


def _to_numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


def _to_torch(a: np.ndarray, dtype) -> torch.Tensor:
    t = torch.from_numpy(np.ascontiguousarray(a))
    return t.view(torch.bfloat16) if dtype == torch.bfloat16 else t


def _is_dynamic(gm, example_inputs) -> bool:
    """Symbolic dims or size arguments, or numbers dynamo passes as tensors (dynamic=True)."""
    if any(not isinstance(x, torch.Tensor) for x in example_inputs):
        return True
    for n in gm.graph.nodes:
        if n.op != "placeholder":
            continue
        fake = n.meta.get("example_value")
        if isinstance(fake, torch.Tensor) and any(isinstance(d, torch.SymInt)
                                                  for d in fake.shape):
            return True
        if getattr(n.meta.get("grapharg"), "pass_arg_as_tensor", False):
            return True
    return False


def deploy_backend(gm: torch.fx.GraphModule, example_inputs, target: str = "host", **options):
    """Dynamo backend: a deploy-compiled callable, or ``gm.forward`` (eager) with one log line
    when the graph cannot be compiled."""
    if _is_dynamic(gm, example_inputs):
        return _dynamic_backend(gm, example_inputs, target, options)
    compiled = DeployCompiled(gm, target, options)
    try:
        compiled.cache[_signature(example_inputs)] = compiled.compile_for(example_inputs)
    except Exception as e:  # noqa: BLE001  (see _eager)
        return _eager(gm, e)
    return compiled


def _dynamic_backend(gm, example_inputs, target, options):
    """Symbolic dims: one symbolic artifact (sizes read off the tensors); a fixed-shape one
    where the symbolic export or compile fails for a reason other than unsupported ops."""
    found, why = _layout(gm, example_inputs)
    if found is None:
        log.warning("deploy: graph with %d node(s) runs eagerly: %s (symbolic number "
                    "arguments are not compiled yet)", len(gm.graph.nodes), why)
        return gm.forward
    layout, tensors, dynamic_shapes = found
    compiled = DeployCompiled(gm, target, options, layout)
    try:
        compiled.symbolic = compiled.compile_for(tensors, dynamic_shapes)
        return compiled
    except UnsupportedOpsError as e:
        return _eager(gm, e)
    except Exception as e:  # noqa: BLE001  (torch.export may refuse the dynamic dims)
        log.info("deploy: symbolic compile failed (%s: %s); compiling fixed shapes per input "
                 "signature", type(e).__name__, str(e).splitlines()[0] if str(e) else "")
    try:
        compiled.cache[_signature(tensors)] = compiled.compile_for(tensors)
    except Exception as e:  # noqa: BLE001
        return _eager(gm, e)
    return compiled


def _eager(gm, e: Exception):
    """``gm.forward``, with one warning saying why deploy does not run this graph."""
    if isinstance(e, UnsupportedOpsError):
        log.warning("deploy: graph runs eagerly; unsupported: %s", _one_line(e))
    elif isinstance(e, DeployError):
        log.warning("deploy: graph runs eagerly: %s", str(e).splitlines()[0])
    else:  # torch.export may refuse a dynamo graph
        log.warning("deploy: graph runs eagerly: torch.export failed (%s: %s)", type(e).__name__,
                    str(e).splitlines()[0] if str(e) else "")
    return gm.forward


def _one_line(e: UnsupportedOpsError) -> str:
    rows = getattr(e, "rows", None)
    if rows:
        return ", ".join(f"{op} x{len(nodes)}" + (f" ({why})" if why != "no converter" else "")
                         for op, nodes, why in rows)
    return ", ".join(f"{op} ({name})" for name, op, _, _ in e.missing)


def register() -> None:
    """Make ``backend="deploy"`` known to torch.compile (idempotent)."""
    from importlib.metadata import EntryPoint

    from torch._dynamo.backends.registry import _BACKENDS, _COMPILER_FNS, register_backend
    # an installed `torch_dynamo_backends` entry point that torch already discovered is loaded
    # (and registered) by torch itself; registering here too would be a duplicate
    if "deploy" in _COMPILER_FNS or isinstance(_BACKENDS.get("deploy"), EntryPoint):
        return
    register_backend(deploy_backend, name="deploy")


register()
