"""ONNX converters: everything else (control flow, quantization, host ops)."""
