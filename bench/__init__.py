"""Benchmarks and real-model builders (not tests). See docs/models.md."""
