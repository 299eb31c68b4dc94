"""``torch.compile(model, backend="deploy")``: compile each captured FX graph with deploy.

A driver of the whole compiler (like ``onnx_backend.py``), so it sits at the package top level.
Importing it (or installing the package, through the ``torch_dynamo_backends`` entry point)
registers the backend.

Dynamo hands the backend one FX graph per captured region with example inputs. The graph is
re-exported to ATen with ``torch.export`` and compiled for the host (shapes specialized to the
example inputs; a call with other shapes compiles again, cached per input signature). A graph that
deploy cannot compile (unsupported ATen ops, symbolic-int inputs) runs eagerly, and one log line
says why, naming the ops.
"""
from __future__ import annotations

import logging

import numpy as np
import torch

from .errors import DeployError, UnsupportedOpsError

log = logging.getLogger("deploy.torch")


def _signature(args) -> tuple:
    return tuple((tuple(a.shape), a.dtype) for a in args)


class DeployCompiled:
    """The callable returned to dynamo: runs the deploy artifact, recompiling per signature."""

    def __init__(self, gm: torch.fx.GraphModule, target: str, options: dict):
        self.gm, self.target, self.options = gm, target, options
        self.cache: dict[tuple, object] = {}

    def compile_for(self, args):
        from .compiler import compile as deploy_compile
        ep = torch.export.export(self.gm, tuple(args), strict=False)
        art = deploy_compile(ep, target=self.target, **self.options)
        out_node = next(n for n in ep.graph.nodes if n.op == "output")
        dtypes = [getattr(n.meta.get("val"), "dtype", None) if isinstance(n, torch.fx.Node)
                  else None for n in out_node.args[0]]
        return art.load(), ep.call_spec.out_spec, dtypes

    def __call__(self, *args):
        key = _signature(args)
        entry = self.cache.get(key)
        if entry is None:
            entry = self.cache[key] = self.compile_for(args)
        mod, out_spec, dtypes = entry
        outs = mod.run([_to_numpy(a) for a in args])
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


def deploy_backend(gm: torch.fx.GraphModule, example_inputs, target: str = "host", **options):
    """Dynamo backend: a deploy-compiled callable, or ``gm.forward`` (eager) with one log line
    when the graph cannot be compiled."""
    if not all(isinstance(x, torch.Tensor) for x in example_inputs):
        kinds = sorted({type(x).__name__ for x in example_inputs
                        if not isinstance(x, torch.Tensor)})
        log.warning("deploy: graph with %d node(s) runs eagerly: symbolic %s inputs (dynamic "
                    "shapes) are not compiled yet", len(gm.graph.nodes), "/".join(kinds))
        return gm.forward
    compiled = DeployCompiled(gm, target, options)
    try:
        compiled.cache[_signature(example_inputs)] = compiled.compile_for(example_inputs)
    except UnsupportedOpsError as e:
        log.warning("deploy: graph runs eagerly; unsupported: %s", _one_line(e))
        return gm.forward
    except DeployError as e:
        log.warning("deploy: graph runs eagerly: %s", str(e).splitlines()[0])
        return gm.forward
    except Exception as e:  # noqa: BLE001  (torch.export may refuse a dynamo graph)
        log.warning("deploy: graph runs eagerly: torch.export failed (%s: %s)", type(e).__name__,
                    str(e).splitlines()[0] if str(e) else "")
        return gm.forward
    return compiled


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
