"""The backend interface: what the compiler asks of a code generator, and the registry.

A backend turns the lowered model (``tensor_ir.plan.Plan``: kernels in step order, constants)
into artifact members. The compiler never branches on a backend's name: it asks the registered
``Backend`` object for what differs (tuning, building, which precision modes and element types it
has, how the ``--dtype`` error check runs). The runtime loader follows from what a backend
writes: a ``library`` (C shared library, ``runtime/module.py``) or a ``gpu`` launch plan
(``runtime/gpu.py``). Adding a backend is adding a folder with a ``Backend`` subclass and one
``register`` line below (docs/adding-a-backend.md).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from ..errors import NotImplementedYetError
from ..targets.target import BACKENDS


@dataclass
class Built:
    """What ``Backend.build`` returns: artifact members, per-kernel manifest rows, and keys the
    manifest gets (``gpu`` launch plan, ``binaries``, ``library``/``entry``)."""
    members: dict[str, bytes]
    kernels: list[dict]
    manifest: dict = field(default_factory=dict)


class Backend:
    """One code generator. Subclasses set the class attributes and implement ``tune`` and
    ``build``; the hooks default to doing nothing."""

    name: ClassVar[str]
    kind: ClassVar[str]  # the target kind it generates for: "cpu" or "gpu"
    symbolic: ClassVar[bool] = True  # kernels take symbolic sizes as arguments
    tf32: ClassVar[bool] = False  # has a TF32 mode for fp32 GEMMs (precision="tf32")
    runs_here: ClassVar[bool] = True  # artifacts run on the compiling machine (--dtype check)

    def __init__(self, target, options: dict | None = None) -> None:
        self.target = target
        self.options = dict(options or {})

    def begin(self, graph) -> None:
        """The imported graph is known: start what the build will need while the passes run
        (GPU: compile worker processes). ``end`` follows the compile, failed or not."""

    def end(self) -> None:
        """Stop what ``begin`` started and the build did not use."""

    def check_graph(self, graph) -> None:
        """Refuse, all at once, what this backend cannot compile in the optimized graph."""

    def prepare(self, plan) -> None:
        """Rewrite the plan before tuning and building (e.g. weight layouts)."""

    def features(self) -> dict:
        """The tuning database key's features for this backend and its options."""
        return self.target.features()

    def tune(self, plan, level: str, db, budget_s: float, log=print):
        """Measure candidates of ``plan``'s kernels, add the best to ``db``; returns a report
        with ``gain()``."""
        raise NotImplementedYetError(f"the {self.name} backend has no tuner")

    def tuning_job(self, plan, level: str, db):
        """The tuning as per-kernel searches that workers can run (backends/distributed/job.py:
        ``deploy tune --ray``); None where this backend tunes on this machine only."""

    def build(self, plan, dump: Path | None, db) -> Built:
        raise NotImplementedError


# name -> "module:Class", imported on first use (a GPU backend imports triton or NVRTC)
REGISTRY: dict[str, str] = {
    "c": "deploy.backends.c.backend:CBackend",
    "triton": "deploy.backends.triton.backend:TritonBackend",
    "cuda": "deploy.backends.cuda.backend:CudaBackend",
    "auto": "deploy.backends.gpu_auto:AutoGpuBackend",
}


def register(name: str, where: str, kind: str) -> None:
    """Make backend ``name`` available to targets of ``kind`` ("cpu" or "gpu"): ``where`` is
    ``"package.module:ClassName"``, imported when a compile first asks for it."""
    REGISTRY[name] = where
    BACKENDS.setdefault(kind, set()).add(name)  # target files may now name it


def backend_class(name: str) -> type[Backend]:
    where = REGISTRY.get(name)
    if where is None:
        raise NotImplementedYetError(
            f"no backend named {name!r}; registered: {', '.join(sorted(REGISTRY))}")
    module, _, cls = where.partition(":")
    try:
        return getattr(importlib.import_module(module), cls)
    except ModuleNotFoundError as e:
        if e.name and e.name.startswith("deploy"):
            raise NotImplementedYetError(f"the {name} backend is not implemented yet") from None
        raise


def get_backend(target, options: dict | None = None) -> Backend:
    """The backend compiling for ``target``: its ``backend``, or on GPU targets the
    ``gpu_codegen`` option (triton | cuda | auto) where the target lists it."""
    name = target.backend
    codegen = (options or {}).get("gpu_codegen")
    if codegen:
        if target.kind != "gpu":
            raise NotImplementedYetError(
                f"--gpu-codegen {codegen}: target {target.name} is a CPU target (backend c)")
        allowed = (*target.backends, "auto")
        if codegen not in allowed:
            raise NotImplementedYetError(
                f"--gpu-codegen {codegen}: target {target.name} generates "
                f"{' or '.join(target.backends)} code (its `backends`); expected one of "
                f"{', '.join(allowed)}")
        name = codegen
    cls = backend_class(name)
    if cls.kind != target.kind:
        raise NotImplementedYetError(f"target {target.name} is a {target.kind} target but the "
                                     f"{name} backend generates {cls.kind} code")
    return cls(target, options)
