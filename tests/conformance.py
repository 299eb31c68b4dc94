"""The ONNX backend-test conformance harness: the suite shipped with the installed ``onnx``
package, run through ``deploy.onnx_backend`` and, as a yardstick, through ONNX Runtime.

    python -m deploy.tests.conformance --full --report docs/conformance.md   # everything
    python -m deploy.tests.conformance --kind node --match relu              # a few cases
    python -m deploy.tests.conformance --fast                                # the CI subset

Each (case, backend) pair runs in its own process forked from a clean fork server, in its own
process group, under a per-case timeout and memory limit: a hang is a ``timeout``, a segfault
or abort a ``crash``, and neither stops the run. Outcomes are classified (``STATUSES``) and
compared the way ``onnx.backend.test.runner`` compares them (per-case rtol/atol, shapes, dtypes).
"""
from __future__ import annotations

import argparse
import contextlib
import glob
import multiprocessing as mp
import os
import re
import shutil
import sys
import tempfile
import time
import types
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from typing import Any, Callable

import numpy as np

KINDS = ("node", "light", "simple", "pytorch-converted", "pytorch-operator")
BACKENDS = ("deploy", "ort")
STATUSES = ("pass", "unsupported-op", "ir/opset-version", "compile-error", "runtime-error",
            "shape/dtype-mismatch", "numeric-mismatch", "timeout", "crash")
TIMEOUT_S = {"node": 90.0, "default": 300.0}   # per case, wall clock
MEMORY_LIMIT_BYTES = 6 << 30                    # address space per case process
FAST_NODE_STRIDE = 12                           # fast tier: every 12th node case, by name
FAST_LIGHT = ("test_squeezenet", "test_shufflenet")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
XFAIL_FILE = os.path.join(REPO, "tests", "conformance_xfail.txt")
REPORT_JSON = os.path.join(REPO, "docs", "conformance.json")


# ----------------------------------------------------------------------------- cases

@dataclass
class Case:
    """One backend-test case: either in memory (node) or files (the model kinds)."""

    kind: str
    name: str
    rtol: float
    atol: float
    model_path: str | None = None       # model.onnx, or light_X.onnx
    data_dir: str | None = None         # holds test_data_set_*/ (None: in memory or light)
    model: Any = None                   # onnx.ModelProto for node cases
    data_sets: Any = None               # [(inputs, outputs)] for node cases


def load_cases(kinds=KINDS) -> list[Case]:
    """The cases of ``kinds`` as ``onnx.backend.test.loader`` lists them, sorted by name.

    ``light`` is the loader's ``real`` kind restricted to models shipped inside the onnx package
    (``onnx/backend/test/data/light``), which needs no download.
    """
    import warnings

    from onnx.backend.test.loader import load_model_tests
    cases = []
    for kind in kinds:
        if kind not in KINDS:
            raise ValueError(f"unknown kind {kind!r}; expected one of {', '.join(KINDS)}")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tests = load_model_tests(kind="real" if kind == "light" else kind)
        for t in sorted(tests, key=lambda t: t.name):
            case = _case_of(kind, t)
            if case is not None:
                cases.append(case)
    return cases


def _case_of(kind: str, t) -> Case | None:
    if kind == "light":
        if not (t.url or "").startswith("onnx/backend/test/data/light/"):
            return None
        import onnx
        path = os.path.join(os.path.dirname(onnx.__file__), "..", t.url)
        return Case(kind, t.name, t.rtol, t.atol, model_path=os.path.normpath(path))
    if t.model_dir is None:
        return Case(kind, t.name, t.rtol, t.atol, model=t.model, data_sets=t.data_sets)
    return Case(kind, t.name, t.rtol, t.atol, model_path=os.path.join(t.model_dir, "model.onnx"),
                data_dir=t.model_dir)


