"""Triton compiles that start while a GPU build renders (backends/triton/toolchain.py:
``Compiles``): worker processes from the PARALLEL_MIN-th function on, each function compiled once,
heaviest first, the same binaries as a compile in this process; failures name the function."""
from __future__ import annotations

import pytest

pytest.importorskip("triton")

import deploy
import numpy as np
from deploy.backends.device_code import GpuFunction
from deploy.backends.triton import codegen, toolchain
from deploy.backends.triton.render import TritonRenderer
from deploy.errors import CompileError
from deploy.targets import load_target
from onnx import helper

from tests.util import make_model

H100 = load_target("h100")


def _fn(name: str, body: str = "tl.load(p_in0 + i) + 1.0", template: str = "pointwise",
        constexprs: dict | None = None) -> GpuFunction:
    src = (f"@triton.jit\ndef {name}(p_out0, p_in0, XBLOCK: tl.constexpr):\n"
           f"    i = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)\n"
           f"    tl.store(p_out0 + i, {body})\n")
    return GpuFunction(name, src, ["out0", "in0"],
                       {"p_out0": "*fp32", "p_in0": "*fp32", "XBLOCK": "constexpr"},
                       constexprs or {"XBLOCK": 128}, (1,), 4, 1, template, 0)


def test_workers_compile_each_function_once_as_this_process_would():
    fns = [_fn(f"f{i}", f"tl.load(p_in0 + i) * {i + 1}.0")
           for i in range(toolchain.PARALLEL_MIN + 2)]
    compiles = toolchain.Compiles(H100, jobs=2)
    try:
        for f in fns:
            compiles.add(f)
        assert len(compiles._workers) == 2  # started at the PARALLEL_MIN-th function
        out = compiles.finish()
    finally:
        compiles.close()
    assert sorted(out) == sorted(f.name for f in fns)
    assert all(w.proc.returncode == 0 for w in compiles._workers)
    here = toolchain.compile_functions(fns[:2], TritonRenderer.module(fns[:2]), H100)
    for name in here:  # (fewer than PARALLEL_MIN: compiled in this process)
        assert here[name].images == out[name].images and here[name].params == out[name].params


def test_each_function_sits_at_its_line_of_the_module():
    fns = [_fn(f"g{i}") for i in range(3)]
    lines = TritonRenderer.module(fns).splitlines()
    compiles = toolchain.Compiles(H100, jobs=1)
    for f in fns:
        compiles.add(f)
    for *_, spec in compiles._pending:
        assert lines[spec["line"] - 1] == "@triton.jit"
        assert lines[spec["line"]].startswith(f"def {spec['name']}(")
    compiles.close()


def test_a_function_that_does_not_compile_fails_the_build_by_name():
    fns = [_fn(f"h{i}") for i in range(toolchain.PARALLEL_MIN)]
    fns.append(_fn("broken", "tl.dot(tl.load(p_in0 + i), 1.0)"))
    with pytest.raises(CompileError, match="could not compile broken"):
        toolchain.compile_functions(fns, TritonRenderer.module(fns), H100, jobs=2)


def test_heavier_templates_and_tiles_are_weighed_heavier():
    spec = toolchain._spec
    small = spec(_fn("a", template="gemm", constexprs={"BM": 16, "BN": 16, "BK": 64}))
    big = spec(_fn("b", template="gemm", constexprs={"BM": 128, "BN": 256, "BK": 64}))
    attention = spec(_fn("c", template="attention", constexprs={"BM": 128, "BN": 64}))
    pointwise = spec(_fn("d"))
    w = toolchain._weight
    assert w(big) > w(attention) > w(small) > w(pointwise)


def test_the_build_compiles_while_it_renders(monkeypatch):
    """Functions go to the compiles as they are rendered, before the last kernel is."""
    events = []
    render, compiles = codegen.TritonCodegen.render, codegen.TritonCodegen.compiles

    def logged_render(self, k, tuned):
        events.append("render")
        return render(self, k, tuned)

    class Logged:
        def __init__(self, inner):
            self.inner = inner

        def add(self, f):
            events.append("add")
            self.inner.add(f)

        def finish(self):
            return self.inner.finish()

        def close(self):
            self.inner.close()

    monkeypatch.setattr(codegen.TritonCodegen, "render", logged_render)
    monkeypatch.setattr(codegen.TritonCodegen, "compiles",
                        lambda self, tgt: Logged(compiles(self, tgt)))
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("ReduceSum", ["r"], ["y"], keepdims=1)]
    model = make_model(nodes, [("x", np.float32, [16, 32])], [("y", np.float32, [1, 1])],
                       initializers={"w": np.ones((32, 16), np.float32)})
    art = deploy.compile(model, target="h100")
    last_render = max(i for i, e in enumerate(events) if e == "render")
    assert events.count("render") >= 2 and events.index("add") < last_render
    assert len(art.manifest["binaries"]) == 2 * events.count("add")  # a cubin and a PTX each


def test_spare_workers_compile_from_the_first_function_and_unused_ones_end():
    spares = toolchain.Spares(2)
    procs = [p for p, _ in spares.procs]
    compiles = toolchain.Compiles(H100, jobs=2, spares=spares)
    try:
        for i in range(3):
            compiles.add(_fn(f"s{i}", f"tl.load(p_in0 + i) * {i + 1}.0"))
        assert len(compiles._workers) == 2 and not spares.procs  # (below PARALLEL_MIN)
        assert sorted(compiles.finish()) == ["s0", "s1", "s2"]
    finally:
        compiles.close()
    assert [p.returncode for p in procs] == [0, 0]
    idle = toolchain.Spares(1)
    idle.close()  # never used: it reads the end of its input and exits
    assert idle.procs == []


def test_the_gpu_backend_starts_workers_for_models_with_many_contractions():
    from deploy.backends.base import get_backend
    from deploy.compiler import import_model

    def chain(n):
        nodes = [helper.make_node("MatMul", [f"x{i}", "w"], [f"x{i + 1}"]) for i in range(n)]
        return make_model(nodes, [("x0", np.float32, [16, 16])], [(f"x{n}", np.float32, [16, 16])],
                          initializers={"w": np.eye(16, dtype=np.float32)})

    for n, started in [(2, False), (toolchain.PARALLEL_MIN, True)]:
        backend = get_backend(H100, {})
        backend.begin(import_model(chain(n))[0])
        try:
            assert (backend.spares is not None) == started
        finally:
            backend.end()
        assert backend.spares is None
    backend = get_backend(H100, {"aot": False})  # nothing to compile
    backend.begin(import_model(chain(toolchain.PARALLEL_MIN))[0])
    assert backend.spares is None
