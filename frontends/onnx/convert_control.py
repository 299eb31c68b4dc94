"""ONNX converters: control ops."""