def fast_subset(cases: list[Case]) -> list[Case]:
    """The CI fast tier: every FAST_NODE_STRIDE-th node case by name, plus FAST_LIGHT models."""
    node = [c for c in cases if c.kind == "node"]
    light = [c for c in cases if c.kind == "light" and c.name in FAST_LIGHT]
    return node[::FAST_NODE_STRIDE] + light


def _model_and_data(case: Case):
    """(onnx.ModelProto, [(inputs, expected outputs)]) of a case, loaded in the case process."""
    import onnx
    if case.model is not None:
        return case.model, [([_to_array(x) for x in ins], [_to_array(x) for x in outs])
                            for ins, outs in case.data_sets]
    model = onnx.load(case.model_path)
    if case.kind == "light":
        return model, [_light_data(case, model)]
    return model, list(_dir_data_sets(case.data_dir, model))


def _to_array(x):
    import onnx
    from onnx import numpy_helper
    return numpy_helper.to_array(x) if isinstance(x, onnx.TensorProto) else x


def _light_data(case: Case, model):
    """Inputs as onnx's runner makes them for light models (deterministic ramps, seed 0);
    expected outputs from ``light_X_output_N.pb``, else from the ReferenceEvaluator."""
    from onnx.backend.test.runner import Runner
    inits = {t.name for t in model.graph.initializer}
    feeds = {x.name: Runner.generate_dummy_data(x, seed=0, name=case.name, random=False)
             for x in model.graph.input if x.name not in inits}
    prefix = os.path.splitext(case.model_path)[0]
    paths = [f"{prefix}_output_{i}.pb" for i in range(len(model.graph.output))]
    if all(os.path.exists(p) for p in paths):
        outs = [_load_pb(p, o.type) for p, o in zip(paths, model.graph.output)]
    else:
        import onnx.reference
        outs = list(onnx.reference.ReferenceEvaluator(model).run(None, feeds))
    return list(feeds.values()), outs


def _dir_data_sets(model_dir: str, model):
    def index(p: str) -> int:
        return int(os.path.basename(p).split("_")[-1][:-3])
    for ds in sorted(glob.glob(os.path.join(model_dir, "test_data_set_*"))):
        ins = sorted(glob.glob(os.path.join(ds, "input_*.pb")), key=index)
        outs = sorted(glob.glob(os.path.join(ds, "output_*.pb")), key=index)
        yield ([_load_pb(p, model.graph.input[i].type) for i, p in enumerate(ins)],
               [_load_pb(p, model.graph.output[i].type) for i, p in enumerate(outs)])


def _load_pb(path: str, type_proto):
    """A tensor, sequence or optional stored as protobuf, typed as onnx's runner types it."""
    import onnx
    from onnx import numpy_helper
    data = open(path, "rb").read()
    if type_proto.HasField("sequence_type"):
        seq = onnx.SequenceProto()
        seq.ParseFromString(data)
        return numpy_helper.to_list(seq)
    if type_proto.HasField("optional_type"):
        opt = onnx.OptionalProto()
        opt.ParseFromString(data)
        return numpy_helper.to_optional(opt)
    t = onnx.TensorProto()
    t.ParseFromString(data)
    return numpy_helper.to_array(t)


# ----------------------------------------------------------------------------- comparing

class Mismatch(Exception):
    """Outputs differ from the expected ones; ``status`` says how."""

    def __init__(self, status: str, message: str):
        self.status = status
        super().__init__(message)


def compare(refs: list, outs: list, rtol: float, atol: float, where: str = "out") -> None:
    """Raise Mismatch unless ``outs`` match ``refs`` as onnx's ``assert_similar_outputs`` says."""
    if len(outs) != len(refs):
        raise Mismatch("shape/dtype-mismatch", f"{len(outs)} outputs, expected {len(refs)}")
    for k, (o, r) in enumerate(zip(outs, refs)):
        at = f"{where}{k}"
        if isinstance(r, (list, tuple)):
            if not isinstance(o, (list, tuple)):
                raise Mismatch("shape/dtype-mismatch", f"{at}: {type(o).__name__}, expected a sequence")
            compare(list(r), list(o), rtol, atol, f"{at}.")
            continue
        if r is None or o is None:
            if (r is None) != (o is None):
                raise Mismatch("shape/dtype-mismatch", f"{at}: {o!r:.40}, expected {r!r:.40}")
            continue
        _compare_array(np.asarray(o), np.asarray(r), rtol, atol, at)


