"""The lowered model: an ordered list of steps (kernels, views, host ops) over numbered values.

A ``Plan`` is what the compiler hands a backend: every value has an id, constants hold their
arrays, kernels are tensor-IR ``Kernel`` objects in step order. Backends may add values (packed
or transposed weights) through ``new_value``; the manifest is written from the plan afterwards.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Plan:
    ids: dict  # graph Value -> value id
    steps: list[dict]
    kernels: list  # tensor_ir Kernel objects, in step order
    constants: dict[int, np.ndarray]
    host_ops: list[str]
    extra_values: dict = field(default_factory=dict)  # value id -> Buffer made by the backend
    symbols: list[str] = field(default_factory=list)  # symbolic sizes, in kernels' dims order
    packed: dict = field(default_factory=dict)  # (weight id, nr) -> packed weight id
    output_ids: list[int] = field(default_factory=list)

    def kernel_steps(self) -> list[dict]:
        return [s for s in self.steps if s["kind"] == "kernel"]

    def next_id(self) -> int:
        """The next free value id (after graph values and values backends made)."""
        return max([*self.ids.values(), *self.extra_values, -1]) + 1

    def dims_slot(self) -> int:
        """The pointer-table slot of the symbolic sizes' int64 array: after every value id."""
        return self.next_id()

    def new_constant(self, array: np.ndarray, buffer) -> int:
        """A constant made by a backend (a re-laid-out weight): its new value id."""
        vid = self.next_id()
        self.constants[vid] = array
        self.extra_values[vid] = buffer
        return vid

    def kernel_constants(self) -> dict[str, dict]:
        """Kernel name -> {input buffer name: constant value} (attention templates read their
        masks' values to skip causally masked blocks)."""
        return {k.name: {b.name: self.constants[v] for b, v in zip(k.inputs, s["inputs"])
                         if v in self.constants}
                for k, s in zip(self.kernels, self.kernel_steps())
                if len(k.inputs) == len(s["inputs"])}

    def constant_inputs(self) -> list[set[str]]:
        """Per kernel, the names of its inputs that are weights (constants of the plan)."""
        return [{b.name for b, vid in zip(k.inputs, step["inputs"]) if vid in self.constants}
                for k, step in zip(self.kernels, self.kernel_steps())]

    def drop_unused_constants(self) -> None:
        used = {v for s in self.steps for v in s["inputs"]} | set(self.output_ids)
        for vid in [v for v in self.constants if v not in used]:
            del self.constants[vid]
