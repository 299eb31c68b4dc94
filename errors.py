"""Every failure a user can cause raises a DeployError subclass with a precise message.

The CLI prints ``str(error)`` (one paragraph) and exits non-zero; no traceback unless --debug.
This module imports nothing from the compiler so that the runtime may use it too.
"""
from __future__ import annotations


class DeployError(Exception):
    """Base of every error deploy raises on purpose."""

    exit_code = 1


class ModelError(DeployError):
    """The model file is malformed, unreadable or inconsistent."""


class UnsupportedOpsError(DeployError):
    """One or more ops cannot be compiled; all of them are listed at once."""

    def __init__(self, missing: list[tuple[str, str, int | None, str]], source: str = "model"):
        self.missing = missing  # (node name, op type, opset, reason)
        lines = [f"{source}: {len(missing)} unsupported op(s):"]
        for name, op, opset, why in missing:
            where = f"opset {opset}" if opset is not None else "no opset"
            lines.append(f"  - node '{name}': {op} ({where}){': ' + why if why else ''}")
        super().__init__("\n".join(lines))


class TargetError(DeployError):
    """A target name is unknown or a target YAML file is malformed."""


class InputError(DeployError):
    """Inputs given to a loaded module do not match its input specs."""


class ArtifactError(DeployError):
    """An artifact file is missing, corrupt, or from an incompatible format version."""


class ResourceLimitError(DeployError):
    """A model needs more than a limit allows (``--max-memory``): refused at compile time."""


class UsageError(DeployError):
    """A command-line argument is malformed (e.g. ``--shape x=1x3y``)."""

    exit_code = 2


class NotImplementedYetError(DeployError):
    """A documented option or backend that deploy does not implement yet (e.g. ``--tune quick``)."""

    exit_code = 4


class CompileError(DeployError):
    """A toolchain (C compiler, Triton) failed on generated code: a deploy bug, reported with the log."""

    exit_code = 3