def _compare_array(o: np.ndarray, r: np.ndarray, rtol: float, atol: float, at: str) -> None:
    if o.shape != r.shape:
        raise Mismatch("shape/dtype-mismatch", f"{at}: shape {o.shape}, expected {r.shape}")
    if r.dtype == object:
        if not np.array_equal(o, r):
            raise Mismatch("numeric-mismatch", f"{at}: strings differ")
        return
    if o.dtype != r.dtype:
        raise Mismatch("shape/dtype-mismatch", f"{at}: dtype {o.dtype}, expected {r.dtype}")
    if o.dtype.name == "bfloat16":  # as onnx's runner: compare in float32, 2 bf16 ulps
        o, r, rtol = o.astype(np.float32), r.astype(np.float32), max(rtol, 2.0 ** -6)
    try:
        np.testing.assert_allclose(o, r, rtol=rtol, atol=atol)
    except AssertionError as e:
        keep = ("Mismatch", "Max", "nan", "inf", "+inf", "-inf")
        lines = [s.strip() for s in str(e).splitlines() if s.strip().startswith(keep)]
        raise Mismatch("numeric-mismatch", f"{at}: " + "; ".join(lines or ["values differ"])) \
            from None
    except TypeError as e:  # dtypes numpy cannot compare approximately (float8 ...)
        if not np.array_equal(o.view(np.uint8), r.view(np.uint8)):
            raise Mismatch("numeric-mismatch", f"{at}: bits differ ({e})") from None


# ----------------------------------------------------------------------------- one case

@dataclass
class Result:
    case: str
    kind: str
    backend: str
    status: str
    detail: str = ""
    ops: list[str] = field(default_factory=list)       # op types in the model's main graph
    missing: list[str] = field(default_factory=list)   # unsupported op types (status unsupported-op)
    seconds: float = 0.0


def run_case(case: Case, backend: str | Callable) -> Result:
    """Run one case in this process (no isolation) and classify the outcome.

    ``backend`` is a name in RUNNERS or a runner ``fn(model, data_sets, case, result)`` that
    sets ``result.status`` and ``result.detail`` (importable, for run_isolated).
    """
    t0 = time.perf_counter()
    runner = RUNNERS[backend] if isinstance(backend, str) else backend
    result = Result(case.name, case.kind, _name(backend), "pass")
    try:
        model, data_sets = _model_and_data(case)
        result.ops = sorted({n.op_type for n in model.graph.node})
        runner(model, data_sets, case, result)
    except Exception as e:  # noqa: BLE001 - the harness classifies every failure
        result.status, result.detail = "runtime-error", _one_line(e)
    result.seconds = round(time.perf_counter() - t0, 3)
    return result


def _run_deploy(model, data_sets, case: Case, result: Result) -> None:
    from deploy import onnx_backend
    from deploy.errors import UnsupportedOpsError
    phase = "compile-error"
    try:
        rep = onnx_backend.prepare(model)
        for ins, refs in data_sets:
            phase = "compile-error"
            rep.compile(ins)
            phase = "runtime-error"
            compare(refs, list(rep.run(ins)), case.rtol, case.atol)
    except UnsupportedOpsError as e:
        result.status, result.detail = "unsupported-op", _one_line(e)
        result.missing = sorted({op for _, op, _, _ in e.missing})
    except Mismatch as e:
        result.status, result.detail = e.status, _one_line(e)
    except Exception as e:  # noqa: BLE001
        result.status, result.detail = phase, _one_line(e)


