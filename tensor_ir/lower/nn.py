"""Lowerings: nn ops."""
