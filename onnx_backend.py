"""``onnx.backend.base.Backend`` implementation, so ONNX's own test runner (and any tool written
against that interface) drives deploy unchanged.

``prepare`` checks the model and returns a rep that compiles on first ``run`` with the shapes of the
inputs it is given (a JIT, as the backend interface expects). Inputs that the model uses as
shape-like operands (Reshape's shape, Slice's starts ...) are specialized to their values: the
compiled artifact is cached per (input shapes, dtypes, values of those inputs).
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep

from .errors import DeployError, ModelError, UnsupportedOpsError


class DeployRep(BackendRep):
    def __init__(self, model: onnx.ModelProto, target: str = "host", **options):
        self.model = model
        self.target = target
        self.options = options
        self._cache: dict = {}
        self._const_names: set[str] = set()

    def run(self, inputs, **kwargs):
        feed = self._feed(inputs)
        module, const_names = self._compiled(feed)
        outs = module.run({k: v for k, v in feed.items() if k not in const_names})
        return tuple(outs)

    def compile(self, inputs):
        """Compile (or fetch from the cache) the module that ``run(inputs)`` would use, without
        running it: lets callers tell compile failures from run failures."""
        return self._compiled(self._feed(inputs))[0]

    def _feed(self, inputs) -> dict:
        pairs = inputs.items() if isinstance(inputs, dict) else zip(self._input_names(), inputs)
        held = self._held_names()
        return {name: v if name in held else _tensor(name, v) for name, v in pairs}

    def _held_names(self) -> set[str]:
        """Sequence- and optional-typed inputs: passed as they are (a list, None or a value),
        never specialized (host ops read them)."""
        return {i.name for i in self.model.graph.input
                if i.type.WhichOneof("value") in ("sequence_type", "optional_type")}

    def _input_names(self) -> list[str]:
        inits = {t.name for t in self.model.graph.initializer}
        return [i.name for i in self.model.graph.input if i.name not in inits]

    def _key(self, feed):
        parts, held = [], self._held_names()
        for k, v in sorted(feed.items()):
            if k in held:
                continue
            val = v.tobytes() if k in self._const_names else b""
            parts.append((k, v.shape, str(v.dtype), val))
        return tuple(parts)

    def _compiled(self, feed):
        key = self._key(feed)
        if key not in self._cache:
            self._cache[key] = self._compile(feed)
        return self._cache[key]

    def _compile(self, feed):
        from .compiler import compile as deploy_compile
        from .frontends.onnx import NeedsConstant
        held, on_host = self._held_names(), False
        for _ in range(len(feed) + 2):
            consts = {k: feed[k] for k in self._const_names}
            shapes = {k: v.shape for k, v in feed.items() if k not in consts and k not in held}
            try:
                # (no constant_inputs: operands known only at run time run on the host)
                art = deploy_compile(self.model, target=self.target, shapes=shapes,
                                     constant_inputs=None if on_host else consts, **self.options)
                return _load(art), set(consts)
            except NeedsConstant as e:
                wanted = {v.name for v in getattr(e, "inputs", ())} | {e.value.name}
                wanted = {n for n in wanted if n in feed} - self._const_names - held
                if not wanted and not consts and not on_host:
                    on_host = True  # computed from a sequence or optional input: no values
                    continue
                if not wanted:
                    raise DeployError(str(e)) from None
                self._const_names |= wanted
        raise DeployError("could not specialize the model's shape inputs")


def _tensor(name: str, value) -> np.ndarray:
    if isinstance(value, (list, tuple)) or value is None:
        raise ModelError(f"input '{name}' is given a {type(value).__name__}, a sequence or "
                         "optional value; only tensor inputs are supported (sequences and "
                         "optionals exist only inside the model)")
    return np.asarray(value)


def _load(art):
    """Load a compiled artifact without leaving its file behind (the runtime reads it whole)."""
    import tempfile
    from pathlib import Path

    from .runtime import load
    with tempfile.TemporaryDirectory(prefix="deploy-jit-") as tmp:
        return load(art.save(Path(tmp) / "model.dpk"))


class DeployBackend(Backend):
    @classmethod
    def is_compatible(cls, model, device="CPU", **kwargs):
        from .frontends.onnx import unsupported_nodes
        return not unsupported_nodes(model)

    @classmethod
    def prepare(cls, model, device="CPU", **kwargs):
        from .frontends.onnx import unsupported_nodes
        super().prepare(model, device, **kwargs)
        missing = unsupported_nodes(model)
        if missing:
            raise UnsupportedOpsError(missing)
        return DeployRep(model, **kwargs)

    @classmethod
    def run_model(cls, model, inputs, device="CPU", **kwargs):
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node, inputs, device="CPU", outputs_info=None, **kwargs):
        raise NotImplementedError("deploy compiles whole models; use run_model")

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device == "CPU"


prepare = DeployBackend.prepare
run_model = DeployBackend.run_model
supports_device = DeployBackend.supports_device