def _run_ort(model, data_sets, case: Case, result: Result) -> None:
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    opts.log_severity_level = 4
    try:
        sess = ort.InferenceSession(model.SerializeToString(), opts,
                                    providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001
        result.status, result.detail = _ort_load_status(str(e)), _one_line(e)
        return
    names = [i.name for i in sess.get_inputs()]
    try:
        for ins, refs in data_sets:
            compare(refs, sess.run(None, dict(zip(names, ins))), case.rtol, case.atol)
    except Mismatch as e:
        result.status, result.detail = e.status, _one_line(e)
    except Exception as e:  # noqa: BLE001
        result.status, result.detail = "runtime-error", _one_line(e)


def selftest_crash(model, data_sets, case: Case, result: Result) -> None:
    """A runner that segfaults: tests that isolation reports it as a ``crash``."""
    import ctypes
    ctypes.string_at(0)


def selftest_hang(model, data_sets, case: Case, result: Result) -> None:
    """A runner that never returns: tests that isolation reports it as a ``timeout``."""
    time.sleep(3600)


RUNNERS: dict[str, Callable] = {"deploy": _run_deploy, "ort": _run_ort}


def _name(backend: str | Callable) -> str:
    return backend if isinstance(backend, str) else backend.__name__


ORT_MIN_OPSET = 7  # ONNX Runtime registers no kernels for op versions below opset 7


def _ort_load_status(msg: str) -> str:
    """Why InferenceSession refused a model: versions, a missing kernel, or anything else."""
    low = msg.lower()
    if "ir version" in low or "opset" in low and ("under development" in low or "support" in low):
        return "ir/opset-version"
    if "not_implemented" in low or "could not find an implementation" in low:
        m = re.search(r"implementation for ([\w.:]+)\((\d+)\)", msg)
        return "ir/opset-version" if m and int(m[2]) < ORT_MIN_OPSET else "unsupported-op"
    return "compile-error"


def _one_line(e: BaseException, limit: int = 300) -> str:
    text = " | ".join(s.strip() for s in str(e).strip().splitlines() if s.strip())
    return f"{type(e).__name__}: {text}"[:limit]


# ----------------------------------------------------------------------------- isolation

def _child(case: Case, backend: str, conn, workdir: str) -> None:
    """Entry point of a case process: own process group, temp dir, limits, quiet output."""
    import faulthandler
    import resource
    import warnings
    os.setpgrp()  # so a timeout kills the C compiler it may have started, too
    os.environ.update(TMPDIR=workdir, OMP_NUM_THREADS="1")
    tempfile.tempdir = workdir
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))
    log = os.open(os.path.join(workdir, "log.txt"), os.O_WRONLY | os.O_CREAT, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    faulthandler.enable()
    warnings.simplefilter("ignore")
    conn.send(run_case(case, backend))
    conn.close()


@dataclass
class _Running:
    case: Case
    backend: str | Callable
    proc: Any
    conn: Any
    workdir: str
    start: float


def run_isolated(cases: list[Case], backends=BACKENDS, jobs: int | None = None,
                 timeout: dict | float | None = None, on_result=None) -> list[Result]:
    """Run every (case, backend) pair in its own process, ``jobs`` at a time.

    Longest kinds start first. ``on_result(result)`` is called as each finishes.
    """
    jobs = jobs or os.cpu_count() or 1
    ctx = _context()
    order = {k: i for i, k in enumerate(("light", "pytorch-converted", "pytorch-operator",
                                         "simple", "node"))}
    todo = [(c, b) for c in sorted(cases, key=lambda c: order[c.kind]) for b in backends]
    todo.reverse()
    running: list[_Running] = []
    results: list[Result] = []
    root = tempfile.mkdtemp(prefix="deploy-conformance-")
    try:
        while todo or running:
            while todo and len(running) < jobs:
                running.append(_start(ctx, *todo.pop(), root))
            _wait_any(running, timeout)
            for r in [r for r in running if _finished(r, timeout)]:
                running.remove(r)
                res = _collect(r, timeout)
                results.append(res)
                if on_result:
                    on_result(res)
    finally:
        for r in running:
            _kill(r)
        shutil.rmtree(root, ignore_errors=True)
    return results


def _context():
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["numpy", "onnx", "onnxruntime", "deploy.onnx_backend",
                                "deploy.compiler", "deploy.tests.conformance"])
    return ctx


