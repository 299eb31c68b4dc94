"""Targets: YAML hardware descriptions validated into one frozen ``Target``."""
from .target import Target, list_targets, load_target

__all__ = ["Target", "list_targets", "load_target"]
