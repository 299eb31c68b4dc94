"""Prepared launch plans of a GPU module, and the CUDA graphs that replay them.

A ``Plan`` is the artifact's launches with their final pointers. Its first run launches them one
by one (so every function is loaded and has run once), then it captures them as a graph that
later runs replay. A module has one plan over its own output slots, and for runs that return
device outputs one plan per output slab (``SlabPlans``): there the kernels that produce outputs
write straight into the slab, so a run copies nothing out. Slab plans are keyed by the slab's
address (a slab freed and allocated again at the same address finds its plan) and the least
recently used ones are dropped, with their graphs, past ``MAX_SLAB_PLANS``.
"""
from __future__ import annotations

from collections import OrderedDict

from ..errors import DeployError

MAX_SLAB_PLANS = 8


class Plan:
    __slots__ = ("graph", "launches", "runs")

    def __init__(self, launches: list):
        self.launches, self.graph, self.runs = launches, None, 0


class Runner:
    """Runs plans on one device: launch, then capture, then replay; ``graph_error`` says why
    plans are not replayed as graphs when they are not (``use_graph`` False: never tried)."""

    def __init__(self, device, use_graph: bool):
        self.device, self.use_graph, self.graph_error = device, use_graph, ""

    def run(self, plan: Plan) -> None:
        dev = self.device
        if plan.graph is not None:
            dev.replay(plan.graph)
            return
        for x in plan.launches:
            dev.launch(x)
        plan.runs += 1
        if plan.runs == 1 and self.use_graph and plan.launches:
            try:
                plan.graph = dev.capture(lambda: [dev.launch(x) for x in plan.launches])
            except (DeployError, AttributeError) as e:  # no graphs here: launch one by one
                self.use_graph = False
                self.graph_error = str(e)

    def drop(self, plan: Plan) -> None:
        destroy = getattr(self.device, "destroy_graph", None)
        if plan.graph is not None and destroy is not None:
            destroy(plan.graph)
        plan.graph = None


class SlabPlans:
    """Plans writing the outputs into an output slab, by slab address (module docstring)."""

    def __init__(self, runner: Runner):
        self.runner = runner
        self.plans: OrderedDict[int, Plan] = OrderedDict()

    def run(self, slab_ptr: int, make) -> None:
        """Run the plan of the slab at ``slab_ptr``; ``make(slab_ptr)`` makes a missing one (an
        argument, not an attribute: the module holding this would be in a reference cycle)."""
        plan = self.plans.get(slab_ptr)
        if plan is None:
            plan = self.plans[slab_ptr] = make(slab_ptr)
            if len(self.plans) > MAX_SLAB_PLANS:
                self.runner.drop(self.plans.popitem(last=False)[1])
        else:
            self.plans.move_to_end(slab_ptr)
        self.runner.run(plan)


__all__ = ["MAX_SLAB_PLANS", "Plan", "Runner", "SlabPlans"]