def _start(ctx, case: Case, backend: str, root: str) -> _Running:
    workdir = tempfile.mkdtemp(prefix=f"{case.name[:40]}-{_name(backend)}-", dir=root)
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(case, backend, send, workdir), daemon=True)
    with _hidden_main():
        proc.start()
    send.close()
    return _Running(case, backend, proc, recv, workdir, time.monotonic())


@contextlib.contextmanager
def _hidden_main():
    """multiprocessing re-runs the parent's ``__main__`` (pytest, this CLI) in every child;
    the children need only this module, so show them an empty ``__main__``."""
    saved = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = saved


def _limit(r: _Running, timeout) -> float:
    if isinstance(timeout, (int, float)):
        return float(timeout)
    table = timeout or TIMEOUT_S
    return table.get(r.case.kind, table.get("default", TIMEOUT_S["default"]))


def _wait_any(running: list[_Running], timeout) -> None:
    now = time.monotonic()
    left = min(r.start + _limit(r, timeout) - now for r in running)
    objs = [r.conn for r in running] + [r.proc.sentinel for r in running]
    wait(objs, timeout=max(0.0, left))


def _finished(r: _Running, timeout) -> bool:
    return (r.conn.poll() or not r.proc.is_alive()
            or time.monotonic() - r.start > _limit(r, timeout))


def _collect(r: _Running, timeout) -> Result:
    secs = round(time.monotonic() - r.start, 3)
    res = _receive(r.conn)
    if res is not None:
        r.proc.join(5)
        return res
    if secs <= _limit(r, timeout):
        r.proc.join(10)  # the pipe closed early: the process is dying, let it finish
    if r.proc.is_alive():
        _kill(r)
        return Result(r.case.name, r.case.kind, _name(r.backend), "timeout",
                      f"no result after {_limit(r, timeout):.0f} s", seconds=secs)
    return Result(r.case.name, r.case.kind, _name(r.backend), "crash",
                  f"exit {_signal_name(r.proc.exitcode)}: {_log_tail(r.workdir)}", seconds=secs)


def _receive(conn) -> Result | None:
    try:
        return conn.recv() if conn.poll() else None
    except (EOFError, OSError):
        return None


