"""ONNX converters: quant ops."""
