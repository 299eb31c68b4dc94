"""The ``OnnxNode`` host op: one ONNX node evaluated at run time by ONNX's reference evaluator.

The compiler emits it only where a node's converter needs an operand that is known only at run
time (ReduceSum's axes, Reshape's shape, TopK's K ...): the output shape then depends on data, so
no kernel can be generated for it. The node travels as a one-node ONNX model (base64 of its
protobuf bytes); it is parsed with onnx's protobuf parser only. ``onnx`` is imported on the first
call, so artifacts without such a node never need it.
"""
from __future__ import annotations

import base64
import functools
import threading

import numpy as np

from ..errors import ArtifactError, InputError
from .dtypes import is_raw, storage_dtype


def run_onnx_node(ins: list, attrs: dict) -> list[np.ndarray]:
    """Evaluate the node on ``ins`` (the one-node model's inputs, in order; None: omitted)."""
    evaluator, lock, in_types, out_types = _evaluator(attrs["model"])
    feeds = {name: _as(x, t) for name, x, t in zip(evaluator.input_names, ins, in_types)
             if x is not None}
    try:
        with lock:
            outs = evaluator.run(None, feeds)
    except Exception as e:  # noqa: BLE001  (the reference evaluator raises many types)
        raise InputError(f"host op OnnxNode ({attrs.get('op_type')}) failed on these inputs: "
                         f"{type(e).__name__}: {e}") from None
    outs = [_stored(np.asarray(o, dtype=t)) if t is not None else hold(o)
            for o, t in zip(outs, out_types)]
    _check_shapes(outs, ins, attrs)
    return outs


def hold(value) -> np.ndarray:
    """A sequence (list of arrays) or optional (None, or its value) as the runtime holds it:
    a 0-d object array."""
    out = np.empty((), dtype=object)
    out.fill(value)  # (item assignment would read a list as an array's rows)
    return out


def _as(x: np.ndarray, dtype: np.dtype | None):
    """Raw bits (bfloat16 as uint16, float8 and 4-bit types as uint8) as the type they hold; a
    held sequence or optional (``dtype`` None) as itself."""
    if dtype is None:
        return x[()]
    return x.view(dtype) if x.dtype != dtype and is_raw(dtype.name) else x


def _stored(x: np.ndarray) -> np.ndarray:
    """ml_dtypes' narrow types as the runtime stores them: their bits."""
    return x.view(storage_dtype(x.dtype.name)) if is_raw(x.dtype.name) else x


@functools.lru_cache(maxsize=256)
def _evaluator(encoded: str):
    """The evaluator of one serialized node (cached: a step's attrs hold the same string)."""
    try:
        import onnx
        from onnx.reference import ReferenceEvaluator
    except ImportError:
        raise ArtifactError("this artifact runs an ONNX node on the host (OnnxNode: an operand "
                            "known only at run time) and needs the onnx package: pip install "
                            "onnx") from None
    model = onnx.ModelProto()
    model.ParseFromString(base64.b64decode(encoded))
    types = [[onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
              if vi.type.HasField("tensor_type") else None for vi in vis]  # None: held values
             for vis in (model.graph.input, model.graph.output)]
    return ReferenceEvaluator(model, new_ops=_fixed_ops()), threading.Lock(), *types


@functools.lru_cache(maxsize=1)
def _fixed_ops() -> list:
    """Corrections to ONNX's reference evaluator (onnx 1.23):

    - ``Optional`` wraps a present value in a list (``[x]``) while every other op
      (OptionalHasElement, OptionalGetElement, the backend tests' expected outputs) holds an
      optional as None or the value itself;
    - ``Loop`` stacks scan outputs with ``np.vstack``: N scalars come out [N, 1] and N [a, b]
      matrices [N*a, b] instead of [N] and [N, a, b] (the same elements in the same order, so
      a reshape to [N, *element shape] corrects it); an omitted condition stops it before
      the first iteration instead of counting as true; and a loop that runs no iteration (a
      trip count of 0, a false condition) fails stacking no scan values, where ONNX Runtime
      returns the initial values and empty scan outputs, [0, *element shape] (the body's
      declared shape, unknown sizes 0).
    """
    from onnx.reference import op_run, ops  # (ops imports every op module: op_loop too)

    class Optional(op_run.OpRun):
        op_domain = ""

        def _run(self, x=None, type=None):  # (``type``: the ONNX attribute's name)
            return (x,)

    class Loop(ops.op_loop.Loop):
        op_domain = ""

        def _run(self, M, cond, *args, **kwargs):
            if cond is None:  # an omitted condition is true
                cond = np.array(True)
            if not bool(cond) or M is not None and int(M) <= 0:
                return tuple(list(args[:self.N]) + [self._no_scans(k) for k in range(self.K)])
            shapes, body = [], self._run_body  # (set per instance: the body's evaluator)

            def recording(inputs, **kw):
                outs = body(inputs, **kw)
                shapes.append([np.shape(o) for o in outs[len(outs) - self.K:]])
                return outs

            self._run_body = recording
            try:
                res = list(super()._run(M, cond, *args, **kwargs))
            finally:
                self._run_body = body
            for k in range(self.K if shapes else 0):
                res[self.N + k] = np.asarray(res[self.N + k]).reshape((len(shapes),
                                                                        *shapes[0][k]))
            return tuple(res)

        def _no_scans(self, k: int) -> np.ndarray:
            """Scan output ``k`` of a loop that ran no iteration."""
            import onnx
            body = next(a.g for a in self.onnx_node.attribute if a.name == "body")
            tt = body.output[1 + self.N + k].type.tensor_type
            dims = [d.dim_value if d.HasField("dim_value") else 0 for d in tt.shape.dim] \
                if tt.HasField("shape") else []
            return np.empty((0, *dims), onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type))

    return [Optional, Loop]


def _check_shapes(outs: list, ins: list, attrs: dict) -> None:
    """Kernels after the node were compiled for the sizes the compiler inferred; a different
    size must stop here, not overrun their buffers."""
    for k, (out, dims) in enumerate(zip(outs, attrs["out_dims"])):
        want = [ins[d[0]].shape[d[1]] if isinstance(d, (list, tuple)) else d for d in dims]
        ok = len(want) == out.ndim and all(isinstance(w, str) or w == n
                                           for w, n in zip(want, out.shape))
        if not ok:
            raise InputError(f"host op OnnxNode ({attrs.get('op_type')}): output {k} has shape "
                             f"{list(out.shape)}, but the artifact was compiled for {want}")
