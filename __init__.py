"""deploy: a cross-hardware deployment compiler.

    import deploy
    art = deploy.compile("model.onnx", target="host")
    art.save("model.dpk")
    mod = deploy.load("model.dpk")
    outs = mod.run({"input": x})
"""
from __future__ import annotations

__version__ = "0.1.0"

from .errors import (
    ArtifactError,
    CompileError,
    DeployError,
    InputError,
    ModelError,
    ResourceLimitError,
    TargetError,
    UnsupportedOpsError,
)
from .runtime import Module, load


def compile(model, target="host", **options):
    """Compile a model (path to .onnx/.pt2, onnx.ModelProto, ExportedProgram) for ``target``.

    A torch ``nn.Module`` is exported for you: ``deploy.compile(module, example_inputs=(x,),
    dynamic_shapes={"x": {0: torch.export.Dim("batch")}})``."""
    from .compiler import compile as _compile
    return _compile(model, target=target, **options)


__all__ = [
    "ArtifactError",
    "CompileError",
    "DeployError",
    "InputError",
    "ModelError",
    "Module",
    "ResourceLimitError",
    "TargetError",
    "UnsupportedOpsError",
    "__version__",
    "compile",
    "load",
]
