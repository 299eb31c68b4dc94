"""PyTorch frontend: ``torch.export`` programs (and ``torch.compile``) -> graph IR.

    from deploy.frontends.torch import import_torch, list_ops
    graph, report = import_torch(exported_program)            # or a .pt2 path
    graph, report = import_torch(module, example_inputs=(x,), dynamic_shapes={"x": {0: batch}})

Importing this package registers the conversion table; the ``torch.compile`` backend
``"deploy"`` lives in ``deploy.torch_backend`` (it drives the whole compiler). torch is imported only here: ``import deploy`` never needs it.
"""
from . import (  # noqa: F401  (imports register the converters)
    convert_elementwise,
    convert_misc,
    convert_movement,
    convert_nn,
    convert_quant,
    convert_reduction,
)
from .importer import (
    KEEP,
    UnsupportedAtenOpsError,
    decompose,
    import_torch,
    list_ops,
    load_program,
    unsupported_ops,
)
from .registry import ATEN, TorchCtx, aten, missing_core_ops, op_name


def supported_aten_ops() -> list[str]:
    """Names of the ATen overloads the table converts with the core ops available now."""
    return sorted({op_name(t) for t, e in ATEN.items()
                   if hasattr(t, "_schema") and not missing_core_ops(e)})


__all__ = ["ATEN", "KEEP", "TorchCtx", "UnsupportedAtenOpsError", "aten", "decompose",
           "import_torch", "list_ops", "load_program", "register",
           "supported_aten_ops", "unsupported_ops"]