def _kill(r: _Running) -> None:
    import signal
    try:
        os.killpg(r.proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    r.proc.join(5)
    r.conn.close()


def _signal_name(code: int | None) -> str:
    import signal
    if code is not None and code < 0:
        return signal.Signals(-code).name
    return str(code)


def _log_tail(workdir: str) -> str:
    try:
        text = open(os.path.join(workdir, "log.txt"), errors="replace").read()
    except OSError:
        return ""
    lines = [s.strip() for s in text.splitlines() if s.strip()]
    fatal = [i for i, s in enumerate(lines) if s.startswith("Fatal Python error")]
    if fatal:  # faulthandler: the error, then the innermost frames first
        i = fatal[-1]
        frames = [s for s in lines[i + 1:] if s.startswith("File")][:3]
        return " | ".join([lines[i], *frames])[:300]
    return " | ".join(lines[-4:])[:300]


# ----------------------------------------------------------------------------- CLI

def main(argv: list[str] | None = None) -> int:
    from .conformance_report import read_xfail, write_json, write_report, write_xfail
    args = _parser().parse_args(argv)
    cases = _select(args)
    backends = ("deploy",) if args.no_ort else BACKENDS
    timeout = args.timeout if args.timeout else None
    print(f"{len(cases)} cases x {len(backends)} backends, {args.jobs or os.cpu_count()} jobs",
          flush=True)
    t0 = time.time()
    results = run_isolated(cases, backends, args.jobs, timeout,
                           on_result=None if args.quiet else _print_result)
    wall = time.time() - t0
    _print_summary(cases, results, wall)
    command = "python -m deploy.tests.conformance " + " ".join(argv if argv is not None
                                                                else sys.argv[1:])
    if args.report:
        write_report(args.report, cases, results, command, wall, jobs=args.jobs)
        write_json(args.json or REPORT_JSON, results, command, wall)
    elif args.json:
        write_json(args.json, results, command, wall)
    if args.write_xfail:
        write_xfail(args.write_xfail, results)
    xfail = read_xfail(XFAIL_FILE) if args.check_xfail else {}
    return _exit_code(results, xfail) if args.check_xfail else 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m deploy.tests.conformance",
                                description="ONNX backend-test conformance of deploy (and ORT).")
    p.add_argument("--full", action="store_true", help="every kind (the default is node only)")
    p.add_argument("--fast", action="store_true", help="the CI fast tier subset")
    p.add_argument("--kind", action="append", choices=KINDS, help="kinds to run (repeatable)")
    p.add_argument("--match", help="only cases whose name contains this text")
    p.add_argument("--sample", type=int, metavar="N", help="every N-th selected case")
    p.add_argument("--cases", nargs="+", metavar="NAME", help="exact case names")
    p.add_argument("--no-ort", action="store_true", help="run deploy only")
    p.add_argument("--jobs", type=int, help="parallel case processes (default: CPU count)")
    p.add_argument("--timeout", type=float, help="seconds per case (default: node 90, else 300)")
    p.add_argument("--report", help="write the markdown report here (and JSON beside --json)")
    p.add_argument("--json", help=f"per-case JSON results (default with --report: {REPORT_JSON})")
    p.add_argument("--write-xfail", metavar="PATH", help="write deploy's failures as an xfail list")
    p.add_argument("--check-xfail", action="store_true",
                   help="exit 1 if a case fails that is not in tests/conformance_xfail.txt")
    p.add_argument("--quiet", action="store_true", help="no line per case")
    return p


def _select(args) -> list[Case]:
    kinds = KINDS if (args.full or args.fast) else tuple(args.kind or ("node",))
    cases = load_cases(kinds)
    if args.fast:
        cases = fast_subset(cases)
    if args.cases:
        cases = [c for c in cases if c.name in set(args.cases)]
    if args.match:
        cases = [c for c in cases if args.match.lower() in c.name.lower()]
    if args.sample:
        cases = cases[::args.sample]
    return cases


def _print_result(r: Result) -> None:
    mark = "PASS" if r.status == "pass" else "FAIL"
    extra = "" if r.status == "pass" else f" [{r.status}] {r.detail[:160]}"
    print(f"{mark} {r.backend:6} {r.kind}/{r.case} ({r.seconds:.1f}s){extra}", flush=True)


def _print_summary(cases: list[Case], results: list[Result], wall: float) -> None:
    for backend in sorted({r.backend for r in results}):
        mine = [r for r in results if r.backend == backend]
        ok = sum(r.status == "pass" for r in mine)
        print(f"{backend}: {ok}/{len(mine)} passed")
    print(f"{len(cases)} cases in {wall:.0f} s")


def _exit_code(results: list[Result], xfail: dict[str, str]) -> int:
    bad = [r for r in results if r.backend == "deploy" and r.status != "pass"
           and r.case not in xfail]
    fixed = [r for r in results if r.backend == "deploy" and r.status == "pass" and r.case in xfail]
    for r in bad:
        print(f"unexpected failure: {r.case} [{r.status}] {r.detail[:160]}")
    for r in fixed:
        print(f"unexpected pass (remove from {XFAIL_FILE}): {r.case}")
    return 1 if bad or fixed else 0


if __name__ == "__main__":
    from deploy.tests.conformance import main as _main  # functions pickle under their package name
    sys.exit(_main())
