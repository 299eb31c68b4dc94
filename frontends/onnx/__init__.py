"""ONNX frontend: importer and the per-family conversion tables."""
from . import (  # noqa: F401  (imports register the converters)
    convert_attention,
    convert_control,
    convert_elementwise,
    convert_loss,
    convert_misc,
    convert_ml,
    convert_movement,
    convert_nn,
    convert_quant,
    convert_reduction,
    convert_rnn,
    convert_sampling,
    convert_sequence,
    convert_signal,
    convert_strings,
    convert_tfidf,
    convert_training,
    convert_trees,
)
from .importer import import_onnx, list_ops, load_model, unsupported_nodes
from .registry import CONVERTERS, NeedsConstant, OnnxCtx, converter

__all__ = ["CONVERTERS", "NeedsConstant", "OnnxCtx", "converter", "import_onnx", "list_ops",
           "load_model", "unsupported_nodes"]
