"""Lowerings: reduction ops."""
